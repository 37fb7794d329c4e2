"""wfm_jax.plan on the tiny SD3 pipeline (its config.json files only are read): the per-device
bytes it counts equal the compiled programs' own argument bytes (XLA's memory_analysis) for the
SFT step and for NFT's rollout and update, its FLOPs match the analytic counts the benchmark
uses, the CLI takes --config.a.b=v overrides and a device kind, and main refuses a run that
cannot fit before loading weights."""
from __future__ import annotations

import json
import math
import os

import jax.numpy as jnp
import pytest
from flax import nnx

from wfm_jax import plan as plan_lib
from wfm_jax.bench import flops
from wfm_jax.programs.abstract import abstract_model
from wfm_jax.programs.rl import cond_slots

TEXT = 77 + 16  # CLIP's 77 tokens + the tiny recipes' max_prompt_length
KEY_BYTES, ETA_BYTES = 8, 4  # a threefry key, the old-policy decay (replicated scalars)


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    path = str(tmp_path_factory.mktemp("plan") / "tiny_sd3")
    build_tiny_pipeline(path, seed=0, family="sd3")
    return path


def _configs(directory):
    read = lambda *p: json.load(open(os.path.join(directory, *p)))
    return read("transformer", "config.json"), read("vae", "config.json")


def _plan(config, directory, *extra):
    args = plan_lib.parse_args(["--config", config, "--devices", "2",
                                f"--config.policy.model_name_or_path={directory}",
                                "--config.policy.parallelism.data=2", *extra])
    return plan_lib.plan(args)


def test_plan_counts_match_the_compiled_sft_step(sd3_dir):
    r = _plan("configs/tiny_sft.py", sd3_dir, "--batch-per-device", "2", "--device-kind", "v6e",
              "--config.train.compute_dtype=float32")
    t_cfg, v_cfg = _configs(sd3_dir)
    assert r["family"] == "sd3" and r["devices"] == 2 and r["global_batch"] == 4
    lat = 32 // 2 ** (len(v_cfg["block_out_channels"]) - 1)
    # arguments of the step: train state + frozen buffers + the batch (x0, prompt embeds,
    # pooled, ids), all per device
    rows = r["global_batch"] // 2
    batch = 4 * rows * (t_cfg["in_channels"] * lat * lat + TEXT * t_cfg["joint_attention_dim"]
                        + t_cfg["pooled_projection_dim"] + 1)
    assert r["step_argument_bytes"] == (r["train_state_bytes"] + r["transformer_frozen_bytes"]
                                        + batch)
    # fp32 AdamW: two moments per parameter; EMA: one copy (tiny_sft enables it)
    assert r["optimizer_bytes"] >= 2 * r["params_bytes"] and r["ema_bytes"] == r["params_bytes"]
    # the step's matmul FLOPs against the benchmark's analytic count of what autodiff runs
    want = flops.train_step(t_cfg, r["global_batch"], lat, lat, TEXT)["autodiff"]
    assert math.isclose(r["flops_per_step"], want, rel_tol=1e-3), (r["flops_per_step"], want)
    assert r["encoders_vae_bytes"] > 0  # the tiny CLIPs, T5 and VAE, from their config.json
    assert r["fits"] and r["device_memory_bytes"] == 32 * 2 ** 30
    assert r["collective_bytes"]["all-reduce"] > 0  # gradients over data=2
    assert "fits a v6e" in plan_lib.describe(r)


