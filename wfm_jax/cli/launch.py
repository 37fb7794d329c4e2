"""cosmos-rl launcher flags on the training CLI, and `--dry-run`.

    python -m wfm_jax.main --config RECIPE.toml --dry-run
    python -m wfm_jax.main --config RECIPE.toml --wfm-mode cosmos_rl.tools.dataset.wfm_rl

cosmos-rl's launcher takes `--wfm-mode` as a flag that selects its world-model stack and the
launcher script as a positional module (`cosmos_rl.tools.dataset.wfm_rl` for the native
Cosmos-Predict2.5 recipes, `...diffusers_dataset` / `...diffusion_nft` for the diffusers ones;
spec cosmos_rl_wfm.md §9). wfm_jax reads the stack from the recipe itself, so both are checked
against it (a mismatch is one line) and otherwise change nothing.

`--dry-run` resolves the recipe, prints the resolved config (secrets masked) and what a run
would load — model, data, rewards — without reading weights or data, and exits 0.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

from wfm_jax.config.base import ConfigError
from wfm_jax.config.schema import VLM_FAMILIES

WFM_MODULES = ("cosmos_rl.tools.dataset.wfm_rl",)
DIFFUSERS_MODULES = ("cosmos_rl.tools.dataset.diffusers_dataset", "cosmos_rl.tools.dataset.diffusion_nft")


def split_launcher_args(argv: Sequence[str]) -> tuple[list[str], bool, bool, str | None]:
    """(config argv, dry_run, wfm_mode, launcher module) from the command line."""
    rest, dry_run, wfm_mode, module = [], False, False, None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--dry-run":
            dry_run = True
        elif arg == "--wfm-mode" or arg.startswith("--wfm-mode="):
            wfm_mode = True
            if "=" in arg:
                module = arg.split("=", 1)[1]
        elif not arg.startswith("-") and (i == 0 or not _takes_value(args[i - 1])):
            if module is not None:
                raise ConfigError(f"unexpected argument '{arg}' (a launcher module is already "
                                  f"given: {module})")
            module = arg
        else:
            rest.append(arg)
        i += 1
    return rest, dry_run, wfm_mode, module


def _takes_value(flag: str) -> bool:
    """`--config PATH` / `--config.a.b VALUE`: the next argument is that flag's value."""
    return flag.startswith("--config") and "=" not in flag


def _module_name(module: str) -> str:
    name = module[:-3] if module.endswith(".py") else module
    return name.replace(os.sep, ".").lstrip(".")


def check_launcher(config_path: str | None, wfm_mode: bool, module: str | None) -> None:
    """cosmos-rl's --wfm-mode / launcher module must fit the recipe's stack (one line if not)."""
    if not (wfm_mode or module):
        return
    wfm = _is_wfm_file(config_path)
    name = _module_name(module) if module else None
    known = WFM_MODULES + DIFFUSERS_MODULES
    if name is not None and name not in known:
        raise ConfigError(f"launcher module {module!r} is not one of cosmos-rl's diffusion "
                          f"launchers {list(known)}")
    if wfm_mode and not wfm:
        raise ConfigError(f"--wfm-mode selects cosmos-rl's world-model stack, but {config_path} is "
                          f"not a world-model recipe ([model] / [trainer]); drop --wfm-mode")
    if name is not None and (name in WFM_MODULES) != wfm:
        want = WFM_MODULES[0] if wfm else DIFFUSERS_MODULES[0]
        raise ConfigError(f"launcher module {name} does not run {config_path}; cosmos-rl runs "
                          f"it with {want}{' --wfm-mode' if wfm else ''}")
    if wfm and name is None:
        raise ConfigError(f"--wfm-mode needs the launcher module, as cosmos-rl's: --wfm-mode "
                          f"{WFM_MODULES[0]}")


def _is_wfm_file(path: str | None) -> bool:
    if not path or not path.endswith(".toml"):
        return False
    import tomllib

    from wfm_jax.config.cosmos_wfm_toml import is_wfm_recipe
    try:
        with open(path, "rb") as f:
            return is_wfm_recipe(tomllib.load(f))
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the loader names the problem


def _where(path: str) -> str:
    return "present" if path and os.path.exists(path) else "not on this machine"


def would_load(config) -> list[str]:
    """What a run of `config` reads, one line each, touching nothing but the file system's
    listing."""
    p, tp = config.policy, config.train.train_policy
    d = p.diffusers
    lines = [f"trainer: {tp.type} on the {p.family} family; outputs in {config.train.output_dir}"]
    if p.build_tiny:
        lines.append(f"model: the tiny random {p.family} pipeline, built at {p.model_name_or_path}")
    elif p.model_name_or_path.endswith(".pt"):
        lines.append(f"model: {p.model_name_or_path} ({_where(p.model_name_or_path)}; a cosmos-rl "
                     f"native checkpoint: wfm_jax downloads nothing, so a hub file must be fetched "
                     f"and given as --config.policy.model_name_or_path=DIR of its diffusers pipeline)")
    else:
        lines.append(f"model: {p.model_name_or_path} ({_where(p.model_name_or_path)})")
    if tp.dataset.layout == "mock":
        frames = f"{d.train_frames} x " if d.is_video else ""
        lines.append(f"data: mock (wfm_jax.data.mock): random uint8 videos of {frames}"
                     f"{tuple(d.inference_size)} and random text embeddings of "
                     f"{d.max_prompt_length} x {tp.dataset.mock_text_dim} (the DiT's text width "
                     f"if it differs), {config.train.max_steps} iterations")
    elif tp.dataset.local_dir:
        build = " (tiny shapes data, built if absent)" if tp.dataset.build_tiny else ""
        lines.append(f"data: {tp.dataset.layout} layout at {tp.dataset.local_dir} "
                     f"({_where(tp.dataset.local_dir)}){build}")
    else:
        lines.append("data: none given (train.train_policy.dataset.local_dir is empty)")
    names = ", ".join(f"{f['name']} x {f.get('weight', 1.0)}" for f in tp.remote_reward.reward_fns)
    if tp.type == "sft":
        pass
    elif p.family in VLM_FAMILIES:  # text rewards (train.train_policy.lm_grpo), here or remote
        pairs = zip(tp.lm_grpo.rewards, tp.lm_grpo.reward_weights, strict=False)
        url = tp.remote_reward.enqueue_url or os.environ.get("REMOTE_REWARD_ENQUEUE_URL", "")
        where = (f"remote service {url or '(REMOTE_REWARD_ENQUEUE_URL unset)'}, sent as text"
                 if tp.use_remote_reward else "built in")
        lines.append(f"reward: {where}, on the completions' text: "
                     + ", ".join(f"{n} x {w}" for n, w in pairs))
    elif tp.use_remote_reward:
        url = tp.remote_reward.enqueue_url or os.environ.get("REMOTE_REWARD_ENQUEUE_URL", "")
        lines.append(f"reward: remote service {url or '(REMOTE_REWARD_ENQUEUE_URL unset)'}: {names}; "
                     f"sent as {tp.remote_reward.media_type}")
    else:
        lines.append(f"reward: built in, computed here: {names}")
    if config.validation.enable:
        val = config.validation.dataset
        source = val.local_dir or f"{val.holdout_fraction} held out"
        lines.append(f"validation: every {config.validation.freq} steps on {source}")
    return lines


def dry_run(config) -> int:
    from wfm_jax.config.base import redacted, to_plain
    print(json.dumps(redacted(to_plain(config)), indent=2))
    for line in would_load(config):
        print(f"would load: {line}")
    return 0
