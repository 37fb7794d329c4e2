"""Issue R's acceptance "one family registry": the toy family of test_registry (defined in the
test, registered by a fixture, trained module named `denoiser`) goes through the real trainer
entry for SFT and for an RL algorithm, through the planner and through the benchmark's recipe
mode (`python -m wfm_jax.bench --recipe`: the recipe's own programs timed, wfm_jax only), with
nothing outside the tests knowing about it."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from tests.families.test_registry import CHANNELS, ToyPipeline
from wfm_jax.cli import main as wmain
from wfm_jax.families import FAMILIES

SIZE = 8  # pixels; latents (3, 2, 2)


@pytest.fixture
def toy_family():
    FAMILIES.register("toy", ToyPipeline)
    yield ToyPipeline
    FAMILIES.unregister("toy")


def write_recipe(path, **settings) -> str:
    """A recipe file: default_config() with `settings` ("a.b.c" -> value) applied."""
    lines = ["from wfm_jax.config.schema import default_config", "", "",
             "def get_config():", "    c = default_config()"]
    lines += [f"    c.{key} = {value!r}" for key, value in settings.items()]
    lines += ["    return c", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return str(path)


def write_paired_images(directory, count: int = 4) -> str:
    """`count` uniform grey images (the same in every channel), each with its caption."""
    os.makedirs(directory)
    for i in range(count):
        level = 40 + 50 * i
        Image.fromarray(np.full((SIZE, SIZE, 3), level, np.uint8)).save(os.path.join(directory, f"{i}.png"))
        with open(os.path.join(directory, f"{i}.json"), "w") as f:
            json.dump({"prompt": f"grey {level}"}, f)
    return str(directory)


def toy_settings(tmp_path, **extra) -> dict:
    from wfm_jax.families.tiny import build_tiny_pipeline
    return {"policy.family": "toy",
            "policy.model_name_or_path": build_tiny_pipeline(str(tmp_path / "toy"), seed=0, family="toy"),
            "policy.lora.enable": False,
            "policy.diffusers.inference_size": (SIZE, SIZE),
            "policy.diffusers.max_prompt_length": 4,
            "train.output_dir": str(tmp_path / "out"),
            "train.compute_dtype": "float32",
            "train.seed": 0,
            "train.ema_enable": False,
            "validation.enable": False,
            **extra}


def metrics(out_dir) -> dict[int, dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f)}


@pytest.mark.slow
def test_sft_trains_the_toy_family(tmp_path, toy_family):
    steps = 12
    recipe = write_recipe(tmp_path / "toy_sft.py", **toy_settings(
        tmp_path, **{"train.train_policy.dataset.local_dir": write_paired_images(tmp_path / "data"),
                     "train.max_steps": steps, "train.optm_lr": 0.1, "train.optm_warmup_steps": 0,
                     "train.train_batch_per_replica": 8, "train.ckpt.save_freq": steps}))
    assert wmain.main(["--config", recipe]) == 0
    m = metrics(tmp_path / "out")
    loss = np.array([m[s]["train/loss"] for s in range(1, steps + 1)])
    assert np.all(np.isfinite(loss))
    assert loss[-3:].mean() < loss[:3].mean(), loss
    assert os.path.isdir(tmp_path / "out" / "checkpoints" / str(steps))
    # the export is a toy pipeline again (model_index copied, the denoiser the family wrote)
    from wfm_jax.families.base import load_pipeline
    exported = load_pipeline(str(tmp_path / "out" / "safetensors" / f"step_{steps}"), family="toy")
    start = np.load(tmp_path / "toy" / "denoiser" / "gain.npy")
    assert exported.denoiser.gain[...].shape == (CHANNELS,)
    assert not np.allclose(np.asarray(exported.denoiser.gain[...]), start)


@pytest.fixture
def brightness_reward():
    from reward_client.registry import register_reward, unregister_reward

    @register_reward("toy_brightness")
    def brightness(images, prompts, extras):
        return np.asarray(images, np.float64).mean(axis=(1, 2, 3)) / 255.0

    yield "toy_brightness"
    unregister_reward("toy_brightness")


@pytest.mark.slow
def test_nft_trains_the_toy_family(tmp_path, toy_family, brightness_reward):
    """DiffusionNFT on the toy family with a reward registered here: it runs its steps and logs
    finite losses and rewards."""
    steps = 3
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"grey {i}\n" for i in range(8)))
    recipe = write_recipe(tmp_path / "toy_nft.py", **toy_settings(
        tmp_path, **{"train.train_policy.type": "nft", "train.max_steps": steps,
                     "train.train_policy.dataset.local_dir": str(prompts),
                     "train.train_policy.use_remote_reward": False,
                     "train.train_policy.remote_reward.reward_fns": [
                         {"name": brightness_reward, "weight": 1.0, "score_key": ""}],
                     "train.train_batch_per_replica": 16, "train.train_policy.mini_batch": 2,
                     "rollout.n_generation": 4, "policy.diffusers.sample.eval_num_steps": 3,
                     "train.optm_lr": 0.01, "train.ckpt.save_freq": steps}))
    assert wmain.main(["--config", recipe]) == 0
    m = metrics(tmp_path / "out")
    assert sorted(m) == list(range(1, steps + 1))
    for step in m.values():
        for key in ("train/loss", "train/reward_mean"):
            assert np.isfinite(step[key]), (key, step)
        assert 0.0 <= step["train/reward_mean"] <= 1.0
    assert os.path.isdir(tmp_path / "out" / "checkpoints" / str(steps))


@pytest.mark.parametrize("algorithm", ["sft", "nft"])
def test_plan_compiles_the_toy_familys_programs(tmp_path, toy_family, capsys, algorithm):
    """python -m wfm_jax.plan on a toy recipe: its programs compiled on 8 abstract devices, the
    bytes reported are the toy's (3 gains of 4 bytes, replicated). train.max_steps is unset (a
    run takes it from its data) and the schedule a cosine: the planner's stand-in length."""
    from wfm_jax import plan

    settings = toy_settings(tmp_path, **{"train.train_policy.type": algorithm,
                                         "train.lr_schedule": "cosine"})
    if algorithm == "nft":
        settings.update({"train.train_batch_per_replica": 16, "train.train_policy.mini_batch": 2,
                         "rollout.n_generation": 4, "policy.diffusers.sample.eval_num_steps": 3})
    recipe = write_recipe(tmp_path / "toy.py", **settings)
    assert plan.main(["--config", recipe, "--devices", "8", "--batch-per-device", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "toy" and report["algorithm"] == algorithm and report["devices"] == 8
    assert report["params_bytes"] == CHANNELS * 4  # the gain, fp32, on every device
    assert report["encoders_vae_bytes"] == 4       # the Scale VAE's one weight
    assert report["fits"] is True
    assert report["layers"] is None  # the toy's denoiser has no blocks
    if algorithm == "sft":  # so --layers is one line, not a traceback
        with pytest.raises(SystemExit, match="the 'toy' family's denoiser config has no num_layers"):
            plan.main(["--config", recipe, "--devices", "8", "--layers", "1", "--json"])


def test_bench_times_the_toy_familys_programs(tmp_path, toy_family):
    """python -m wfm_jax.bench --recipe on a toy recipe: every program of the run compiled,
    called on random arguments and timed; the record has a positive time and XLA's FLOPs (the
    toy has no matmul, so its matmul FLOPs are 0 and its element-wise ones are not). RL: both
    of its programs (SFT's one step goes through the same code)."""
    from wfm_jax.bench.__main__ import main as bench_main

    algorithm = "nft"
    settings = toy_settings(tmp_path, **{"train.train_policy.type": algorithm})
    settings.update({"train.train_batch_per_replica": 16, "train.train_policy.mini_batch": 2,
                     "rollout.n_generation": 4, "policy.diffusers.sample.eval_num_steps": 3})
    recipe = write_recipe(tmp_path / "toy.py", **settings)
    out = tmp_path / "bench" / "toy.json"
    assert bench_main(["--recipe", recipe, "--devices", "1", "--repeats", "2", "--warmup", "0",
                       "--out", str(out)]) == 0
    with open(out) as f:
        result = json.load(f)
    assert (result["family"], result["algorithm"], result["devices"]) == ("toy", algorithm, 1)
    assert sorted(result["programs"]) == ["rollout", "update"]
    for rec in result["programs"].values():
        assert len(rec["step_times_s"]) == 2 and rec["step_time_s"] > 0
        assert rec["flops"] == 0 and rec["xla_flops_per_device"] > 0 and rec["samples_per_s"] > 0
        # XLA's plan of the program's bytes; the allocator's peak only where the backend has one
        assert rec["xla_memory_plan_bytes"] > 0 and rec["peak_memory_bytes"] is None
    assert (tmp_path / "bench" / "toy.md").read_text().count("|") > 10
    # a recipe the benchmark cannot lay out: one line, exit 2
    assert bench_main(["--recipe", recipe, "--devices", "64", "--out", str(out)]) == 2
