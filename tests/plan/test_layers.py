"""`python -m wfm_jax.plan --layers K` (plan/layers.py, compiled.scale_linear): the cut models'
blocks (SD3.5's dual-attention mix, the single context_pre_only block, the scans kept), every DiT
family's cut transformer built from its released config, the loop-corrected estimate of a scaled
program, and the method against the real thing: the tiny SD3 step planned at full depth and
scaled from two small compiles, on 8 CPU devices."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from tests._support.paths import REPO_ROOT
from tests._support.xla import host_devices
from wfm_jax.families.base import family_named
from wfm_jax.plan import layers
from wfm_jax.plan.compiled import scale_linear
from wfm_jax.plan.topology import estimate
from wfm_jax.programs.released import SD35_MEDIUM, released_configs

SD35 = ["joint+dual"] * 13 + ["joint"] * 10 + ["last"]


def test_sd35_blocks_and_their_cut_models():
    sd3 = family_named("sd3")
    assert sd3.block_kinds(SD35_MEDIUM) == SD35
    # K=2: one block besides the last can be kept; 12 + 11 is the nearest mix to 13 + 10
    small, large, mix = layers.choose_blocks(SD35, 2, scan=True)
    assert small == ["joint+dual", "last"]
    assert large == ["joint+dual", "joint+dual", "joint", "last"]
    assert mix == {"joint+dual": 12, "joint": 11, "last": 1}
    # K=4: the exact mix (3 + 2 x 5 dual, 0 + 2 x 5 plain), the last block once in each
    small, large, mix = layers.choose_blocks(SD35, 4, scan=True)
    assert mix == {"joint+dual": 13, "joint": 10, "last": 1}
    assert small[-1] == large[-1] == "last" and len(small) == 4 and len(large) == 8
    cut = layers.cut(sd3, dict(SD35_MEDIUM), 2, scan=True)
    assert [c["num_layers"] for c in cut.configs] == [2, 4]
    assert [c["dual_attention_layers"] for c in cut.configs] == [[0], [0, 1]]
    assert cut.info["exact_mix"] is False and cut.info["scan_kept"] is False
    assert cut.info["scan_kept_from_k"] == 5  # 2 dual + 2 plain + last, then 5 + 4 + last
    assert "12 joint+dual + 11 joint + 1 last" in layers.describe(cut.info)
    # scan: runs of two or more of each repeated kind in both models where K allows it
    assert layers.cut(sd3, dict(SD35_MEDIUM), 5, scan=True).info["scan_kept"] is True
    assert sd3.with_blocks(SD35_MEDIUM, SD35) == {**SD35_MEDIUM, "dual_attention_layers": list(range(13))}
    with pytest.raises(ValueError, match="at least 1"):
        layers.choose_blocks(SD35, 0)
    with pytest.raises(ValueError, match="2K at most the model's 24 blocks"):
        layers.choose_blocks(SD35, 13)
    with pytest.raises(ValueError, match="last"):
        sd3.with_blocks(SD35_MEDIUM, ["last", "joint"])


def test_a_tpu_topology_cuts_a_deep_dit_unless_told_otherwise():
    """No --layers: on a TPU topology a DiT of 8 blocks or more is compiled at 2 and 4 blocks and
    scaled (a plan in minutes rather than 15-20); the model itself with --full-depth or
    --split-decode, on CPU devices, or for a shallow model; --layers K as given."""
    import argparse

    from wfm_jax.plan.args import parse_args
    from wfm_jax.plan.report import AUTO_LAYERS, layers_k
    sd3, deep, shallow = family_named("sd3"), {"transformer": dict(SD35_MEDIUM)}, {
        "transformer": dict(SD35_MEDIUM, num_layers=4, dual_attention_layers=[0])}

    def ns(**kw):
        return argparse.Namespace(**{"layers": None, "full_depth": False, "split_decode": False, **kw})
    k, why = layers_k(ns(), sd3, deep, on_tpu=True)
    assert (k, why.split()[0]) == (AUTO_LAYERS, "auto") and "24 blocks" in why
    assert layers_k(ns(), sd3, deep, on_tpu=False) == (None, "full depth")
    assert layers_k(ns(full_depth=True), sd3, deep, on_tpu=True) == (None, "full depth")
    assert layers_k(ns(split_decode=True), sd3, deep, on_tpu=True) == (None, "full depth")
    assert layers_k(ns(), sd3, shallow, on_tpu=True) == (None, "full depth")
    assert layers_k(ns(layers=3), sd3, shallow, on_tpu=False) == (3, "--layers")
    with pytest.raises(SystemExit):  # both: one line from argparse
        parse_args(["--config", "configs/sd35_sft.py", "--topology", "v5p:2x2x1", "--full-depth",
                    "--layers", "2"])


def test_alike_blocks_scale_by_count():
    small, large, mix = layers.choose_blocks(["block"] * 30, 2, scan=True)
    assert (small, large, mix) == (["block"] * 2, ["block"] * 4, {"block": 30})
    assert layers.choose_blocks(["block"] * 30, 1)[2] == {"block": 30}


@pytest.mark.parametrize("family", ["sd3", "wan", "cosmos", "sana", "sana_video"])
def test_each_family_builds_its_cut_transformer(family):
    """The released transformer of every DiT family, cut to K=2 and 2K=4 blocks, builds (no
    weights: shapes only) with those blocks and otherwise the released shapes."""
    from wfm_jax.programs.abstract import abstract_model
    cls = family_named(family)
    t_cfg = released_configs(family, "Cosmos-Predict2.5-2B")["transformer"]
    cut = layers.cut(cls, t_cfg, 2, scan=True)
    assert cut.full == len(cls.block_kinds(t_cfg)) > 4
    for config, kinds in zip(cut.configs, cut.kinds):
        model = abstract_model(config, None, jnp.float32, cls)
        blocks = getattr(model, "transformer_blocks", None) or model.blocks
        assert len(blocks) == len(kinds) == config["num_layers"]
        if family == "sd3":  # SD3.5-M: a second attention in the dual blocks only
            assert [b.attn2 is not None for b in blocks] == [k.endswith("+dual") for k in kinds]
        assert {k: v for k, v in config.items() if k not in ("num_layers", "dual_attention_layers")} \
            == {k: v for k, v in t_cfg.items() if k not in ("num_layers", "dual_attention_layers")}


def _compiled(layers_, scanned):
    """A compile of `layers_` blocks: FLOPs linear, XLA counting a scanned run's body once."""
    return {"compiled": True, "argument_bytes": 10 * layers_, "output_bytes": 5 * layers_,
            "alias_bytes": 5 * layers_, "temp_bytes": 100 + 7 * layers_, "generated_code_bytes": 1,
            "flops": 4 * 3e12 * layers_, "xla_flops_per_device": 3e12 * (1 if scanned else layers_),
            "optimal_seconds": 0.01 * (1 if scanned else layers_), "xla_bytes_accessed": 1.0,
            "collective_bytes": {"all-gather": 3 * layers_}, "compile_seconds": 1.0}


