"""The cross-key checks every loaded config passes (wfm_jax.config.recipe.validate runs them; each
raises ConfigError with one line naming the key): allowed values, the family, ranges, the mesh,
reward functions, the RL samplers. The keys and their defaults are in wfm_jax.config.schema."""
from __future__ import annotations

import difflib

from wfm_jax.config.base import ConfigError, get, register_check
from wfm_jax.config.schema import CHOICES, REWARD_FN_KEYS, RL_TYPES, VLM_FAMILIES
from wfm_jax.config.targets import parse_target
from wfm_jax.families import FAMILIES


@register_check
def check_choices(config) -> None:
    for key, allowed in CHOICES.items():
        value = get(config, key)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"config key '{key}' = {value!r} is not one of {list(allowed)}{hint}")


def _required(config, key):
    value = get(config, key)
    if value is None:
        raise ConfigError(f"config key '{key}' must be set (it is None)")
    return value


def _positive(config, keys, allow_zero=False):
    for key in keys:
        value = _required(config, key)
        if value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"config key '{key}' must be {'>= 0' if allow_zero else '> 0'}, got {value}")


@register_check
def check_plan_target(config) -> None:
    if str(config.plan.target):
        parse_target(config.plan.target)


@register_check
def check_family(config) -> None:
    if config.policy.family in VLM_FAMILIES:
        layout = config.train.train_policy.dataset.layout
        if layout != "conversations":
            raise ConfigError(f"config key 'train.train_policy.dataset.layout' = {layout!r}: the "
                              f"{config.policy.family!r} family trains on 'conversations'")
        if config.train.train_policy.type not in ("sft", "grpo"):
            raise ConfigError(f"config key 'train.train_policy.type' = "
                              f"{config.train.train_policy.type!r}: the {config.policy.family!r} family "
                              f"has the 'sft' and 'grpo' trainers")
        return
    if config.policy.family not in FAMILIES:  # names only: imports no family
        hint = FAMILIES.closest(config.policy.family)
        raise ConfigError(f"config key 'policy.family' = {config.policy.family!r} is not one of "
                          f"{[*FAMILIES.names(), *VLM_FAMILIES]}" + (f"; did you mean {hint!r}?" if hint else ""))


@register_check
def check_conditional_frames(config) -> None:
    from wfm_jax.families.base import family_named
    d = "policy.diffusers"
    lo, hi = (int(_required(config, f"{d}.{k}_num_conditional_frames")) for k in ("min", "max"))
    if not 0 <= lo <= hi:
        raise ConfigError(f"config keys '{d}.min_num_conditional_frames' = {lo} and "
                          f"'{d}.max_num_conditional_frames' = {hi} need 0 <= min <= max")
    if hi == 0:
        return
    # every trainer reads the frames from the dataset's videos (SFT's clips; the RL algorithms'
    # data items, train_policy.dataset, as DDRL's data term: data.records.media_records)
    cls = family_named(config.policy.family)
    if not cls.supports_video_condition:
        raise ConfigError(f"config key '{d}.max_num_conditional_frames' = {hi}: the "
                          f"{config.policy.family!r} family cannot condition on video frames")


