"""A resume is compared with the config its checkpoints were trained with: changes that alter
what a checkpoint means are refused in one line (config.json untouched), others are warned
about, and keys a resume is expected to change pass silently."""
from __future__ import annotations

import os

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.cli import main as wmain
from wfm_jax.config.recipe import ConfigError, load_config, save_resolved
from wfm_jax.config.resume import check_resumed_config

ROOT = REPO_ROOT
RECIPE = f"{ROOT}/configs/tiny_sft.py"


def _trained_dir(tmp_path):
    """An output dir as a finished tiny_sft run leaves it: config.json and a checkpoint step."""
    out = tmp_path / "out"
    config = load_config(RECIPE, [("train.output_dir", str(out))])
    save_resolved(config, str(out / "config.json"))
    os.makedirs(out / "checkpoints" / "60")
    return out


@pytest.mark.parametrize("override, named", [
    ("policy.lora.enable=True", "policy.lora.enable False -> True"),
    ("train.train_batch_per_replica=4", "train.train_batch_per_replica 8 -> 4"),
])
def test_incompatible_resume_is_refused_and_config_json_kept(tmp_path, capsys, override, named):
    out = _trained_dir(tmp_path)
    before = (out / "config.json").read_text()
    rc = wmain.main(["--config", RECIPE, f"--config.train.output_dir={out}",
                     "--config.train.resume=True", f"--config.{override}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == wmain.EXIT_BAD_INPUT
    assert len(err) == 1 and err[0].startswith("error: resuming with a config its checkpoints "
                                               "were not trained with"), err
    assert named in err[0]
    assert (out / "config.json").read_text() == before


def test_compatible_changes_warn_and_expected_ones_pass(tmp_path, capsys):
    out = _trained_dir(tmp_path)
    path = str(out / "config.json")
    same = load_config(RECIPE, [("train.output_dir", str(out)), ("train.resume", "True"),
                                ("train.max_steps", "80")])
    assert check_resumed_config(same, path) == []
    assert capsys.readouterr().err == ""
    changed = load_config(RECIPE, [("train.output_dir", str(out)), ("train.resume", "True"),
                                   ("train.optm_lr", "0.0005")])
    assert check_resumed_config(changed, path) == ["train.optm_lr"]
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == ["warning: resuming with changed config keys (allowed): "
                       "train.optm_lr 0.001 -> 0.0005"]
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(ConfigError, match="cannot read .*config.json to compare"):
        check_resumed_config(changed, path)


def test_no_finished_checkpoint_means_nothing_to_compare(tmp_path):
    # a run killed before its first checkpoint leaves config.json and an empty checkpoints/
    out = _trained_dir(tmp_path)
    os.rmdir(out / "checkpoints" / "60")
    argv = ["--config", RECIPE, f"--config.train.output_dir={out}", "--config.train.resume=True",
            "--config.policy.lora.enable=True"]
    assert wmain.prepare(argv).policy.lora.enable
    os.makedirs(out / "checkpoints" / "60")
    with pytest.raises(ConfigError, match="policy.lora.enable False -> True"):
        wmain.prepare(argv)
