"""cosmos-rl TOML recipes (issue 18, item 3): tests/recipes/ holds cosmos-rl's published SD3.5
NFT, SFT and SFT-LoRA recipes key for key; they resolve to the wfm_jax values they mean, keys
with no meaning in JAX are listed once, a key cosmos-rl does not have is one line naming the
nearest one, and the NFT recipe pointed at the tiny pipeline trains."""
import json
import os

import numpy as np
import pytest

from wfm_jax.cli import main as wmain
from wfm_jax.config import recipe as cfg
from wfm_jax.config.recipe import ConfigError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
RECIPES = os.path.join(HERE, "recipes")
NFT = os.path.join(RECIPES, "sd35_nft.toml")
TARGETS = ("attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
           "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v")


def test_nft_recipe_resolves_to_its_meaning(capsys):
    c = cfg.load_config(NFT)
    tp = c.train.train_policy
    assert tp.type == "nft" and tp.use_remote_reward and tp.timesteps_fraction == 0.99
    assert (tp.kl_beta, tp.mini_batch, tp.advantage_low, tp.advantage_high) == (1e-4, 9, -5.0, 5.0)
    assert tp.remote_reward.reward_fns == [{"name": "pickscore", "weight": 1.0, "score_key": ""}]
    assert tp.remote_reward.clip == 5.0 and tp.remote_reward.scale == 1.0
    assert tp.global_std is False and tp.std_ddof == 1  # cosmos-rl's remote-reward advantages
    lora = c.policy.lora
    assert lora.enable and (lora.r, lora.lora_alpha, lora.init_lora_weights) == (32, 64, "gaussian")
    assert tuple(lora.target_modules) == TARGETS
    d = c.policy.diffusers
    assert tuple(d.inference_size) == (512, 512) and d.max_prompt_length == 128
    assert (d.nft_beta, d.weight_copy_decay_type) == (1.0, 1)
    assert (d.sample.num_steps, d.sample.eval_num_steps, d.sample.solver) == (10, 40, "dpm2")
    assert d.sample.guidance_scale == 1.0 and d.sample.deterministic_sampling
    t = c.train
    assert (t.train_batch_per_replica, t.optm_lr, t.optm_eps, t.optm_weight_decay) == (1152, 3e-4, 1e-8, 1e-4)
    assert t.ema_enable and t.ema_decay == 0.9 and t.seed == 42
    # cosmos-rl's param_dtype is the forward/backward dtype; its master_dtype (float32 by default)
    # is the weights AdamW updates: wfm_jax's compute_dtype and param_dtype
    assert (t.compute_dtype, t.param_dtype) == ("bfloat16", "float32")
    assert t.ckpt.save_freq == 20 and t.wandb.enable and t.wandb.project == "cosmos_rl"
    assert t.wandb.name == "" and c.rollout.n_generation == 24
    assert c.policy.parallelism.fsdp == 8 and c.policy.remat == "nothing_saveable"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: cosmos-rl keys with no meaning in wfm_jax")
    for key in ("redis", "train.optm_impl", "train.async_tp_enabled", "train.fsdp_offload",
                "policy.lora.lora_names", "train.train_policy.dataset.name"):
        assert key in err


@pytest.mark.parametrize("name, lora", [("sd35_sft", False), ("sd35_sft_lora", True)])
def test_sft_recipes_resolve(name, lora, capsys):
    c = cfg.load_config(os.path.join(RECIPES, f"{name}.toml"))
    tp = c.train.train_policy
    assert tp.type == "sft" and tp.mini_batch == 1 and tp.dataset.local_dir == "local_validation_dir"
    assert c.policy.lora.enable is lora
    if lora:
        assert (c.policy.lora.r, c.policy.lora.lora_alpha) == (32, 64)
    d = c.policy.diffusers
    assert d.max_prompt_length == 300 and tuple(d.inference_size) == (1024, 1024)
    assert d.weighting_scheme == "logit_normal" and d.sample.num_steps == 50
    t = c.train
    assert (t.optm_lr, t.optm_eps, t.optm_weight_decay, t.train_batch_per_replica) == (1e-4, 1e-5, 0.01, 1)
    assert t.ckpt.save_freq == 30 and c.validation.enable and c.validation.freq == 10
    assert c.validation.dataset.local_dir == "local_dir"
    assert (c.policy.parallelism.fsdp, c.policy.parallelism.data, c.policy.parallelism.context) == (8, 1, 1)
    assert "train.sync_weight_interval" in capsys.readouterr().err


def _edit(tmp_path, old, new, src=NFT):
    text = open(src).read()
    assert old in text
    path = tmp_path / "recipe.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