def test_plan_counts_match_nft_rollout_and_update(sd3_dir):
    r = _plan("configs/tiny_nft.py", sd3_dir, "--config.policy.build_tiny_pretrained=False",
              "--config.train.compute_dtype=float32", "--config.train.train_batch_per_replica=16")
    t_cfg, v_cfg = _configs(sd3_dir)
    assert r["algorithm"] == "nft" and r["global_batch"] == 16 and r["rollout_chunk"] == 16
    # NFT keeps the old policy, and the KL reference of a full fine-tune: one params copy each
    assert r["old_bytes"] == r["ref_bytes"] == r["params_bytes"] > 0
    lat = 32 // 2 ** (len(v_cfg["block_out_channels"]) - 1)
    latent = t_cfg["in_channels"] * lat * lat
    text = TEXT * t_cfg["joint_attention_dim"] + t_cfg["pooled_projection_dim"]
    resident = r["train_state_bytes"] + r["transformer_frozen_bytes"]
    update, rollout = r["programs"]["update"], r["programs"]["rollout"]
    # update: state, frozen, the whole batch per device (x0, advantage and the index of each
    # row's prompt conditioning, 4 bytes each; the conditioning once per distinct prompt of
    # the device's rows: cond_slots of them), key, eta
    assert r["cond_slots"] == cond_slots(16, 4, 2) == 2  # 8 rows a device, 2 prompts
    data = 4 * (16 // 2) * (latent + 1 + 1) + 4 * r["cond_slots"] * text
    assert update["argument_bytes"] == resident + data + KEY_BYTES + ETA_BYTES
    # rollout: what it reads (XLA drops unused arguments): the old policy, the frozen buffers,
    # the VAE's decoder (replicated over data=2), one chunk's noise and cond; the deterministic
    # sampler (sample.deterministic_sampling) does not read its key
    chunk = 4 * (16 // 2) * (latent + text)
    assert rollout["chunk_bytes"] == chunk
    vae = abstract_model(v_cfg, None, jnp.float32)
    decoder = sum(math.prod(v.get_value().shape) * 4 for path, v in
                  nnx.state(vae, nnx.Variable).flat_state() if path[0] == "decoder")
    assert rollout["argument_bytes"] == (r["old_bytes"] + r["transformer_frozen_bytes"] + decoder
                                         + chunk)
    # the rollout's FLOPs: its sampler's transformer forwards and one VAE decode
    steps = 10  # tiny_nft's sample.num_steps, one forward each (no CFG)
    want = flops.rollout(t_cfg, v_cfg, 16, steps, lat, lat, TEXT)["model"]
    assert math.isclose(rollout["flops"], want, rel_tol=1e-3), (rollout["flops"], want)
    assert r["total_bytes"] == max(update["peak_bytes"], rollout["peak_bytes"])
    assert "rollout:" in plan_lib.describe(r) and "update:" in plan_lib.describe(r)


def test_plan_refuses_what_it_cannot_plan(sd3_dir):
    with pytest.raises(SystemExit, match="64 devices asked, the backend has 8"):
        _plan("configs/tiny_sft.py", sd3_dir, "--devices", "64")
    with pytest.raises(SystemExit, match="Cosmos takes 4k\\+1 frames"):
        plan_lib.plan(plan_lib.parse_args(["--config", "configs/cosmos25_2b_nft.py",
                                           "--frames", "8"]))
    with pytest.raises(SystemExit):
        plan_lib.parse_args(["--bogus"])


def test_main_refuses_a_run_that_cannot_fit_before_loading_weights(sd3_dir, tmp_path,
                                                                   monkeypatch, capsys):
    # the module's tiny pipeline (build_tiny finds it there and builds nothing): the refusal
    # depends on the model's shapes, not on which random weights it holds
    from wfm_jax.cli.main import EXIT_BAD_INPUT, main
    monkeypatch.setenv(plan_lib.MEMORY_ENV, str(1 << 20))  # a 1 MiB device
    out = tmp_path / "run"
    code = main(["--config", "configs/tiny_sft.py", f"--config.train.output_dir={out}",
                 f"--config.policy.model_name_or_path={sd3_dir}",
                 "--config.policy.build_tiny=True",
                 f"--config.train.train_policy.dataset.local_dir={tmp_path / 'shapes'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1 and "does not fit" in err[0] and "has 1048576 bytes" in err[0], err
    assert not (out / "checkpoints").exists()  # nothing trained, nothing saved
    # 1 MiB is less than the resident state: refused from shapes, before any compile; with
    # exactly the resident bytes the step is compiled and its temporaries refuse it
    assert "what stays on each device needs" in err[0], err
    resident = int(err[0].split(" needs ")[1].split(" bytes")[0])
    monkeypatch.setenv(plan_lib.MEMORY_ENV, str(resident))
    code = main(["--config", "configs/tiny_sft.py", f"--config.train.output_dir={out}",
                 f"--config.policy.model_name_or_path={sd3_dir}",
                 f"--config.train.train_policy.dataset.local_dir={tmp_path / 'shapes'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1 and "its step needs" in err[0] and f"has {resident} bytes" in err[0], err
    assert int(err[0].split(" needs ")[1].split(" bytes")[0]) > resident
    assert not (out / "checkpoints").exists()