def test_scaled_estimate_is_each_compiles_loop_corrected_time():
    """2 blocks unrolled, 4 with a scanned run: XLA's loop-once figures do not extrapolate (they
    would go negative), each compile's loop-corrected time does: the 24-block model's estimate
    is what its own compile gives."""
    p = scale_linear([_compiled(2, False), _compiled(4, True)], (2, 4), 24, "layers", "m")
    assert p["temp_bytes"] == 268 and p["argument_bytes"] == 240 and p["flops"] == 4 * 3e12 * 24
    assert p["xla_flops_per_device"] < 0  # report.py drops these when the scans are not kept
    e = estimate(p, 4, 459e12)
    assert e["estimated_step_seconds"] == pytest.approx(estimate(_compiled(24, True), 4, 459e12)
                                                        ["estimated_step_seconds"]) == pytest.approx(0.24)
    assert e["estimated_mfu"] == pytest.approx(3e12 * 24 / (0.24 * 459e12))
    assert [m["estimated_step_seconds"] for m in p["scaled_from"]] == pytest.approx([0.02, 0.04])
    # a refusal for memory at 2K: the full model's temporaries extrapolated from both
    oom = {"compiled": False, "error": "RESOURCE_EXHAUSTED", "fits": False, "temp_bytes": 150,
           "required_bytes": 150, "argument_bytes": 40, "compile_seconds": 2.0}
    p = scale_linear([_compiled(2, False), oom], (2, 4), 24, "layers", "m")
    assert not p["compiled"] and p["fits"] is False
    assert p["required_bytes"] == p["temp_bytes"] == 114 + (150 - 114) * 11


