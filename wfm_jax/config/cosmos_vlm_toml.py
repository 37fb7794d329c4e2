"""cosmos-rl's vision-language recipes (Cosmos-Reason SFT and GRPO) -> wfm_jax's VLM keys.

cosmos_toml.read_recipe calls this part when `is_vlm_recipe` says the recipe's model is a
Qwen-VL / Cosmos-Reason one (specs/reason2.md §4.4). The keys the DiT import maps the same way
(optimizer, output dir, checkpointing, logging, parallelism) go through its MAPPED table; the keys
below either mean something else for a language model (kl_beta is lm_grpo's) or exist only
here. A value wfm_jax cannot train as cosmos-rl would
is one ConfigError naming the key and what to use instead.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from wfm_jax.config.base import ConfigError, Setter, to_key

# model ids (lower case) of cosmos-rl's vision-language recipes; Reason1 is Qwen2.5-VL
VLM_MODEL_IDS = ("cosmos-reason", "qwen2.5-vl", "qwen2_5_vl", "qwen3-vl", "qwen3_vl")
QWEN3_VL_TYPES = ("qwen3_vl",)
QWEN2_5_VL_IDS = ("cosmos-reason1", "qwen2.5-vl", "qwen2_5_vl")
LM = "train.train_policy.lm_grpo"
# keys kept whole when the tree is flattened (a table value, not a section)
WHOLE_KEYS = ("train.train_policy.reward_function",)


def _config_json_type(path: str) -> str | None:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return str(json.load(f).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return None


def is_vlm_recipe(tree: dict) -> bool:
    """A recipe whose policy model is a Qwen-VL / Cosmos-Reason one: a local dir whose
    config.json says qwen3_vl, or a published id naming one."""
    policy = tree.get("policy")
    name = str(policy.get("model_name_or_path", "")) if isinstance(policy, dict) else ""
    if name and os.path.isdir(name):
        return _config_json_type(name) in QWEN3_VL_TYPES
    return any(pattern in name.lower() for pattern in VLM_MODEL_IDS)


def _refuse_unless(ok: Callable[[Any], bool], key: str, instead: str) -> Setter:
    def check(value, out):
        if not ok(value):
            raise ConfigError(f"{key} = {value!r}: {instead}")
    return check


def _variant(value, out):
    """cosmos-rl's "grpo" (every group trained) and "dapo" (dynamic sampling: groups of equal
    filter rewards dropped, the step refilled); its "gspo" (sequence-level ratios) is not here."""
    if value not in ("grpo", "dapo"):
        raise ConfigError(f"train.train_policy.variant = {value!r}: wfm_jax's VLM GRPO runs cosmos-rl's "
                          f"'grpo' and 'dapo' variants; use one of them")
    out[f"{LM}.variant"] = str(value)


def _filter_reward_metric(value, out):
    """A name or a list of names (weight 1 each), as cosmos-rl's TOML gives them."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"train.train_policy.filter_reward_metric = {value!r}: give a reward name "
                          f"or a list of them")
    out[f"{LM}.filter_reward_metric"] = tuple(names)


def _reward_function(value, out):
    """cosmos-rl's reward_function: a list of names (weight 1 each) or a table name = weight."""
    key = "train.train_policy.reward_function"
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, str)):
        pairs = [(name, 1.0) for name in ([value] if isinstance(value, str) else value)]
    else:
        pairs = []
    if not pairs or not all(isinstance(n, str) for n, _ in pairs):
        raise ConfigError(f"{key} = {value!r}: give a list of reward names or a table name = weight")
    from reward_client.catalog import available_rewards, get_reward
    text = [n for n in available_rewards() if get_reward(n).media == "text"]
    for name, _ in pairs:
        if name not in text:
            raise ConfigError(f"{key}: no text reward {name!r} in wfm_jax; its text rewards are "
                              f"{text} (reward_client/reason.py); register one with "
                              f"reward_client.registry.register_reward(..., media=\"text\")")
    out[f"{LM}.rewards"] = tuple(n for n, _ in pairs)
    out[f"{LM}.reward_weights"] = tuple(float(w) for _, w in pairs)


