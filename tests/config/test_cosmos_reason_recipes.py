"""cosmos-rl's vision-language recipes (tests/recipes/cosmos_rl/reason/: cosmos-reason2's LLaVA and
HF SFT files, cosmos-reason1's SFT and GRPO files, an older cosmos-rl Reason1 GRPO file, each as
published) import as the diffusion ones do: the policy is the qwen3_vl family, every key of the
spec's table (shared/specs/reason2.md §4.4; the expected values below are the table's and
cosmos-rl's defaults, not the import's output) lands on the wfm_jax key that does the same thing,
load_config's schema checks pass, and a key wfm_jax cannot honour is one line naming it."""
import json
import os

import pytest

from wfm_jax.cli import main as wmain
from wfm_jax.config import recipe as cfg
from wfm_jax.config.base import ConfigError
from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
REASON = os.path.join(HERE, "recipes", "cosmos_rl", "reason")
LLAVA = os.path.join(REASON, "cosmos-reason2-2b-llava_sft.toml")
HF = os.path.join(REASON, "cosmos-reason2-2b-hf_sft.toml")
R1_SFT = os.path.join(REASON, "cosmos-reason1-7b-sft.toml")
R1_GRPO = os.path.join(REASON, "cosmos-reason1-7b-grpo.toml")
R1_GRPO_OLD = os.path.join(REASON, "cosmos-reason1-7b-p-fsdp1-tp2-r-tp2-pp1-grpo.toml")

# cosmos-rl's TrainingConfig defaults (spec §4.1) where a recipe leaves them out
ADAMW = dict(optm_eps=1e-6, optm_weight_decay=0.01, optm_warmup_steps=20, optm_grad_norm_clip=1.0)


def _train(c, **want):
    for key, value in want.items():
        got = c.train[key]
        assert (tuple(got) if isinstance(got, (list, tuple)) else got) == value, key


def _common_vlm(c, model, max_len):
    assert c.policy.family == "qwen3_vl" and c.policy.model_name_or_path == model
    assert c.train.train_policy.dataset.layout == "conversations"
    assert c.policy.vlm.model_max_length == max_len
    # cosmos-rl: master_dtype float32 (the weights AdamW updates), param_dtype bfloat16 (compute)
    assert (c.train.param_dtype, c.train.compute_dtype) == ("float32", "bfloat16")
    assert c.policy.lora.enable is False


def test_reason2_llava_sft(capsys):
    c = cfg.load_config(LLAVA)
    _common_vlm(c, "nvidia/Cosmos-Reason2-2B", 4096)
    _train(c, train_batch_per_replica=32, optm_lr=1e-6, optm_betas=(0.9, 0.999), **ADAMW)
    tp = c.train.train_policy
    assert tp.type == "sft" and tp.mini_batch == 4
    assert tp.dataset.local_dir == "/tmp/cosmos_reason2/cosmos_rl/data/llava_sft/annotations.json"
    assert c.policy.vlm.media_root == "/tmp/cosmos_reason2/cosmos_rl/data/llava_sft/train2017"
    assert c.policy.vlm.system_prompt == ""
    assert c.train.output_dir == "/tmp/cosmos_reason2/cosmos_rl/outputs/llava_sft"
    assert (c.policy.parallelism.fsdp, c.policy.parallelism.context) == (4, 1)
    assert c.train.wandb.enable and c.train.wandb.project == "cosmos-reason2"
    err = capsys.readouterr().err
    assert "ignored: redis, train.compile" in err and "custom.dataset" not in err


def test_reason2_hf_sft_names_the_dataset_it_cannot_read(capsys):
    c = cfg.load_config(HF)
    _common_vlm(c, "nvidia/Cosmos-Reason2-2B", 4096)
    _train(c, train_batch_per_replica=32, optm_lr=1e-6, optm_betas=(0.9, 0.999), **ADAMW)
    assert c.train.train_policy.type == "sft" and c.train.train_policy.mini_batch == 4
    assert c.train.train_policy.dataset.local_dir == ""
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "Hugging Face dataset" in line]
    assert len(notes) == 1 and "/tmp/cosmos_reason2/cosmos_rl/data/hf_sft" in notes[0]
    assert "custom.dataset.path" not in err.splitlines()[-1]  # named by the note, not "no meaning"
    assert "--config.train.train_policy.dataset.local_dir" in notes[0]