_SCRIPT = """
import json, os, shutil, sys
from wfm_jax.families.tiny import build_tiny_pipeline
from wfm_jax.plan import cli, plan
root = sys.argv[1]
build_tiny_pipeline(os.path.join(root, "tiny"), seed=0, family="sd3")
for depth, k in json.loads(sys.argv[2]):
    d = os.path.join(root, f"depth{depth}")
    shutil.copytree(os.path.join(root, "tiny"), d)
    path = os.path.join(d, "transformer", "config.json")
    with open(path) as f:
        t = json.load(f)
    with open(path, "w") as f:
        json.dump(dict(t, num_layers=depth), f)
    argv = ["--config", "configs/tiny_sft.py", "--devices", "8",
            f"--config.policy.model_name_or_path={d}", "--config.policy.build_tiny=False",
            "--config.train.train_policy.dataset.build_tiny=False"]
    for extra in ([], ["--layers", str(k)]):
        print(json.dumps(plan(cli.parse_args(argv + extra))["programs"]["step"]))
"""


@pytest.mark.slow  # six CPU compiles of the tiny SD3 step at 8 devices (~1-2 min on 2 cores)
def test_scaled_plan_against_the_full_compile(tmp_path):
    """The tiny SD3 SFT step (scanned) at 4 blocks, compiled, against --layers 1 (1 and 2
    blocks, scaled), and at 12 blocks against --layers 3 (3 and 6). FLOPs and the state's bytes
    are linear in the blocks: equal. Temporaries are not quite: measured +17.2% at K=1, since
    neither cut model scans (the 1-block model is the last block alone; the 1 -> 2 step adds
    28.1 MB, each scanned block 22.8 MB), and 0.0% at K=3, where both cut models scan their
    joint blocks as the model does (per block +22.75 MB from 3 blocks on)."""
    env = dict(os.environ, XLA_FLAGS=host_devices(8),
               PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), json.dumps([[4, 1], [12, 3]])],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    full4, scaled4, full12, scaled12 = (json.loads(line) for line in out.stdout.splitlines()
                                        if line.startswith("{"))
    for full, scaled, depths, temp_tol in ((full4, scaled4, [1, 2], 0.25), (full12, scaled12, [3, 6], 0.01)):
        assert [m["layers"] for m in scaled["scaled_from"]] == depths and scaled["scale_method"]
        assert scaled["flops"] == pytest.approx(full["flops"], rel=1e-9)
        for key in ("argument_bytes", "output_bytes", "alias_bytes"):
            assert scaled[key] == pytest.approx(full[key], rel=1e-6), key
        assert scaled["temp_bytes"] == pytest.approx(full["temp_bytes"], rel=temp_tol)
        assert scaled["peak_bytes"] == pytest.approx(full["peak_bytes"], rel=temp_tol)
    # the 1- and 2-block models do not scan (runs of one block): no loop-once XLA figures
    assert scaled4["xla_flops_per_device"] is None
    assert scaled4["temp_bytes"] > full4["temp_bytes"]
    # both scanned: XLA's loop-once FLOPs extrapolate to the scanned model's
    assert scaled12["xla_flops_per_device"] == pytest.approx(full12["xla_flops_per_device"], rel=0.02)


