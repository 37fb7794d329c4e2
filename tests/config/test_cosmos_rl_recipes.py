"""cosmos-rl's 16 diffusion / world-model recipes (tests/recipes/cosmos_rl/, its published files
key for key) load unchanged: `--dry-run` resolves each (cosmos-policy: one line, exit 2), the
world-model ones map onto the spec's values (shared/specs/cosmos_rl_wfm.md §1-§3, §9), the
`timestep_fraction` typo warns and trains as cosmos-rl did, and the mock-data quick start runs
on the tiny Cosmos twin."""
import json
import math
import os
import subprocess
import sys

import pytest

from tests._support.xla import host_devices
from wfm_jax.cli import main as wmain
from wfm_jax.config import recipe as cfg
from wfm_jax.config.base import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "tests", "recipes", "cosmos_rl")
ALL = sorted(f for f in os.listdir(RECIPES) if f.endswith(".toml"))
POLICY = "cosmos-policy-libero10-eval.toml"
MOCK = "cosmos-predict2-5-2b-480-grpo-mock-data.toml"
NFT = ("cosmos-predict2-5-2b-720-nft.toml", "diffusion_rl_e2e_test.toml", "sana-image-nft.toml",
       "sana-video-nft.toml", "stable-diffusion-3-5-medium-nft.toml")


def _path(name):
    return os.path.join(RECIPES, name)


@pytest.fixture(autouse=True)
def _no_reward_service(monkeypatch):
    monkeypatch.delenv("REMOTE_REWARD_ENQUEUE_URL", raising=False)
    monkeypatch.delenv("COSMOS_OUTPUT_DIR", raising=False)


def test_the_sixteen_recipes_are_here():
    assert len(ALL) == 16 and POLICY in ALL and MOCK in ALL


@pytest.mark.parametrize("name", [n for n in ALL if n != POLICY])
def test_dry_run_resolves(name, capsys):
    assert wmain.main(["--config", _path(name), "--dry-run"]) == 0
    out = capsys.readouterr().out
    head, _, tail = out.partition("\nwould load: ")
    resolved = json.loads(head)
    assert resolved["policy"]["family"] in ("cosmos", "sd3", "sana", "sana_video")
    assert tail.startswith("trainer: ") and "model: " in tail


def test_cosmos_policy_is_one_line_without_traceback():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "wfm_jax.main", "--config", _path(POLICY), "--dry-run"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "robot-policy evaluation on the LIBERO simulator" in lines[0]
    assert "use cosmos-rl for it" in lines[0]


@pytest.mark.parametrize("name", NFT)
def test_timestep_fraction_warns_and_trains_on_every_step(name, capsys):
    c = cfg.load_config(_path(name))
    assert c.train.train_policy.type == "nft"
    assert c.train.train_policy.timesteps_fraction == 1.0  # what cosmos-rl applied
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "timestep_fraction = 0.99" in warnings[0]
    assert "never applied" in warnings[0]


def test_timesteps_fraction_is_honoured_when_spelt_right(tmp_path, capsys):
    with open(_path("sana-image-nft.toml")) as f:
        text = f.read().replace("timestep_fraction = 0.99",
                                "timestep_fraction = 0.99\ntimesteps_fraction = 0.5")
    path = tmp_path / "r.toml"
    path.write_text(text)
    assert cfg.load_config(str(path)).train.train_policy.timesteps_fraction == 0.5
    assert "training on 0.5 of the steps" in capsys.readouterr().err


def test_nft_recipes_read_both_reward_forms():
    table = cfg.load_config(_path("sana-video-nft.toml")).train.train_policy.remote_reward
    assert table.reward_fns == [{"name": "dance_grpo", "weight": 1.0, "score_key": "overall_reward"}]
    fns = cfg.load_config(_path("diffusion_rl_e2e_test.toml")).train.train_policy.remote_reward
    assert fns.reward_fns == [{"name": "pickscore", "weight": 1.0, "score_key": ""}]