@register_check
def check_ranges(config) -> None:
    for key in ("train.max_steps", "train.epoch"):  # unset: the run length comes from the other / the data
        if get(config, key) is not None:
            _positive(config, [key])
    _positive(config, ["train.train_batch_per_replica",
                       "train.grad_accum_steps", "train.log_freq", "train.ckpt.save_freq",
                       "train.ckpt.max_keep", "train.train_policy.mini_batch",
                       "train.train_policy.mu_iterations", "rollout.n_generation",
                       "validation.batch_size", "validation.freq", "policy.lora.r",
                       "policy.diffusers.train_frames", "policy.diffusers.sample.num_steps",
                       "policy.diffusers.sample.eval_num_steps",
                       "train.train_policy.remote_reward.budget_s",
                       "train.train_policy.dataset.build_tiny_count"])
    _positive(config, ["train.train_policy.std_ddof", "train.train_policy.clip_range", "train.train_policy.data_beta",
                       "train.train_policy.loss_scale", "train.train_policy.update_ref_every_iter",
                       "policy.diffusers.sample.sde_window_size",
                       "policy.diffusers.sample.s_churn"], allow_zero=True)
    _positive(config, ["train.optm_lr", "train.optm_weight_decay", "train.optm_eps",
                       "train.optm_warmup_steps", "train.ema_update_step_interval",
                       "data.num_workers", "data.prefetch_buffer_size"], allow_zero=True)
    _positive(config, ["data.cycle_length"])
    if config.rollout.batch_size is not None:
        _positive(config, ["rollout.batch_size"])
    _positive(config, ["data.shuffle_window"], allow_zero=True)
    for key in ("train.ema_decay", "train.train_policy.timesteps_fraction",
                "validation.dataset.holdout_fraction", "policy.vlm.vqa_fixed_think_fraction"):
        if not 0.0 <= _required(config, key) <= 1.0:
            raise ConfigError(f"config key '{key}' must be in [0, 1], got {get(config, key)}")
    if get(config, "validation.dataset.holdout_fraction") >= 1.0:
        raise ConfigError("config key 'validation.dataset.holdout_fraction' must be < 1")
    betas = _required(config, "train.optm_betas")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"config key 'train.optm_betas' must be two numbers in [0, 1), got {betas}")
    size = _required(config, "policy.diffusers.inference_size")
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ConfigError(f"config key 'policy.diffusers.inference_size' must be (H, W) positive "
                          f"ints, got {size}")
    export_keep = get(config, "train.ckpt.export_max_keep")
    if export_keep is not None and export_keep < 0:
        raise ConfigError(f"config key 'train.ckpt.export_max_keep' must be >= 0 (0: keep every "
                          f"export; None: as train.ckpt.max_keep), got {export_keep}")
    if get(config, "train.ckpt.upload_s3") and not get(config, "train.ckpt.s3_bucket"):
        raise ConfigError("config key 'train.ckpt.upload_s3' is on but 'train.ckpt.s3_bucket' "
                          "is empty")
    per_optimize = get(config, "train.train_policy.batch_size_per_optimize")
    if per_optimize is not None and per_optimize <= 0:
        raise ConfigError(f"config key 'train.train_policy.batch_size_per_optimize' must be > 0 "
                          f"(or None: the whole batch), got {per_optimize}")
    low = _required(config, "train.train_policy.advantage_low")
    high = _required(config, "train.train_policy.advantage_high")
    if low > high:
        raise ConfigError(f"config keys 'train.train_policy.advantage_low' ({low}) > "
                          f"'advantage_high' ({high})")


MESH_AXES = ("data", "fsdp", "context")  # wfm_jax.core.mesh.MESH_AXES (no jax import here)


@register_check
def check_parallelism(config) -> None:
    """Mesh axis sizes: positive, or -1 on one axis (it takes the devices the others leave;
    whether they divide is checked when the mesh is built)."""
    sizes = {a: _required(config, f"policy.parallelism.{a}") for a in MESH_AXES}
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"config key 'policy.parallelism.{axis}' must be > 0 or -1 (all "
                              f"devices left over), got {size}")
    fill = [a for a, size in sizes.items() if size == -1]
    if len(fill) > 1:
        keys = " and ".join(f"'policy.parallelism.{a}'" for a in fill)
        raise ConfigError(f"config keys {keys} are all -1: only one mesh axis may take the "
                          f"devices left over; give the others a size, e.g. "
                          f"--config.policy.parallelism.{fill[0]}=1")


