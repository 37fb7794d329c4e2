"""cosmos-rl TOML recipes -> a wfm_jax config tree.

    python -m wfm_jax.main --config recipe.toml [--config.a.b=v ...]   (overrides: wfm_jax keys)

`read_recipe(path)` returns ({wfm_jax dotted key: value}, [ignored cosmos-rl keys]). Three
tables drive it:
- KNOWN: every key cosmos-rl's config classes define, per section (read from cosmos-rl's
  `cosmos_rl/policy/config`), so a key cosmos-rl does not have is an error naming the nearest
  key it does have. Sections in OPAQUE are cosmos-rl features with no wfm_jax counterpart
  (LLM sampling, profiler, distillation, VLA) and are ignored whole.
- MAPPED: cosmos-rl key -> wfm_jax key (same meaning), or a function for the few that convert.
  A known key that is not mapped means nothing in JAX (redis, optm_impl, fsdp_offload, ...): it
  is accepted and listed once as ignored.
- COSMOS_DEFAULTS: cosmos-rl's own default where it differs from wfm_jax's, for mapped keys a
  recipe leaves out, so the recipe means what it meant in cosmos-rl.
"""
from __future__ import annotations

import difflib
import os
import sys
from typing import Any

import tomllib

from wfm_jax.config.base import ConfigError, Setter, to_key
from wfm_jax.config.cosmos_vlm_toml import (
    VLM_DEFAULTS,
    VLM_IGNORED,
    WHOLE_KEYS,
    is_vlm_recipe,
    vlm_notes,
    vlm_setter,
    vlm_trainer,
)
from wfm_jax.config.cosmos_wfm_toml import is_wfm_recipe, read_wfm_recipe

_PARALLELISM = ("n_init_replicas tp_size cp_size ep_size dp_shard_size pp_size pp_dynamic_shape "
                "pp_micro_batch_size dp_replicate_size pp_schedule pp_layers_per_stage "
                "cp_rotate_method")  # cp_rotate_method: older recipes (Cosmos-Reason1)
_DATASET = "name subset revision split test_size local_dir"
# reward_fns: [[...]] tables; older cosmos-rl recipes write score_key + a reward_fn {name = weight}
_REMOTE_REWARD = "scale reward_fns reward_fn score_key reward_clip_min reward_clip_max batch_size"