def _lr(value, out):
    # older recipes give one lr per optimizer (vision tower, language model) as a list
    values = value if isinstance(value, list) else [value]
    if len(set(values)) != 1:
        raise ConfigError(f"train.optm_lr = {value!r}: wfm_jax trains with one learning rate; give one")
    out["train.optm_lr"] = float(values[0])


def _decay(value, out):
    if value not in (None, "none", "None", ""):
        raise ConfigError(f"train.optm_decay_type = {value!r}: cosmos-rl's decay schedules are not "
                          f"here; leave it out (constant after warm-up) or use "
                          f"--config.train.lr_schedule=cosine (wfm_jax's cosine to 0)")


def _column(value, out):
    if value != "conversations":
        raise ConfigError(f"train.train_policy.conversation_column_name = {value!r}: wfm_jax reads "
                          f"each LLaVA record's 'conversations' list; rename the field in the data")


def _vision(key: str) -> Setter:
    def refuse(value, out):
        raise ConfigError(f"{key} = {value!r}: wfm_jax sizes images and samples videos with the "
                          f"model directory's preprocessor_config.json / "
                          f"video_preprocessor_config.json; remove the key and set it there")
    return refuse


_SAME = ("epsilon_low", "epsilon_high", "lower_bound_ratio", "kl_beta", "unbiased_kl_estimate",
         "loss_type", "unbiased_loss_max_tokens", "unbiased_advantage", "temperature",
         "min_filter_prefix_tokens")
_NO_KNOB = "wfm_jax's VLM GRPO has no such setting (docs/reason2_post_training.md); leave it out"

VLM_MAPPED: dict[str, Setter] = {
    "policy.model_max_length": to_key("policy.vlm.model_max_length", int),
    "train.optm_lr": _lr,
    "train.optm_decay_type": _decay,
    "train.sequence_packing": _refuse_unless(
        lambda v: not v, "train.sequence_packing",
        "wfm_jax does not pack sequences (it batches conversations of similar length); set it false"),
    "train.train_policy.system_prompt": to_key("policy.vlm.system_prompt", str),
    "train.train_policy.conversation_column_name": _column,
    "train.train_policy.reward_function": _reward_function,
    "train.train_policy.variant": _variant,
    "train.train_policy.filter_reward_metric": _filter_reward_metric,
    "train.train_policy.max_retry_for_on_policy": to_key(f"{LM}.max_retry_for_on_policy", int),
    # true: reward_function's names and weights are scored by the reward service (media_type
    # "text"; train/vlm_rewards.py), URLs and token from REMOTE_REWARD_* or remote_reward.*
    "train.train_policy.use_remote_reward": to_key("train.train_policy.use_remote_reward", bool),
    "train.train_policy.overlong_reward.enable_overlong_penalty": _refuse_unless(
        lambda v: not v, "train.train_policy.overlong_reward.enable_overlong_penalty",
        "the DAPO overlong penalty is not here; set false"),
    "train.train_policy.balance_dp_token": _refuse_unless(
        lambda v: not v, "train.train_policy.balance_dp_token",
        "the VLM GRPO loss averages tokens per mini-batch over the whole batch; set false"),
    "rollout.max_response_length": to_key(f"{LM}.max_response_length", int),
    "rollout.batch_size": to_key("rollout.batch_size", int),
    "rollout.sampling_config.temperature": to_key(f"{LM}.sampling_temperature", float),
    "rollout.sampling_config.top_p": to_key(f"{LM}.top_p", float),
    "rollout.sampling_config.top_k": to_key(f"{LM}.top_k", int),
    "rollout.sampling_config.repetition_penalty": _refuse_unless(
        lambda v: v == 1.0, "rollout.sampling_config.repetition_penalty",
        "wfm_jax's sampler has no repetition penalty; set 1.0 (or leave it out)"),
    "custom.dataset.annotation_path": to_key("train.train_policy.dataset.local_dir", str),
    "custom.dataset.media_path": to_key("policy.vlm.media_root", str),
    "custom.dataset.system_prompt": to_key("policy.vlm.system_prompt", str),
    "custom.dataset.path": lambda value, out: None,  # an Arrow dir: vlm_notes says what to give
}
for _key in _SAME:
    VLM_MAPPED[f"train.train_policy.{_key}"] = to_key(f"{LM}.{_key}")