@pytest.mark.parametrize("old, new, fragment", [
    ("optm_lr = 3e-4", "optm_lrr = 3e-4", "unknown cosmos-rl key 'train.optm_lrr'; did you mean 'optm_lr'?"),
    ("weight = 1.0", "wieght = 1.0",
     "'train.train_policy.remote_reward.reward_fns[0].wieght'; did you mean 'weight'?"),
    ("[policy.diffusers.sample]", "[policy.diffusers.sampel]",
     "unknown cosmos-rl key 'policy.diffusers.sampel'; did you mean 'sample'?"),
    ('trainer_type = "diffusion_nft"', 'trainer_type = "grpo"', "has no wfm_jax trainer"),
    ("[train.train_policy.remote_reward]", "[train.train_policy.remote_reward]\nreward_clip_min = -1.0",
     "clips the total reward symmetrically"),
    ('optm_name = "AdamW"', 'optm_name = "SGD"', "AdamW only"),
    ('init_lora_weights = "gaussian"', "init_lora_weights = false", 'takes true or "gaussian"'),
    ("kl_beta = 0.0001", "kl_beta = 'x'", "kl_beta"),
    ("[policy]", "[policy\n", "is not valid TOML"),
])
def test_bad_recipes_are_one_line_and_exit_2(tmp_path, capsys, old, new, fragment):
    path = _edit(tmp_path, old, new)
    with pytest.raises(ConfigError) as info:
        cfg.load_config(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    capsys.readouterr()
    assert wmain.main(["--config", path]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err  # one line (no ignored-keys note before it)


def test_wfm_stack_recipes_without_data_name_the_missing_piece(tmp_path):
    # a world-model recipe (tests/config/test_cosmos_rl_recipes.py has cosmos-rl's own) whose
    # web loader is cosmos-rl's internal webdataset rather than its mock data
    path = tmp_path / "predict2.toml"
    path.write_text("[model]\nfsdp_shard_size = 8\n\n[trainer]\nmax_iter = 10\n")
    with pytest.raises(ConfigError, match="internal webdataset, which is not here"):
        cfg.load_config(str(path))


def test_overrides_use_wfm_jax_keys(capsys):
    c = cfg.load_config(NFT, [("policy.parallelism.fsdp", "1"), ("rollout.n_generation", "8")])
    assert c.policy.parallelism.fsdp == 1 and c.rollout.n_generation == 8
    with pytest.raises(ConfigError, match="did you mean"):
        cfg.load_config(NFT, [("train.optm_lrr", "1")])


@pytest.mark.slow
def test_nft_recipe_trains_on_the_tiny_pipeline(tmp_path, monkeypatch):
    from reward_client.background import BackgroundServer
    from reward_client.local import jpeg_compressibility
    from reward_client.protocol import ENQUEUE_PATH, PULL_PATH
    from reward_client.registry import register_reward, unregister_reward
    from reward_client.server import create_app
    from wfm_jax.families.tiny import build_tiny_pipeline

    tiny = build_tiny_pipeline(str(tmp_path / "pipe"), seed=0)
    out = tmp_path / "out"
    register_reward("pickscore")(jpeg_compressibility)  # the recipe's reward name, served locally
    try:
        with BackgroundServer(create_app("tok")) as srv:
            monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", srv.url + ENQUEUE_PATH)
            monkeypatch.setenv("REMOTE_REWARD_FETCH_URL", srv.url + PULL_PATH)
            monkeypatch.setenv("REMOTE_REWARD_TOKEN", "tok")
            rc = wmain.main([
                "--config", NFT,  # the published recipe, pointed at the tiny pipeline and sizes
                f"--config.policy.model_name_or_path={tiny}", f"--config.train.output_dir={out}",
                "--config.train.train_policy.dataset.local_dir="
                + os.path.join(HERE, "..", "configs", "prompts", "tiny.txt"),
                "--config.train.max_steps=2", "--config.train.train_batch_per_replica=8",
                "--config.rollout.n_generation=4", "--config.train.train_policy.mini_batch=1",
                "--config.policy.parallelism.fsdp=1", "--config.policy.lora.r=4",
                "--config.policy.diffusers.inference_size=(32, 32)",
                "--config.policy.diffusers.max_prompt_length=16",
                "--config.policy.diffusers.sample.num_steps=4", "--config.train.param_dtype=float32",
                "--config.train.wandb.enable=False", "--config.train.ckpt.export_safetensors=False"])
    finally:
        unregister_reward("pickscore")
    assert rc == 0
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["train/loss"]) for r in rows)
    resolved = json.load(open(out / "config.json"))
    assert resolved["train"]["train_policy"]["type"] == "nft"
    assert resolved["train"]["train_policy"]["timesteps_fraction"] == 0.99


SFT = os.path.join(RECIPES, "sd35_sft.toml")
REASON = os.path.join(RECIPES, "cosmos_rl", "reason")