def test_reason1_sft(capsys):
    c = cfg.load_config(R1_SFT)
    _common_vlm(c, "nvidia/Cosmos-Reason1-7B", 4096)
    _train(c, train_batch_per_replica=32, optm_lr=2e-6, optm_betas=(0.9, 0.999), epoch=1, **ADAMW)
    assert c.train.train_policy.type == "sft" and c.train.train_policy.mini_batch == 4
    assert c.train.ckpt.save_freq == 100 and c.train.ckpt.max_keep == 2
    err = capsys.readouterr().err
    assert "Qwen2.5-VL model" in err  # Reason1's architecture is not the one trained here
    for legacy in ("train.enable_validation", "train.validation_step", "policy.parallelism.cp_rotate_method"):
        assert legacy in err


def test_reason1_grpo(capsys):
    c = cfg.load_config(R1_GRPO)
    _common_vlm(c, "nvidia/Cosmos-Reason1-7B", 10240)
    _train(c, train_batch_per_replica=128, optm_lr=2e-6, optm_betas=(0.9, 0.95), epoch=80, **ADAMW)
    tp, g = c.train.train_policy, c.train.train_policy.lm_grpo
    assert tp.type == "grpo" and (tp.mini_batch, tp.mu_iterations) == (2, 1)
    assert tuple(g.rewards) == ("single_choice", "format") and tuple(g.reward_weights) == (1.0, 1.0)
    assert (g.temperature, g.epsilon_low, g.epsilon_high, g.kl_beta) == (0.9, 0.2, 0.2, 0.0)
    assert g.min_filter_prefix_tokens == 1
    assert (c.rollout.n_generation, g.max_response_length, c.rollout.batch_size) == (8, 6144, 4)
    # no [rollout.sampling_config]: cosmos-rl samples at its default 1.0, top_p 1, no top-k
    assert (g.sampling_temperature, g.top_p, g.top_k) == (1.0, 1.0, -1)
    assert (g.loss_type, g.unbiased_advantage, g.lower_bound_ratio) == ("token-mean", False, 3.0)
    assert (c.policy.parallelism.fsdp, c.policy.parallelism.data) == (2, 1)
    err = capsys.readouterr().err
    assert "sampling_temperature=0.9 makes them agree" in err
    assert "rollout.batch_size" not in err and "train.train_policy.prompt_column_name" in err


def _edit(tmp_path, src, old, new):
    text = open(src).read()
    assert old in text
    path = tmp_path / "recipe.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def test_older_grpo_recipe_sampling_config(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"rollout.sampling_config.repetition_penalty = 1.05: .*set 1.0"):
        cfg.load_config(R1_GRPO_OLD)
    c = cfg.load_config(_edit(tmp_path, R1_GRPO_OLD, "repetition_penalty = 1.05", "repetition_penalty = 1.0"))
    g = c.train.train_policy.lm_grpo
    assert (g.sampling_temperature, g.top_p, g.top_k, g.temperature) == (0.6, 0.95, 50, 0.9)
    assert c.train.train_batch_per_replica == 8 and c.train.train_policy.mini_batch == 1


def test_gradient_checkpointing_is_the_decoders_remat(tmp_path):
    """cosmos-rl's policy.model_gradient_checkpointing (PolicyConfig default True) recomputes every
    block in the backward pass: policy.remat nothing_saveable, which the VLM trainers build with;
    false keeps every activation (everything_saveable)."""
    assert cfg.load_config(R1_GRPO).policy.remat == "nothing_saveable"  # written true
    assert cfg.load_config(LLAVA).policy.remat == "nothing_saveable"  # left out: the default
    off = _edit(tmp_path, R1_GRPO, "model_gradient_checkpointing = true", "model_gradient_checkpointing = false")
    assert cfg.load_config(off).policy.remat == "everything_saveable"


def test_reward_function_table_sets_weights(tmp_path):
    path = _edit(tmp_path, R1_GRPO, 'reward_function = ["single_choice", "format"]',
                 "reward_function = { single_choice = 2.0, format = 0.5 }")
    g = cfg.load_config(path).train.train_policy.lm_grpo
    assert tuple(g.rewards) == ("single_choice", "format") and tuple(g.reward_weights) == (2.0, 0.5)


def test_dapo_variant_imports_with_its_filter_and_retries(tmp_path):
    """cosmos-rl's dynamic-sampling keys: variant "dapo", filter_reward_metric (a name or a list)
    and max_retry_for_on_policy land in lm_grpo; a recipe without them keeps "grpo"."""
    g = cfg.load_config(R1_GRPO).train.train_policy.lm_grpo
    assert (g.variant, tuple(g.filter_reward_metric), g.max_retry_for_on_policy) == ("grpo", (), -1)
    path = _edit(tmp_path, R1_GRPO, "mini_batch = 2", 'mini_batch = 2\nvariant = "dapo"\n'
                 'filter_reward_metric = "single_choice"\nmax_retry_for_on_policy = 4')
    g = cfg.load_config(path).train.train_policy.lm_grpo
    assert (g.variant, tuple(g.filter_reward_metric), g.max_retry_for_on_policy) == ("dapo", ("single_choice",), 4)