# cosmos-rl defaults that change the loss: non-default values are refused (0 / None / False)
for _key in ("entropy_coeff", "positive_nll_coef", "aipo_rho", "off_policy_masking_delta",
             "use_decoupled_loss"):
    VLM_MAPPED[f"train.train_policy.{_key}"] = _refuse_unless(
        lambda v: v in (None, 0, 0.0, False), f"train.train_policy.{_key}", _NO_KNOB)
# ignored for a language model: DiT-only clips, or a setting of cosmos-rl's own sampler
VLM_IGNORED = ("train.train_policy.advantage_low", "train.train_policy.advantage_high",
               "rollout.sampling_config.use_flashinfer")


def vlm_setter(key: str) -> Setter | None:
    """The setter for a VLM recipe key, or None when the shared (DiT) table decides."""
    if key in VLM_MAPPED:
        return VLM_MAPPED[key]
    if key.startswith("custom.vision."):
        return _vision(key)
    return None


# cosmos-rl's defaults (TrainingConfig, GrpoConfig, RolloutConfig) where wfm_jax's differ
VLM_DEFAULTS: dict[str, Any] = {
    "policy.family": "qwen3_vl",
    "train.train_policy.dataset.layout": "conversations",
    # policy.model_gradient_checkpointing = true (PolicyConfig's default): every block recomputed
    "policy.remat": "nothing_saveable",
    "train.optm_lr": 1e-6,
    "train.optm_weight_decay": 0.01,
    "train.optm_eps": 1e-6,
    "train.optm_warmup_steps": 20,
    "train.param_dtype": "float32",
    "train.compute_dtype": "bfloat16",
    "train.log_freq": 100,
    "train.epoch": 1,  # the run's passes over the data (capped by max_num_steps): run_length.py
    "train.train_policy.mini_batch": 2,
    "rollout.n_generation": 16,
    f"{LM}.max_response_length": 2048,
    f"{LM}.sampling_temperature": 1.0,  # rollout.sampling_config.temperature
    f"{LM}.rewards": ("single_choice",),  # GrpoConfig.reward_function = {single_choice: 1.0}
    f"{LM}.reward_weights": (1.0,),
}


def vlm_trainer(flat: dict, source: str) -> str:
    kind = flat.get("train.train_policy.type", "grpo")  # cosmos-rl's default type
    trainer = flat.get("train.train_policy.trainer_type")
    if (kind, trainer) in (("sft", None), ("sft", "sft"), ("grpo", None), ("grpo", "grpo")):
        return str(kind)
    raise ConfigError(f"{source}: train.train_policy.type = {kind!r} with trainer_type = {trainer!r} "
                      f"has no wfm_jax trainer for a vision-language model; supported: sft, grpo")


def vlm_notes(flat: dict, out: dict) -> list[str]:
    """One line each for what the recipe means that a run here does differently or needs."""
    notes = []
    name = str(flat.get("policy.model_name_or_path", ""))
    if any(p in name.lower() for p in QWEN2_5_VL_IDS):
        notes.append(f"note: {name} is a Qwen2.5-VL model; wfm_jax trains Qwen3-VL (Cosmos-Reason2): "
                     f"give a local Qwen3-VL dir with --config.policy.model_name_or_path=DIR")
    hub = flat.get("train.train_policy.dataset.name") or flat.get("custom.dataset.path")
    if hub and "train.train_policy.dataset.local_dir" not in out:
        notes.append(f"note: dataset {hub!r} is a Hugging Face dataset, which wfm_jax does not read; "
                     f"give LLaVA JSON (or WebDataset tars) with "
                     f"--config.train.train_policy.dataset.local_dir=PATH")
    lm_t = out.get(f"{LM}.temperature", 1.0)
    sample_t = out.get(f"{LM}.sampling_temperature", 1.0)
    if out.get("train.train_policy.type") == "grpo" and lm_t != sample_t:
        notes.append(f"note: train.train_policy.temperature = {lm_t} scales the policy's logits in the "
                     f"loss while rollouts sample at {sample_t} (rollout.sampling_config.temperature), "
                     f"as in cosmos-rl; --config.{LM}.sampling_temperature={lm_t} makes them agree")
    return notes