KNOWN = {k: frozenset(v.split()) for k, v in {
    "": "custom train rollout policy logging profiler validation distillation vla redis eth_ips mode",
    "policy": ("parallelism diffusers is_diffusers model_name_or_path model_safetensor_path "
               "model_revision model_max_length model_gradient_checkpointing lora trainable_map "
               "freeze_pattern trainable_pattern enable_liger_kernel enable_liger_cross_entropy "
               "enable_liger_fused_cross_entropy aux_loss_coeff"),
    "policy.parallelism": _PARALLELISM,
    "policy.lora": ("r lora_names lora_path lora_alpha lora_dropout target_modules primary_adapter "
                    "use_rslora modules_to_save alpha_pattern r_pattern init_lora_weights"),
    "policy.diffusers": ("dtype main_dtype training_dtype is_video max_prompt_length "
                         "weighting_scheme train_flow_shift offload "
                         "logit_mean logit_std inference_size inference_frames train_frames "
                         "timesteps_fraction nft_beta weight_copy_decay_type lora sample tokenizer"),
    "policy.diffusers.sample": ("num_steps eval_num_steps guidance_scale global_std noise_level "
                                "deterministic_sampling solver"),
    "policy.diffusers.tokenizer": "chunk_duration load_mean_std compile_encode temporal_window",
    "train": ("train_policy optm_name optm_lr optm_impl optm_weight_decay optm_betas "
              "optm_warmup_steps optm_warmup_start_factor optm_decay_ratio optm_decay_type "
              "optm_min_lr_factor optm_grad_norm_clip ema_enable ema_decay ema_update_step_interval "
              "master_dtype param_dtype transfer_dtype logprob_dtype fsdp_reduce_dtype fsdp_offload "
              "fsdp_reshard_after_forward train_batch_per_replica fp8 fp4 ckpt resume epoch "
              "output_dir timestamp epsilon async_tp_enabled compile sync_weight_interval "
              "coalesce_weight_sync deterministic activation_offload fa_version seed local_dataset "
              "force_use_hf non_text max_num_steps sequence_packing save_ckpt_at_exit "
              "signal_to_handle "
              # older cosmos-rl (the Cosmos-Reason1 recipes): SFT validation on a held-out split
              "enable_validation validation_step validation_batch_per_replica"),
    # GrpoConfig and SFTDataConfig share this section
    "train.train_policy": (
        "type trainer_type variant dataset dataloader_shuffle dataloader_seed "
        "data_dispatch_as_rank_in_mesh enable_dataset_cache dataloader_num_workers "
        "dataloader_prefetch_factor dataloader_batch_size prompt_column_name response_column_name "
        "reward_function use_remote_reward remote_reward filter_reward_metric bypass_reward "
        "group_reward_calculation temperature epsilon_low epsilon_high advantage_low advantage_high "
        "positive_nll_coef lower_bound_ratio loss_type unbiased_loss_max_tokens unbiased_advantage "
        "algo overlong_reward kl_beta unbiased_kl_estimate off_policy_masking_delta aipo_rho "
        "mu_iterations mini_batch batch_size_per_optimize max_token_len_per_mini_batch "
        "entropy_coeff allowed_outdated_steps on_policy uncentralized_training "
        "outdated_rollout_fetch_batch_size max_inflight_steps min_filter_prefix_tokens "
        "max_retry_for_on_policy reference_reset_interval reset_optimizer_with_reference "
        "balance_dp_token use_decoupled_loss behav_imp_weight_cap rollout_as_token_ids "
        "collect_rollout_logprobs use_rollout_logprobs_for_loss dataloader_drop_last "
        "conversation_column_name system_prompt enable_dp_load_balancing load_balanced_pool_size "
        "load_balanced_max_tokens_for_batch load_balanced_batching_strategy "
        "load_balanced_batches_per_optimizer_step dataloader_broadcast"),
    "train.train_policy.dataset": _DATASET,
    "train.train_policy.remote_reward": _REMOTE_REWARD,
    "train.ckpt": ("enable_checkpoint save_freq save_freq_in_epoch save_mode max_keep "
                   "export_safetensors upload_hf hf_repo_name upload_s3 s3_bucket s3_prefix"),
    "rollout": ("parallelism enforce_eager include_stop_str_in_output gpu_memory_utilization "
                "enable_chunked_prefill max_response_length n_generation n_generation_to_batch "
                "n_generation_mini_batch batch_size quantization seed sampling_config "
                "vllm_use_flashinfer backend multi_turn_config mode async_config async_r2r_sync "
                "prefetch_rollout prefetch_queue_maxsize broadcast_all_params"),
    "rollout.parallelism": _PARALLELISM,
    "validation": ("enable val_before_train freq batch_size dataset temperature top_p top_k "
                   "repetition_penalty n_generation max_response_length reward_function "
                   "use_remote_reward remote_reward"),
    "validation.dataset": _DATASET,
    "validation.remote_reward": _REMOTE_REWARD,
    "logging": ("logger log_interval multi_modal_log_interval project_name group_name "
                "experiment_name report_mfu"),
}.items()}
REWARD_FN_KEYS = ("name", "weight", "score_key", "clip_min", "clip_max")
OPAQUE = ("custom", "profiler", "distillation", "vla", "train.fp8", "train.fp4",
          "rollout.sampling_config", "rollout.multi_turn_config", "rollout.async_config",
          "policy.diffusers.lora")


def _experiment_name(value, out):
    out["train.wandb.name"] = "" if value in (None, "None") else str(value)


def _loggers(value, out):
    out["train.wandb.enable"] = "wandb" in [str(v).lower() for v in value]


def _optimizer(value, out):
    if str(value).lower() != "adamw":
        raise ConfigError(f"train.optm_name = {value!r}: wfm_jax trains with AdamW only")