@pytest.mark.slow  # seven small libtpu compiles of the tiny SD3 NFT programs (~30-70 s on 2 cores)
def test_scaled_plan_for_a_tpu_topology_keeps_the_report_keys(tmp_path, capsys):
    """--layers with --topology, on the tiny NFT recipe: the keys of the unscaled plan, each
    scaled program's estimate from its two compiles' loop-corrected ones, the scaled figures in
    the text form too. The rollout's and the evaluation's VAE decode are one program (uint8
    pixels of a rollout chunk), compiled once and joined to each cut model (plan.compiled.join_tail);
    the plan's compile seconds count it once."""
    pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed")
    from tests.plan._tiny_sd3 import tiny_sd3_plan_argv
    from wfm_jax import plan as plan_lib
    argv = tiny_sd3_plan_argv(str(tmp_path / "tiny_sd3"), 4)
    argv[1] = "configs/tiny_nft.py"
    argv += ["--topology", "v5p:2x2x1", "--layers", "1", "--config.train.train_batch_per_replica=64",
             "--cache-dir", str(tmp_path / "plan_cache")]
    assert plan_lib.main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # planned again: every TPU compile's figures (the HLO's loops included) from the plan cache
    assert plan_lib.main([*argv, "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(p["cached"] for p in again["programs"].values())
    assert not any(p["cached"] for p in r["programs"].values())
    for p in (*r["programs"].values(), *again["programs"].values()):
        p.pop("cached")
    assert again == r
    assert r["layers"] == 4 and r["layer_scaling"]["compiled"][1]["blocks"] == ["joint", "last"]
    assert set(r["programs"]) == {"rollout", "update", "evaluate"}
    for p in r["programs"].values():
        for key in ("compiled", "bytes_per_device", "hbm_bytes", "fits", "flops_per_device",
                    "estimated_step_seconds", "estimated_mfu", "attention_kernel"):
            assert p[key] is not None, key
        assert p["bytes_per_device"]["temp"] == p["temp_bytes"] and p["fits"] is True
        (a, b), x = p["scaled_from"], p["scale_factor"]
        assert [a["layers"], b["layers"], x] == [1, 2, 3.0]
        assert p["temp_bytes"] == round(a["temp_bytes"] + (b["temp_bytes"] - a["temp_bytes"]) * x)
        t = a["estimated_step_seconds"] + (b["estimated_step_seconds"] - a["estimated_step_seconds"]) * x
        assert p["estimated_step_seconds"] == pytest.approx(t)
        assert p["estimated_mfu"] == pytest.approx(p["flops_per_device"] / (t * 459e12))
    progs = r["programs"]
    # the update's flash attention backward kernels (no declared cost): their time per compile,
    # extrapolated as the rest is, and inside the estimate above
    (a, b), x = progs["update"]["scaled_from"], progs["update"]["scale_factor"]
    assert 0 < a["kernel_seconds"] < b["kernel_seconds"] < a["estimated_step_seconds"]
    assert progs["update"]["kernel_seconds"] == pytest.approx(
        a["kernel_seconds"] + (b["kernel_seconds"] - a["kernel_seconds"]) * x)
    rollout, evaluate = progs["rollout"]["decode"], progs["evaluate"]["decode"]
    assert rollout["compiled"] and not rollout["shared_with_an_earlier_program"]
    assert evaluate["shared_with_an_earlier_program"] and evaluate["temp_bytes"] == rollout["temp_bytes"]
    for name in ("rollout", "evaluate"):
        assert progs[name]["attention_kernel"] == "pallas", name
        assert progs[name]["scale_method"].endswith(layers.JOIN_METHOD), name
        assert all(m["temp_bytes"] >= rollout["temp_bytes"] for m in progs[name]["scaled_from"])
    assert r["compile_seconds"] == pytest.approx(sum(p["compile_seconds"] for p in progs.values()), abs=0.2)
    assert progs["evaluate"]["compile_seconds"] < sum(m["compile_seconds"]
                                                      for m in progs["evaluate"]["scaled_from"])
    text = plan_lib.describe(r)
    assert "scaled: two compiles with K and 2K transformer blocks" in text
    assert "layers: compiled 1: 1 last; 2: 1 joint + 1 last; extrapolated to 3 joint + 1 last" in text
