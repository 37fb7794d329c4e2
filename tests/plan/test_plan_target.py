"""plan.target: each shipped recipe names the hardware it is planned to fit, a TPU topology or a
GPU count, validated with the config; `python -m wfm_jax.plan --config X` plans there when given
no --topology / --devices (SFT then at the recipe's own rows per device)."""
from __future__ import annotations

import glob
import os
import types

import pytest

from tests._support.paths import CONFIGS
from wfm_jax.config.recipe import ConfigError, load_config
from wfm_jax.config.targets import parse_target
from wfm_jax.plan.args import parse_args, recipe_rows_per_device

SHIPPED = sorted(p for p in glob.glob(os.path.join(CONFIGS, "*.py"))
                 if not os.path.basename(p).startswith("tiny_"))


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_every_shipped_recipe_names_its_target(path):
    target = load_config(path).plan.target
    assert target, f"{os.path.basename(path)} names no plan.target"
    kind, _, count = parse_target(target)
    assert kind in ("tpu", "gpu") and count > 0


def test_targets_parse_and_a_bad_one_is_one_config_line():
    assert parse_target("v5p:2x2x1") == ("tpu", "v5p:2x2x1", 4)
    assert parse_target("v5e:4x4") == ("tpu", "v5e:4x4", 16)
    assert parse_target("h100:8") == ("gpu", "h100", 8)
    for bad in ("v5p:2x2x1x2", "a100:8", "h100:0", "v5p", "v5p:0x2x1"):
        with pytest.raises(ConfigError, match="plan.target") as e:
            parse_target(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="'plan.target' = 'tpu'"):
        load_config(os.path.join(CONFIGS, "tiny_sft.py"), [("plan.target", "tpu")])


def test_the_recipes_target_is_where_it_is_planned():
    cosmos = os.path.join(CONFIGS, "cosmos25_2b_nft.py")
    args = parse_args(["--config", cosmos])
    assert (args.topology, args.target, args.target_source) == ("v5p:2x2x1", "v5p:2x2x1",
                                                               "recipe plan.target")
    args = parse_args(["--config", cosmos, "--devices", "8"])  # the command line wins
    assert (args.topology, args.target, args.target_source) == (None, "h100:8", "command line")
    assert args.batch_per_device == 4 and not args.recipe_batch
    for named in (["--topology", "v5p:2x2x1"], ["--config.plan.target=h100:8", "--devices", "8"]):
        args = parse_args(["--config", cosmos, *named])  # naming the recipe's own target
        assert args.target_source == "recipe plan.target" and args.recipe_batch, named
        assert args.batch_per_device is None
    for other in (["--topology", "v5p:2x2x2"], ["--topology", "v5p:2x2x1", "--num-slices", "2"],
                  ["--config.plan.target=h100:8", "--devices", "8", "--device-kind", "h200"]):
        args = parse_args(["--config", cosmos, *other])
        assert args.target_source == "command line" and args.batch_per_device == 4, other
    # explicit devices and rows read no recipe (the trainer's memory check passes no --config)
    args = parse_args(["--config", "no/such/recipe.py", "--devices", "8", "--batch-per-device", "2"])
    assert (args.target_source, args.batch_per_device) == ("command line", 2)
    args = parse_args(["--config", cosmos, "--config.plan.target=h200:16"])
    assert (args.topology, args.devices, args.device_kind) == (None, 16, "h200")
    tiny = os.path.join(CONFIGS, "tiny_sft.py")
    args = parse_args(["--config", tiny])  # no target: 8 H100s, 4 rows a device, as before
    assert (args.target, args.target_source, args.batch_per_device) == ("h100:8", "default", 4)


def test_sft_at_the_recipes_target_takes_the_recipes_rows():
    tiny = os.path.join(CONFIGS, "tiny_sft.py")
    config = load_config(tiny, [("train.train_batch_per_replica", "32")])
    mesh = types.SimpleNamespace(devices=types.SimpleNamespace(size=8), shape={"context": 2})
    args = parse_args(["--config", tiny, "--config.plan.target=h100:8"])
    assert args.recipe_batch and args.batch_per_device is None
    assert recipe_rows_per_device(args, config, mesh) == 8  # 32 rows over 4 batch shards
    args = parse_args(["--config", tiny, "--config.plan.target=h100:8", "--batch-per-device", "2"])
    assert recipe_rows_per_device(args, config, mesh) == 2
    config = load_config(tiny, [("train.train_batch_per_replica", "6")])
    args = parse_args(["--config", tiny, "--config.plan.target=h100:8"])
    with pytest.raises(SystemExit, match="train_batch_per_replica=6 does not split over the 4"):
        recipe_rows_per_device(args, config, mesh)