# spec §1 table: the "GRPO" recipes run the RLConfig defaults, the DDRL recipes their [model.rl]
GRPO = dict(sample_steps=10, train_on=tuple(range(8)), n_generation=8, kl_beta=0.01, data_beta=0.0,
            update_ref_every_iter=16, use_same_seed=True, frames=(1, 1), text_dropout_rate=0.0)
DDRL = dict(sample_steps=20, train_on=tuple(range(0, 20, 2)), n_generation=8, kl_beta=0.0,
            data_beta=0.01, update_ref_every_iter=0, use_same_seed=True, frames=(0, 1),
            text_dropout_rate=0.2)  # [[model.conditioner]] text dropout_rate (spec §5)
# the 2B DDRL file leaves use_same_seed at the RLConfig default (true); the 14B one sets false


@pytest.mark.parametrize("name, rl, mesh, size, warmup, steps", [
    (MOCK, GRPO, (8, 1, 1), (432, 768), 1000, 25),
    ("cosmos-predict2-5-2b-480-grpo.toml", GRPO, (8, 1, 1), (432, 768), 50, 2001),
    ("cosmos-predict2-5-2b-720-reason-embedding-ddrl.toml", DDRL, (8, 16, 2), (720, 1280), 50, 2001),
    ("cosmos-predict2-5-14b-720-reason-embedding-ddrl.toml", dict(DDRL, use_same_seed=False),
     (32, 4, 8), (720, 1280), 50, 2001),
])
def test_world_model_recipes_select_the_wfm_rl_step(name, rl, mesh, size, warmup, steps, capsys):
    c = cfg.load_config(_path(name))
    tp, d, w = c.train.train_policy, c.policy.diffusers, c.train.train_policy.wfm
    assert (tp.type, c.policy.family) == ("wfm_rl", "cosmos")
    for key in ("sample_steps", "kl_beta", "data_beta", "update_ref_every_iter", "use_same_seed",
                "text_dropout_rate"):
        assert w[key] == rl[key], key
    assert tuple(w.train_on) == rl["train_on"] and c.rollout.n_generation == rl["n_generation"]
    assert (d.min_num_conditional_frames, d.max_num_conditional_frames) == rl["frames"]
    assert w.guidance == 0.0 and d.sample.guidance_scale == 1.0  # one conditional pass
    assert (w.clip_ratio, w.loss_scale, tp.advantage_low, tp.advantage_high) == (1e-4, 10.0, -5.0, 5.0)
    assert (w.s_churn, w.s_noise, w.s_t_min, w.s_t_max, w.solver_option) == (1.0, 1.0, 0.0, math.inf, "2ab")
    assert (w.sigma_min, w.sigma_max, w.p_mean, w.p_std) == (0.01, 200.0, math.log(4.0), 1.2)
    # the algorithm's typed config takes them as they are
    from wfm_jax.algorithms.registry import algorithm_named
    step = algorithm_named("wfm_rl").Config.from_recipe(c).step
    assert (step.sample_steps, step.train_on, step.num_rollout, step.kl_beta, step.data_beta,
            step.text_dropout_rate) == (rl["sample_steps"], rl["train_on"], rl["n_generation"],
                                        rl["kl_beta"], rl["data_beta"], rl["text_dropout_rate"])
    assert step.plan().num_intervals == rl["sample_steps"]
    assert wmain.main(["--config", _path(name), "--dry-run"]) == 0
    assert "would load: trainer: wfm_rl on the cosmos family" in capsys.readouterr().out
    par = c.policy.parallelism
    assert (par.fsdp, par.data, par.context) == mesh
    assert c.train.train_batch_per_replica == mesh[0] * mesh[1]  # one video per data-parallel rank
    assert tuple(d.inference_size) == size and d.train_frames == 93
    t = c.train
    assert (t.optm_lr, t.optm_weight_decay, tuple(t.optm_betas), t.optm_eps) == (
        1e-5, 1e-4, (0.9, 0.99), 1e-8)
    assert (t.optm_warmup_steps, t.lr_schedule, t.max_steps, t.optm_grad_norm_clip) == (
        warmup, "constant", steps, 1.0)
    assert t.output_dir == os.path.join("./outputs", "cosmos_rl_wfm", "official_runs_t2v", name[:-5])


