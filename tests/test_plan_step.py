"""wfm_jax.plan on a tiny SD3 recipe (its transformer/config.json only: no weights exist): the
per-device train-state bytes it counts equal the compiled step's own argument bytes (XLA's
memory_analysis), its FLOPs match the analytic counts the benchmark uses, and the CLI takes
--config.a.b=v overrides and a device kind."""
from __future__ import annotations

import json
import math

import pytest

from wfm_jax import plan as plan_lib
from wfm_jax.bench import flops

TINY = dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=32,
            num_attention_heads=4, joint_attention_dim=64, caption_projection_dim=128,
            pooled_projection_dim=32, out_channels=16, pos_embed_max_size=16,
            dual_attention_layers=(), qk_norm="rms_norm")


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(TINY))
    return str(tmp_path)


def _plan(model_dir, *extra):
    args = plan_lib.parse_args(["--config", "configs/tiny_sft.py", "--devices", "2", "--batch-per-device", "2",
                                "--size", "128", f"--config.policy.model_name_or_path={model_dir}",
                                "--config.train.compute_dtype=float32",
                                "--config.policy.parallelism.data=2", *extra])
    return plan_lib.plan(args)


def test_plan_counts_match_the_compiled_step(model_dir):
    r = _plan(model_dir, "--device-kind", "v6e")
    assert r["family"] == "sd3" and r["devices"] == 2 and r["global_batch"] == 4
    # arguments of the step: train state + frozen buffers + the batch (x0, prompt embeds,
    # pooled, ids), all per device
    rows = r["global_batch"] // 2
    batch = 4 * rows * (16 * 16 * 16 + (77 + 16) * 64 + 32 + 1)
    assert r["step_argument_bytes"] == (r["train_state_bytes"] + r["transformer_frozen_bytes"]
                                        + batch)
    # fp32 AdamW: two moments per parameter; EMA: one copy (tiny_sft enables it)
    assert r["optimizer_bytes"] >= 2 * r["params_bytes"] and r["ema_bytes"] == r["params_bytes"]
    # the step's matmul FLOPs against the benchmark's analytic count of what autodiff runs
    want = flops.train_step(TINY, r["global_batch"], 16, 16, 77 + 16)["autodiff"]
    assert math.isclose(r["flops_per_step"], want, rel_tol=1e-3), (r["flops_per_step"], want)
    assert r["fits"] and r["device_memory_bytes"] == 32 * 2 ** 30
    assert r["collective_bytes"]["all-reduce"] > 0  # gradients over data=2
    assert "fits a v6e" in plan_lib.describe(r)


def test_plan_refuses_what_it_cannot_plan(model_dir):
    with pytest.raises(SystemExit, match="only SFT steps"):
        _plan(model_dir, "--config.train.train_policy.type=nft", "--config.rollout.n_generation=4")
    with pytest.raises(SystemExit):
        plan_lib.parse_args(["--bogus"])


def test_main_refuses_a_run_that_cannot_fit_before_loading_weights(tmp_path, monkeypatch,
                                                                   capsys):
    from wfm_jax.main import EXIT_BAD_INPUT, main
    monkeypatch.setenv(plan_lib.MEMORY_ENV, str(1 << 20))  # a 1 MiB device
    out = tmp_path / "run"
    code = main(["--config", "configs/tiny_sft.py", f"--config.train.output_dir={out}",
                 f"--config.policy.model_name_or_path={tmp_path / 'tiny_sd3'}",
                 f"--config.train.train_policy.dataset.local_dir={tmp_path / 'shapes'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1 and "does not fit" in err[0] and "> 0.00 GiB" in err[0], err
    assert not (out / "checkpoints").exists()  # nothing trained, nothing saved


def test_plan_builds_a_wan_step(tmp_path):
    wan = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
               out_channels=16, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=3,
               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
               rope_max_seq_len=32)
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(wan))
    args = plan_lib.parse_args(["--config", "configs/tiny_wan_sft.py", "--devices", "2",
                                "--batch-per-device", "1", "--size", "64", "--remat", "full",
                                f"--config.policy.model_name_or_path={tmp_path}",
                                "--config.policy.parallelism.data=2"])
    r = plan_lib.plan(args)
    assert r["family"] == "wan" and r["frames"] == 9 and r["remat"] == "full"
    rows = r["global_batch"] // 2
    batch = 4 * rows * (16 * 3 * 8 * 8 + 16 * 32 + 1)  # latents (3 frames), text, ids
    assert r["step_argument_bytes"] == r["train_state_bytes"] + r["transformer_frozen_bytes"] + batch
    assert r["flops_per_step"] > 0 and r["encoders_vae_bytes"] == 0