@pytest.mark.parametrize("src, old, new, fragment", [
    (R1_GRPO, '"single_choice", "format"]', '"single_choice", "overlong"]',
     "train.train_policy.reward_function: no text reward 'overlong'"),
    (R1_GRPO, "mini_batch = 2", "mini_batch = 2\nvariant = \"gspo\"", "train.train_policy.variant = 'gspo'"),
    (R1_GRPO, "mini_batch = 2", "mini_batch = 2\nfilter_reward_metric = 3", "train.train_policy.filter_reward_metric = 3"),
    (R1_GRPO, "mini_batch = 2", "mini_batch = 2\nentropy_coeff = 0.01", "train.train_policy.entropy_coeff = 0.01"),
    (R1_GRPO, "compile = false", "compile = false\nsequence_packing = true", "train.sequence_packing = True"),
    (R1_GRPO, "compile = false", "compile = false\noptm_decay_type = \"cosine\"", "--config.train.lr_schedule=cosine"),
    (R1_SFT, 'conversation_column_name = "conversations"', 'conversation_column_name = "messages"',
     "conversation_column_name = 'messages'"),
    (LLAVA, 'system_prompt = ""', 'system_prompt = ""\n\n[custom.vision]\nfps = 2',
     "custom.vision.fps = 2: wfm_jax sizes images and samples videos with the model directory's"),
    (R1_GRPO, 'type = "grpo"', 'type = "grpo"\ntrainer_type = "diffusion_nft"', "no wfm_jax trainer for a vision-language"),
    (R1_GRPO, "mini_batch = 2", "mini_batch = 2\nmini_btach = 2", "unknown cosmos-rl key 'train.train_policy.mini_btach'"),
])
def test_unsupported_keys_are_one_line_naming_the_key(tmp_path, capsys, src, old, new, fragment):
    path = _edit(tmp_path, src, old, new)
    with pytest.raises(ConfigError) as info:
        cfg.load_config(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    capsys.readouterr()
    assert wmain.main(["--config", path, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


def test_lora_gets_the_qwen3_vl_targets(tmp_path):
    c = cfg.load_config(_edit(tmp_path, LLAVA, "[logging]", "[policy.lora]\nr = 16\nlora_alpha = 32\n\n[logging]"))
    lora = c.policy.lora
    assert lora.enable and (lora.r, lora.lora_alpha) == (16, 32)
    assert tuple(lora.target_modules) == QWEN3_VL_LORA_TARGETS


def test_a_local_qwen3_vl_dir_is_a_vlm_recipe(tmp_path):
    model = tmp_path / "my_model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    path = _edit(tmp_path, LLAVA, '"nvidia/Cosmos-Reason2-2B"', json.dumps(str(model)))
    c = cfg.load_config(path)
    assert c.policy.family == "qwen3_vl" and c.policy.model_name_or_path == str(model)


def test_dry_run_names_the_text_rewards(capsys):
    assert wmain.main(["--config", R1_GRPO, "--dry-run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("would load: reward")]
    assert lines == ["would load: reward: built in, on the completions' text: single_choice x 1.0, format x 1.0"]


def test_use_remote_reward_sends_the_reward_function_to_the_service(tmp_path, capsys, monkeypatch):
    """use_remote_reward = true: the same names and weights, scored by the service (dry run says so)."""
    monkeypatch.setenv("REMOTE_REWARD_ENQUEUE_URL", "http://rewards.example:8080/api/reward/enqueue")
    path = _edit(tmp_path, R1_GRPO, "mini_batch = 2", "mini_batch = 2\nuse_remote_reward = true")
    c = cfg.load_config(path)
    tp = c.train.train_policy
    assert tp.use_remote_reward is True
    assert (tuple(tp.lm_grpo.rewards), tuple(tp.lm_grpo.reward_weights)) == (("single_choice", "format"), (1.0, 1.0))
    capsys.readouterr()
    assert wmain.main(["--config", path, "--dry-run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("would load: reward")]
    assert lines == ["would load: reward: remote service http://rewards.example:8080/api/reward/enqueue, "
                     "sent as text, on the completions' text: single_choice x 1.0, format x 1.0"]