def _lora_init(value, out):
    # peft: true = its default init (A kaiming-uniform, B = 0), "gaussian" = A normal, B = 0;
    # false (random B, a non-identity start meant for debugging) has no wfm_jax counterpart
    if value is True or value == "gaussian":
        out["policy.lora.init_lora_weights"] = "default" if value is True else "gaussian"
        return
    raise ConfigError(f"policy.lora.init_lora_weights = {value!r}: wfm_jax takes true or \"gaussian\"")


def _checkpointing(value, out):
    out["policy.remat"] = "nothing_saveable" if value else "everything_saveable"


MAPPED: dict[str, Setter] = {
    "policy.model_name_or_path": to_key("policy.model_name_or_path"),
    "policy.model_gradient_checkpointing": _checkpointing,
    # dp_shard_size x dp_replicate_size devices; an unset replicate size takes what is left
    "policy.parallelism.dp_shard_size": to_key("policy.parallelism.fsdp"),
    "policy.parallelism.dp_replicate_size": to_key("policy.parallelism.data"),
    "policy.parallelism.cp_size": to_key("policy.parallelism.context"),
    "policy.lora.r": to_key("policy.lora.r"),
    "policy.lora.lora_alpha": to_key("policy.lora.lora_alpha"),
    "policy.lora.init_lora_weights": _lora_init,
    "policy.lora.target_modules": to_key("policy.lora.target_modules", tuple),
    "policy.diffusers.timesteps_fraction": to_key("train.train_policy.timesteps_fraction"),
    "train.optm_name": _optimizer,
    "train.epsilon": to_key("train.optm_eps"),
    "train.max_num_steps": to_key("train.max_steps"),
    "train.train_policy.remote_reward.reward_fns": None,  # _reward_fns, with its own key checks
    "train.train_policy.remote_reward.reward_fn": None,  # {name: weight}, older recipes
    "logging.logger": _loggers,
    "logging.project_name": to_key("train.wandb.project"),
    "logging.experiment_name": _experiment_name,
    "logging.log_interval": to_key("train.log_freq"),
}
for _key in ["is_video", "max_prompt_length", "inference_size", "train_frames", "inference_frames",
             "weighting_scheme", "logit_mean", "logit_std", "nft_beta", "weight_copy_decay_type"]:
    MAPPED[f"policy.diffusers.{_key}"] = to_key(f"policy.diffusers.{_key}")
for _key in ["num_steps", "eval_num_steps", "guidance_scale", "noise_level", "deterministic_sampling", "solver"]:
    MAPPED[f"policy.diffusers.sample.{_key}"] = to_key(f"policy.diffusers.sample.{_key}")
for _key in ["output_dir", "resume", "epoch", "seed", "train_batch_per_replica", "optm_lr",
             "optm_weight_decay", "optm_betas", "optm_grad_norm_clip", "optm_warmup_steps", "ema_enable",
             "ema_decay", "ema_update_step_interval"]:
    MAPPED[f"train.{_key}"] = to_key(f"train.{_key}")
# cosmos-rl: master_dtype = the weights the optimizer updates (float32), param_dtype = the
# forward/backward dtype (bfloat16); wfm_jax calls them param_dtype and compute_dtype
MAPPED["train.master_dtype"] = to_key("train.param_dtype")
MAPPED["train.param_dtype"] = to_key("train.compute_dtype")
for _key in ["mini_batch", "mu_iterations", "batch_size_per_optimize", "kl_beta", "advantage_low",
             "advantage_high", "use_remote_reward"]:
    MAPPED[f"train.train_policy.{_key}"] = to_key(f"train.train_policy.{_key}")
def _upload_s3(value, out):
    # cosmos-rl: False | "final" | "all"
    out["train.ckpt.upload_s3"] = "" if value in (False, None, "") else value


MAPPED["train.ckpt.upload_s3"] = _upload_s3
for _key in ["save_freq", "save_mode", "max_keep", "export_safetensors", "s3_bucket", "s3_prefix"]:
    MAPPED[f"train.ckpt.{_key}"] = to_key(f"train.ckpt.{_key}")