def test_mock_recipe_rewards_without_a_service(capsys, monkeypatch):
    c = cfg.load_config(_path(MOCK))
    tp = c.train.train_policy
    assert tp.dataset.layout == "mock" and not tp.use_remote_reward
    assert [f["name"] for f in tp.remote_reward.reward_fns] == ["jpeg_compressibility"]
    lines = [x for x in capsys.readouterr().err.splitlines() if "reward service" in x]
    assert len(lines) == 1 and "built-in deterministic jpeg_compressibility" in lines[0]
    monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", "http://127.0.0.1:1/enqueue")
    tp = cfg.load_config(_path(MOCK)).train.train_policy
    assert tp.use_remote_reward and tp.remote_reward.reward_fns[0]["name"] == "dance_grpo"
    assert tp.remote_reward.media_type == "latent"  # cosmos-rl sends the latents


def test_native_checkpoint_is_named_by_the_dry_run(capsys):
    assert wmain.main(["--config", _path("cosmos-predict2-5-2b-480-grpo.toml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ("model: nvidia/Cosmos-Predict2.5-2B/base/pre-trained/"
            "d20b7120-df3e-4911-919d-db6e08bad31c_ema_bf16.pt (not on this machine") in out


@pytest.mark.parametrize("args, code, fragment", [
    (["--wfm-mode", "cosmos_rl.tools.dataset.wfm_rl"], 0, None),
    (["cosmos_rl.tools.dataset.wfm_rl", "--wfm-mode"], 0, None),
    (["--wfm-mode"], 2, "--wfm-mode needs the launcher module"),
    (["--wfm-mode", "cosmos_rl.tools.dataset.diffusion_nft"], 2, "does not run"),
    (["--wfm-mode", "cosmos_rl.tools.dataset.wfm_sft"], 2, "is not one of cosmos-rl's diffusion launchers"),
])
def test_wfm_mode_as_cosmos_rl_launches(args, code, fragment, capsys):
    assert wmain.main(["--config", _path(MOCK), "--dry-run", *args]) == code
    if fragment is not None:
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err


def test_wfm_mode_on_a_diffusers_recipe_is_one_line(capsys):
    argv = ["--config", _path("sana-image-nft.toml"), "--wfm-mode", "cosmos_rl.tools.dataset.wfm_rl"]
    assert wmain.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a world-model recipe" in err and "\n" not in err
    assert wmain.main(["--config", _path("sana-image-nft.toml"), "--dry-run",
                       "cosmos_rl.tools.dataset.diffusers_dataset"]) == 0


@pytest.mark.parametrize("old, new, fragment", [
    ("sample_steps = 20", "sample_stepz = 20",
     "unknown cosmos-rl key 'model.rl.sample_stepz'; did you mean 'sample_steps'?"),
    ('name = "grad_clip"', 'name = "grad_clipp"', "is not a cosmos-rl callback; did you mean 'grad_clip'?"),
    ("f_min = [1.0]", "f_min = [0.5]", "f_min = 0.5"),
    ('type = "text_attr"', 'type = "remap_key"', "cosmos-rl's is 'text_attr'"),
])
def test_bad_world_model_keys_are_one_line(tmp_path, old, new, fragment):
    with open(_path("cosmos-predict2-5-2b-720-reason-embedding-ddrl.toml")) as f:
        text = f.read()
    assert old in text
    path = tmp_path / "r.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        cfg.load_config(str(path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_cosmos_rl_drops_are_notes_not_errors(capsys):
    cfg.load_config(_path("cosmos-predict2-5-2b-480-grpo.toml"))
    err = capsys.readouterr().err
    assert "(heart_beat): step_size outside 'args' is dropped by cosmos-rl" in err
    cfg.load_config(_path(MOCK))
    assert "'model_parallel.pipeline_parallel_size' is not a cosmos-rl key" in capsys.readouterr().err


@pytest.mark.slow
def test_mock_quick_start_runs_on_the_tiny_twin(tmp_path):
    """The seed quick start, unchanged but for build_tiny and its length: 5 of its 25 iterations
    (the later ones run the same compiled programs; the whole run's time is measured in
    docs/cosmos_rl_migration.md), each with a finite loss and a reward, on the tiny Cosmos twin
    with the mock videos shrunk to its size."""
    env = dict(os.environ, PYTHONPATH=ROOT, WANDB_MODE="disabled",
               XLA_FLAGS=host_devices(8))
    env.pop("REMOTE_REWARD_ENQUEUE_URL", None)
    env.pop("COSMOS_OUTPUT_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "wfm_jax.main", "--config", _path(MOCK),
                           "--config.policy.build_tiny=True", "--config.train.max_steps=5"],
                          capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "built-in deterministic jpeg_compressibility reward" in proc.stderr
    run = tmp_path / "outputs" / "cosmos_rl_wfm" / "official_runs_t2v" / (MOCK[:-5] + "_tiny")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 6))
    for r in rows:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/reward_mean"])
    resolved = json.loads((run / "config.json").read_text())
    assert tuple(resolved["policy"]["diffusers"]["inference_size"]) == (32, 32)
    assert resolved["policy"]["diffusers"]["train_frames"] == 9