@pytest.mark.parametrize("src, old, new, samples, want", [
    # cosmos-rl's SFT: floor(samples / batch) steps per epoch, times train.epoch
    (SFT, "epoch = 1\n", "epoch = 1\n", 10, 10),
    (SFT, "train_batch_per_replica = 1\n", "train_batch_per_replica = 4\n", 10, 2),
    (SFT, "epoch = 1\n", "epoch = 3\n", 10, 30),
    (SFT, "epoch = 1\n", "", 10, 10),  # no epoch: cosmos-rl's default, one pass
    (SFT, "epoch = 1\n", "epoch = 3\nmax_num_steps = 25\n", 10, 25),  # the smaller
    (SFT, "epoch = 1\n", "epoch = 3\nmax_num_steps = 50\n", 10, 30),
    # cosmos-rl's RL: prompts x n_generation x epoch // train_batch_per_replica (100000 epochs)
    (NFT, "epoch = 100000\n", "epoch = 100000\n", 100, 100 * 24 * 100000 // 1152),
    (NFT, "epoch = 100000\n", "epoch = 100000\nmax_num_steps = 300\n", 100, 300),
    # the vision-language recipes: Reason1 GRPO, 80 epochs of 16 prompts x 8 per step
    (os.path.join(REASON, "cosmos-reason1-7b-grpo.toml"), "epoch = 80\n", "epoch = 80\n", 100,
     100 * 8 * 80 // 128),
    # Reason2 LLaVA SFT, no epoch (1) and 32 conversations a step
    (os.path.join(REASON, "cosmos-reason2-2b-llava_sft.toml"), "[train]\n", "[train]\n", 1000, 31),
])
def test_the_run_lasts_as_in_cosmos_rl(tmp_path, capsys, src, old, new, samples, want):
    """train.epoch and max_num_steps import unchanged (epoch 1 when the TOML says nothing) and
    give cosmos-rl's step count once the data's size is known."""
    from wfm_jax.config.run_length import run_steps
    c = cfg.load_config(_edit(tmp_path, old, new, src=src))
    assert c.train.epoch >= 1
    assert c.train.max_steps == (int(new.split("max_num_steps = ")[1]) if "max_num" in new else None)
    assert run_steps(c, samples) == want


@pytest.mark.parametrize("value, want", [("false", ""), ('"all"', "all"), ('"final"', "final")])
def test_s3_upload_keys_carry_over(tmp_path, value, want):
    """cosmos-rl's train.ckpt.upload_s3 (false | "final" | "all"), s3_bucket, s3_prefix."""
    src = os.path.join(RECIPES, "sd35_sft.toml")
    path = _edit(tmp_path, 'save_mode = "async"', f'save_mode = "async"\nupload_s3 = {value}\n'
                 f's3_bucket = "runs"\ns3_prefix = "sft/a"', src=src)
    ck = cfg.load_config(path).train.ckpt
    assert (ck.upload_s3, ck.s3_bucket, ck.s3_prefix) == (want, "runs", "sft/a")


def test_precision_keys_mean_what_cosmos_rl_means(tmp_path):
    """cosmos-rl's master_dtype is the optimizer's weights, its param_dtype the forward/backward
    dtype (its TrainingConfig): a recipe's pair lands in param_dtype / compute_dtype."""
    path = _edit(tmp_path, 'param_dtype = "bfloat16"', 'master_dtype = "bfloat16"\nparam_dtype = "float32"')
    t = cfg.load_config(path).train
    assert (t.param_dtype, t.compute_dtype) == ("bfloat16", "float32")


@pytest.mark.parametrize("model,family", [
    ("Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers", "sana"),
    ("Efficient-Large-Model/SANA-Video_2B_480p_diffusers", "sana_video"),
    ("nvidia/Cosmos-Predict2.5-2B", "cosmos"),
    ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "wan"),
    ("stabilityai/stable-diffusion-3.5-medium", "sd3")])
def test_the_model_names_the_family(tmp_path, model, family):
    """cosmos-rl picks the pipeline from the model: a recipe for another family's model must
    not run as SD3 (a local dir is read from its model_index.json)."""
    text = open(NFT).read()
    start = text.index("model_name_or_path")
    end = text.index("\n", start)
    path = tmp_path / "recipe.toml"
    path.write_text(text[:start] + f'model_name_or_path = "{model}"' + text[end:])
    from wfm_jax.config.cosmos_toml import read_recipe
    out, _ = read_recipe(str(path))
    assert out["policy.family"] == family


def test_a_local_model_dir_names_its_family(tmp_path):
    from wfm_jax.config.cosmos_toml import model_family
    from wfm_jax.families.tiny import build_tiny_pipeline
    wan = build_tiny_pipeline(str(tmp_path / "any_name"), family="wan")
    assert model_family(wan, "r.toml") == "wan"
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    with pytest.raises(ConfigError, match=r"^r.toml: policy.model_name_or_path: .*'FluxPipeline'"):
        model_family(str(tmp_path / "odd"), "r.toml")