for _key in ["enable", "val_before_train", "freq", "batch_size"]:
    MAPPED[f"validation.{_key}"] = to_key(f"validation.{_key}")
MAPPED["train.train_policy.dataset.local_dir"] = to_key("train.train_policy.dataset.local_dir")
MAPPED["validation.dataset.local_dir"] = to_key("validation.dataset.local_dir")
MAPPED["train.train_policy.remote_reward.scale"] = to_key("train.train_policy.remote_reward.scale")
MAPPED["rollout.n_generation"] = to_key("rollout.n_generation")
# handled together below: the trainer from (type, trainer_type), the total clip from both ends
JOINT = ("train.train_policy.type", "train.train_policy.trainer_type",
         "train.train_policy.remote_reward.score_key",
         "train.train_policy.remote_reward.reward_clip_min",
         "train.train_policy.remote_reward.reward_clip_max")

# cosmos-rl's defaults (its config classes) where they differ from wfm_jax's
COSMOS_DEFAULTS = {
    "policy.diffusers.max_prompt_length": 300,
    "policy.diffusers.inference_size": (1024, 1024),
    "policy.diffusers.train_frames": 41,
    "policy.diffusers.inference_frames": 41,
    "policy.diffusers.weight_copy_decay_type": 0,
    "policy.diffusers.sample.num_steps": 40,
    "policy.diffusers.sample.guidance_scale": 4.5,
    "policy.diffusers.sample.noise_level": 1.0,
    "policy.diffusers.sample.deterministic_sampling": False,
    "train.train_policy.timesteps_fraction": 1.0,
    "train.train_policy.kl_beta": 0.0,
    "train.train_policy.mini_batch": 2,
    "train.optm_lr": 1e-6,
    "train.optm_weight_decay": 0.01,
    "train.optm_warmup_steps": 20,
    "train.optm_eps": 1e-6,
    "train.ema_decay": 0.9999,
    "rollout.n_generation": 16,
    "train.log_freq": 100,
    # a run lasts train.epoch passes (capped by max_num_steps when given): config/run_length.py
    "train.epoch": 1,
}
LORA_DEFAULTS = {"policy.lora.r": 8, "policy.lora.lora_alpha": 8.0,
                 "policy.lora.init_lora_weights": "default"}
TRAINERS = {("sft", None): "sft", ("sft", "sft"): "sft", ("sft", "diffusers_sft"): "sft",
            ("grpo", "diffusion_nft"): "nft"}
# cosmos-rl's NFT recipes misspell timesteps_fraction; pydantic drops the typo, so cosmos-rl
# trains on every rollout step (its default 1.0): read as that, with a warning (spec §9)
TYPO = "policy.diffusers.timestep_fraction"
POLICY_REFUSAL = ("{source}: cosmos-policy is a robot-policy evaluation on the LIBERO simulator "
                  "([vla] vla_type = {vla!r}), not diffusion post-training; use cosmos-rl for it")