def test_tiny_mock_resolves_to_the_twin(capsys):
    c = cfg.load_config(_path(MOCK), [("policy.build_tiny", "True")])
    run = os.path.join("./outputs", "cosmos_rl_wfm", "official_runs_t2v", MOCK[:-5] + "_tiny")
    assert c.train.output_dir == run  # apart from a full-size run's checkpoints
    assert c.policy.model_name_or_path == os.path.join(run, "tiny_cosmos")
    d = c.policy.diffusers
    assert (tuple(d.inference_size), d.train_frames, d.max_prompt_length) == ((32, 32), 9, 512)
    given = cfg.load_config(_path(MOCK), [("policy.build_tiny", "True"),
                                          ("policy.diffusers.train_frames", "5")])
    assert given.policy.diffusers.train_frames == 5  # the command line wins
    assert "tiny mock run" in capsys.readouterr().err


def test_mock_items_are_random_and_reproducible():
    import numpy as np

    from wfm_jax.data import mock
    c = cfg.load_config(_path(MOCK))
    records, val = mock.records(c)
    assert len(records) == 25 and val == []  # one group of 8 rollouts per iteration, fresh items
    a = records[3].load((6, 10), 4, np.random.default_rng((0, 1, 3)))
    b = records[3].load((6, 10), 4, np.random.default_rng((0, 1, 3)))
    assert a.shape == (4, 6, 10, 3) and a.dtype == np.uint8 and (a == b).all()
    assert a.max() <= 254 and len(np.unique(a)) > 100  # uniform over [0, 255)

    class Pipe:
        text_width = 7
    notes = []
    enc = mock.MockTextEncoder(Pipe(), 5, 1024, seed=0, log=notes.append)
    assert notes == ["note: mock text embeddings are 7 wide (the DiT's text input), not the "
                     "recipe's t5_dim 1024"]
    ids = enc.tokenize([records[3].prompt, records[3].prompt, records[4].prompt])
    emb = np.asarray(enc(ids)["encoder_hidden_states"])
    assert emb.shape == (3, 5, 7) and (emb[0] == emb[1]).all() and not (emb[0] == emb[2]).all()
    assert abs(emb.std() - 1.0) < 0.5
    neg = np.asarray(enc(enc.tokenize(["", ""], negative=True))["encoder_hidden_states"])
    assert (neg == 0).all()  # cosmos-rl's uncondition: the dropped (zero) text
