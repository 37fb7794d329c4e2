"""wfm_jax.plan on the released recipes, scaled down so a test can compile them: each recipe's
own algorithm, optimizer, LoRA, EMA and mesh rules on its family's tiny pipeline, small images
and few frames (the full-size figures are in the README, computed by the commands written there).
And main's refusal of the Cosmos-14B DDRL recipe on a mesh that cannot hold it, before any weight
is read."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax import plan as plan_lib

ROOT = REPO_ROOT

# recipe -> (tiny family, overrides scaling it down: size, frames, a batch 8 and 64 devices split)
RECIPES = {
    "configs/sd35_sft.py": ("sd3", ["--size", "32", "--batch-per-device", "1"]),
    "configs/sd35_nft.py": ("sd3", ["--size", "32", "--config.train.train_batch_per_replica=192",
                                    "--config.train.train_policy.mini_batch=1"]),
    "configs/wan21_1_3b_nft.py": ("wan", ["--size", "32", "--frames", "5",
                                          "--config.train.train_batch_per_replica=192",
                                          "--config.train.train_policy.mini_batch=1"]),
    "configs/cosmos25_2b_nft.py": ("cosmos", ["--size", "32", "--frames", "5",
                                              "--config.train.train_batch_per_replica=192",
                                              "--config.train.train_policy.mini_batch=1"]),
}
_SCRIPT = """
import json, sys
from wfm_jax.plan import cli
devices, jobs = int(sys.argv[1]), json.loads(sys.argv[2])
cli.virtual_devices(devices)
from wfm_jax.plan import describe, plan
for argv in jobs:
    r = plan(cli.parse_args(argv))
    print(describe(r), file=sys.stderr)
    print(json.dumps(r))
"""


# the recipe also planned at 64 devices (the README's v5p-64 column): one is enough to show the
# plan scales past 8, and a 64-way compile is the test's largest cost
AT_64 = "configs/cosmos25_2b_nft.py"
# the recipe is FSDP over every device; the tiny Cosmos' 24-wide layers do not split 64 ways,
# so its 64-device plan is data-parallel
AT_64_MESH = ("--config.policy.parallelism.data=-1", "--config.policy.parallelism.fsdp=1")


@pytest.mark.slow  # five plans (four recipes at 8 devices, one at 64), two processes
def test_plan_prints_figures_for_the_recipes_at_8_and_64_devices(tmp_path):
    jobs = {}
    for config, (family, extra) in RECIPES.items():
        model = tmp_path / f"tiny_{family}"
        jobs[config] = ["--config", config, f"--config.policy.model_name_or_path={model}",
                        "--config.policy.build_tiny=True", *extra]
    results = {}
    for devices, configs in ((8, list(RECIPES)), (64, [AT_64])):
        argv = [[*jobs[c], "--devices", str(devices), *(AT_64_MESH if devices == 64 else ())]
                for c in configs]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", _SCRIPT, str(devices), json.dumps(argv)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stderr.count("peak (") == len(configs), out.stderr[-3000:]
        lines = [json.loads(line) for line in out.stdout.splitlines()
                 if line.startswith("{")]  # (the tiny pipelines' build says so too)
        results[devices] = dict(zip(configs, lines))
    for config, (family, _) in RECIPES.items():
        programs = {"update", "rollout"} if "nft" in config else {"step"}
        planned = [results[d][config] for d in (8, 64) if config in results[d]]
        for r in planned:
            assert r["family"] == family, config
            assert set(r["programs"]) == programs, config
            assert r["train_state_bytes"] > 0 and r["flops_per_step"] > 0, config
            assert r["total_bytes"] == max(p["peak_bytes"] for p in r["programs"].values())
            # the LoRA recipes train adapters; NFT keeps the old adapters as well
            assert r["lora"] == ("nft" in config)
            if "nft" in config:
                assert r["old_bytes"] == r["params_bytes"], config
    at8, at64 = results[8][AT_64], results[64][AT_64]
    assert (at8["devices"], at64["devices"]) == (8, 64)
    # the whole program's FLOPs do not depend on the mesh (same global batch)
    assert at8["flops_per_step"] == pytest.approx(at64["flops_per_step"], rel=1e-6)

def test_plan_says_a_mesh_the_devices_cannot_make_in_one_line():
    # the 14B recipe asks fsdp 32 x context 8: 256 devices
    args = plan_lib.parse_args(["--config", "configs/cosmos25_14b_ddrl.py", "--devices", "8"])
    with pytest.raises(SystemExit, match=r"policy.parallelism \{.*\} does not fit 8 devices: .*\(override, "
                                          r"e.g. --config.policy.parallelism.fsdp=-1") as e:
        plan_lib.plan(args)
    assert "\n" not in str(e.value)


def test_main_refuses_14b_ddrl_on_a_mesh_that_cannot_hold_it(tmp_path, monkeypatch, capsys):
    """The real recipe (Cosmos-Predict2.5-14B released shape, its DDRL layout and fp32 state)
    with fsdp 2 on the 8 test devices and the clip scaled down to 5 frames of 64x64: one line
    with the bytes each device needs and has, exit 2, before any weight is read (the model is
    not on disk at all) and before any program is compiled (the resident state alone exceeds
    the device; test_plan_step covers the refusal of a compiled program's peak)."""
    from wfm_jax.cli.main import EXIT_BAD_INPUT, main
    monkeypatch.setenv(plan_lib.MEMORY_ENV, str(80_000_000_000))  # an H100
    out = tmp_path / "run"
    code = main(["--config", "configs/cosmos25_14b_ddrl.py", f"--config.train.output_dir={out}",
                 "--config.policy.parallelism.fsdp=2", "--config.policy.parallelism.context=1",
                 "--config.policy.diffusers.train_frames=5",
                 "--config.policy.diffusers.inference_frames=5",
                 "--config.policy.diffusers.inference_size=(64, 64)",
                 f"--config.train.train_policy.dataset.local_dir={tmp_path / 'data'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT, err
    assert len(err) == 1 and "does not fit" in err[0], err
    assert "has 80000000000 bytes" in err[0], err
    needs = int(err[0].split(" needs ")[1].split(" bytes")[0])
    # fp32 params + two Adam moments + EMA of 14B parameters over 2 fsdp shards alone: 112 GB
    assert needs > 112e9, err
    assert "before any program's temporaries" in err[0], err
    assert not out.exists() or not (out / "checkpoints").exists()