@register_check
def check_groups(config) -> None:
    """RL batches hold whole groups of n_generation samples of one prompt."""
    if get(config, "train.train_policy.type") not in RL_TYPES:
        return
    batch, group = get(config, "train.train_batch_per_replica"), get(config, "rollout.n_generation")
    if batch % group:
        raise ConfigError(f"train.train_batch_per_replica={batch} is not a multiple of "
                          f"rollout.n_generation={group}")
    if get(config, "train.ckpt.upload_s3") and not get(config, "train.ckpt.s3_bucket"):
        raise ConfigError("config key 'train.ckpt.upload_s3' is on but 'train.ckpt.s3_bucket' "
                          "is empty")
    per_optimize = get(config, "train.train_policy.batch_size_per_optimize")
    if per_optimize is not None and batch % per_optimize:
        raise ConfigError(f"train.train_batch_per_replica={batch} is not a multiple of "
                          f"train.train_policy.batch_size_per_optimize={per_optimize}")


@register_check
def check_reward_fns(config) -> None:
    for i, fn in enumerate(get(config, "train.train_policy.remote_reward.reward_fns") or ()):
        where = f"train.train_policy.remote_reward.reward_fns[{i}]"
        if not isinstance(fn, dict):
            raise ConfigError(f"config key '{where}' must be a dict with a non-empty 'name'")
        for key in fn:  # before the name check: a misspelt 'name' gets its hint too
            if key not in REWARD_FN_KEYS:
                close = difflib.get_close_matches(key, REWARD_FN_KEYS, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f"; valid: {list(REWARD_FN_KEYS)}"
                raise ConfigError(f"unknown key '{where}.{key}'{hint}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConfigError(f"config key '{where}' must be a dict with a non-empty 'name'")


GRPO_SOLVERS = ("flow", "sde", "cps", "dance")  # "flow" = the Flow-GRPO SDE
# NFT rolls out with a deterministic sampler; "flow", "ddim" and "dpm1" are the Euler step (DDIM
# with eta 0 and first-order DPM-Solver both reduce to it on a flow-matching model)
NFT_SOLVERS = ("flow", "euler", "ddim", "dpm1", "dpm2", "unipc", "dpm_solver")


@register_check
def check_rl_samplers(config) -> None:
    """DiffusionNFT needs a deterministic sampler; Flow-GRPO a stochastic flow sampler and a
    window inside the steps; DDRL samples with the EDM sampler and trains on existing steps."""
    kind = get(config, "train.train_policy.type")
    if get(config, "policy.family") in VLM_FAMILIES:  # samples text (train.train_policy.lm_grpo)
        return
    s = "policy.diffusers.sample"
    solver, steps = get(config, f"{s}.solver"), get(config, f"{s}.num_steps")
    if kind == "nft" and solver not in NFT_SOLVERS:
        raise ConfigError(f"config key '{s}.solver' = {solver!r}: DiffusionNFT rolls out with a "
                          f"deterministic sampler, one of {list(NFT_SOLVERS)}")
    if kind == "grpo":
        if solver not in GRPO_SOLVERS:
            raise ConfigError(f"config key '{s}.solver' = {solver!r}: Flow-GRPO samples with one "
                              f"of {list(GRPO_SOLVERS)}")
        size, window = get(config, f"{s}.sde_window_size"), get(config, f"{s}.sde_window_range")
        if size and (len(window) != 2 or not 0 <= window[0] <= window[1] - size
                     or window[1] > steps):
            raise ConfigError(f"config key '{s}.sde_window_range' = {tuple(window)} must hold a "
                              f"window of sde_window_size={size} inside num_steps={steps}")
    if kind == "ddrl":
        if solver != "edm":
            raise ConfigError(f"config key '{s}.solver' = {solver!r}: DDRL samples with the EDM "
                              f"sampler, set it to 'edm'")
        train_on = [int(i) for i in get(config, "train.train_policy.train_on")]
        explicit = [i for i in train_on if i != -1]
        if (not train_on or len(set(explicit)) != len(explicit)
                or any(not 0 <= i < steps for i in explicit) or len(train_on) > steps):
            raise ConfigError(f"config key 'train.train_policy.train_on' = {tuple(train_on)} must "
                              f"list distinct steps in [0, {steps}) ({s}.num_steps) or -1 (a "
                              f"random other step), at most {steps} entries")