def _flatten(node: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in MAPPED and path not in WHOLE_KEYS:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _check_known(path: str, source: str) -> bool:
    """True when `path` is a cosmos-rl key that wfm_jax ignores; False when it is mapped; a
    ConfigError naming the nearest cosmos-rl key when cosmos-rl does not have it either."""
    if path in MAPPED or path in JOINT:
        return False
    if any(path == o or path.startswith(o + ".") for o in OPAQUE):
        return True
    # walk down: the first component that is not a key of its section is the unknown one
    parts, here = path.split("."), ""
    for i, part in enumerate(parts):
        known = KNOWN.get(here)
        if known is None:
            break
        if part not in known:
            close = difflib.get_close_matches(part, sorted(known), n=1, cutoff=0.6)
            bad = ".".join(parts[: i + 1])
            hint = f"; did you mean '{close[0]}'?" if close else \
                f"; valid keys there: {', '.join(sorted(known))}"
            raise ConfigError(f"{source}: unknown cosmos-rl key '{bad}'{hint}")
        here = ".".join(parts[: i + 1])
    if here in KNOWN and here == path:
        raise ConfigError(f"{source}: '{path}' is a section in cosmos-rl, not a value")
    return True


def _reward_fns(value, source: str) -> list[dict]:
    where = "train.train_policy.remote_reward.reward_fns"
    if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
        raise ConfigError(f"{source}: '{where}' must be [[{where}]] tables")
    fns = []
    for i, entry in enumerate(value):
        for key in entry:
            if key not in REWARD_FN_KEYS:
                close = difflib.get_close_matches(key, REWARD_FN_KEYS, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; valid: {list(REWARD_FN_KEYS)}"
                raise ConfigError(f"{source}: unknown cosmos-rl key '{where}[{i}].{key}'{hint}")
        if "name" not in entry:
            raise ConfigError(f"{source}: '{where}[{i}]' needs a 'name'")
        fn = {"name": entry["name"], "weight": float(entry.get("weight", 1.0)),
              "score_key": entry.get("score_key") or ""}
        fn.update({k: float(entry[k]) for k in ("clip_min", "clip_max") if k in entry})
        fns.append(fn)
    return fns


# cosmos-rl's published model ids -> wfm_jax family (most specific first); a local dir is read
# from its model_index.json instead, as cosmos-rl chooses its pipeline class
MODEL_ID_FAMILIES = (("sana-video", "sana_video"), ("sana_video", "sana_video"), ("sana", "sana"),
                     ("cosmos-predict2.5", "cosmos"), ("wan2.1", "wan"),
                     ("stable-diffusion-3", "sd3"))


def model_family(name: str, source: str) -> str | None:
    """The wfm_jax family (policy.family) of a cosmos-rl model_name_or_path, or None (the
    default) when neither a local pipeline dir nor a known model id says."""
    if os.path.isdir(name):
        from wfm_jax.families.base import PipelineError, family_class
        try:
            return family_class(name).family
        except PipelineError as exc:
            raise ConfigError(f"{source}: policy.model_name_or_path: {exc}") from None
    lowered = name.lower()
    return next((family for pattern, family in MODEL_ID_FAMILIES if pattern in lowered), None)


def _joint(flat: dict, source: str, out: dict) -> None:
    family = model_family(str(flat.get("policy.model_name_or_path", "")), source)
    if family is not None:
        out["policy.family"] = family
    kind = flat.get("train.train_policy.type")
    if kind is not None:
        trainer = flat.get("train.train_policy.trainer_type")
        mapped = TRAINERS.get((kind, trainer))
        if mapped is None:
            raise ConfigError(f"{source}: train.train_policy.type = {kind!r} with trainer_type = "
                              f"{trainer!r} has no wfm_jax trainer; supported: sft, and grpo "
                              f"with trainer_type = \"diffusion_nft\" (-> nft)")
        out["train.train_policy.type"] = mapped
    lo = flat.get("train.train_policy.remote_reward.reward_clip_min", -5.0)
    hi = flat.get("train.train_policy.remote_reward.reward_clip_max", 5.0)
    if lo != -hi or hi <= 0:
        raise ConfigError(f"{source}: reward_clip_min = {lo}, reward_clip_max = {hi}: wfm_jax clips "
                          f"the total reward symmetrically (remote_reward.clip); use -c and c")
    out["train.train_policy.remote_reward.clip"] = float(hi)
    if flat.get("train.train_policy.use_remote_reward"):
        # cosmos-rl's remote-reward advantages: per-prompt mean / per-prompt unbiased std
        out["train.train_policy.global_std"] = False
        out["train.train_policy.std_ddof"] = 1


def _reward_fn_table(table, score_key, source: str) -> list[dict]:
    """Older recipes: remote_reward.reward_fn = {name: weight} with one score_key for all."""
    where = "train.train_policy.remote_reward.reward_fn"
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{source}: '{where}' must be a table of reward name = weight")
    return [{"name": str(name), "weight": float(weight), "score_key": str(score_key or "")}
            for name, weight in table.items()]


def read_recipe(path: str, notes: list[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """A cosmos-rl TOML recipe -> ({wfm_jax dotted key: value}, [ignored cosmos-rl keys]).
    Warnings and notes (one line each) go to `notes`, or to stderr when it is None."""
    try:
        with open(path, "rb") as f:
            tree = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    said = [] if notes is None else notes
    try:
        return _read_tree(tree, path, said)
    finally:
        if notes is None:
            for line in said:
                print(line, file=sys.stderr)


def _read_tree(tree: dict, path: str, notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    vla = tree.get("vla")
    if isinstance(vla, dict):
        raise ConfigError(POLICY_REFUSAL.format(source=path, vla=vla.get("vla_type", "?")))
    if is_wfm_recipe(tree):
        out, wfm_notes = read_wfm_recipe(tree, path)
        notes.extend(f"note: {n}" for n in wfm_notes)
        return out, []
    if is_vlm_recipe(tree):
        return _read_vlm_tree(tree, path, notes)
    diffusers = tree.get("policy", {}).get("diffusers", {})
    if isinstance(diffusers, dict) and "timestep_fraction" in diffusers:
        typo = diffusers.pop("timestep_fraction")
        honoured = diffusers.get("timesteps_fraction", 1.0)
        notes.append(f"warning: {TYPO} = {typo} is cosmos-rl's misspelling of timesteps_fraction "
                     f"and was never applied there; training on {honoured} of the steps as "
                     f"cosmos-rl does (write timesteps_fraction to change it)")
    flat = _flatten(tree)
    out: dict[str, Any] = dict(COSMOS_DEFAULTS)
    _lora_switch(tree, out)
    ignored = []
    for key, value in flat.items():
        if _check_known(key, path):
            ignored.append(key)
        elif key == "train.train_policy.remote_reward.reward_fns":
            out[key] = _reward_fns(value, path)
        elif key == "train.train_policy.remote_reward.reward_fn":
            out["train.train_policy.remote_reward.reward_fns"] = _reward_fn_table(
                value, flat.get("train.train_policy.remote_reward.score_key"), path)
        elif key not in JOINT:
            try:
                MAPPED[key](value, out)
            except ConfigError as exc:
                raise ConfigError(f"{path}: {exc}") from None
    _joint(flat, path, out)
    return out, ignored


def _lora_switch(tree: dict, out: dict) -> None:
    if "lora" in tree.get("policy", {}):  # [policy.lora] present: LoRA, with cosmos-rl's defaults
        out.update(LORA_DEFAULTS, **{"policy.lora.enable": True})
    else:
        out["policy.lora.enable"] = False


def _read_vlm_tree(tree: dict, path: str, notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A Cosmos-Reason / Qwen-VL recipe: the VLM keys (cosmos_vlm_toml), else the shared ones."""
    from wfm_jax.config.schema import QWEN3_VL_LORA_TARGETS
    flat = _flatten(tree)
    out: dict[str, Any] = dict(VLM_DEFAULTS)
    _lora_switch(tree, out)
    if out["policy.lora.enable"]:
        out["policy.lora.target_modules"] = QWEN3_VL_LORA_TARGETS
    ignored = []
    for key, value in flat.items():
        setter = vlm_setter(key)
        if setter is None:
            if key in ("train.train_policy.type", "train.train_policy.trainer_type"):
                continue  # vlm_trainer below
            # remote_reward.* mean nothing here: a remote VLM run sends reward_function's names
            if key in VLM_IGNORED or key in JOINT or _check_known(key, path) or MAPPED[key] is None:
                ignored.append(key)
                continue
            setter = MAPPED[key]
        try:
            setter(value, out)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    out["train.train_policy.type"] = vlm_trainer(flat, path)
    notes.extend(vlm_notes(flat, out))
    return out, ignored


def ignored_note(ignored: list[str]) -> str:
    return ("note: cosmos-rl keys with no meaning in wfm_jax, ignored: " + ", ".join(ignored)) \
        if ignored else ""
