"""The training entry point.

    python -m wfm_jax.main --config configs/X.py [--config.a.b=value ...]
    python -m wfm_jax.main --config recipe.toml [--wfm-mode cosmos_rl.tools.dataset.wfm_rl] [--dry-run]

Loads and validates the locked config (a resumed one is compared with the stored
output_dir/config.json: wfm_jax.config.resume), starts jax.distributed when the config /
environment asks for several processes, then runs the trainer for train.train_policy.type:
"sft" -> wfm_jax.train.sft, "nft" / "grpo" / "ddrl" -> wfm_jax.train.rl. The resolved config is
written to output_dir/config.json once the run has started (wfm_jax.train.setup.build). Every
known failure (bad config, missing model or data, corrupt sample, NaN loss, unusable checkpoint)
is one line on stderr and a non-zero exit, no traceback.
SIGTERM stops after the step in progress with a checkpoint (exit 143; wfm_jax.train.preempt).
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

EXIT_BAD_INPUT = 2      # the run could not start: config, model dir, data, checkpoint layout
EXIT_TRAINING_FAILED = 1  # it started and stopped: NaN/inf loss, a bad sample mid-run, ...
EXIT_INTERRUPTED = 130
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a preempted job


def _known_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(bad-input errors, training-failure errors), imported lazily (jax is heavy). UserError
    and RunFailure cover every class derived from them (config, pipeline, data, LoRA,
    conversion, S3, reward errors); the train/ classes are listed until they derive too."""
    from reward_client.errors import RewardError
    from wfm_jax.core.errors import RunFailure, UserError
    from wfm_jax.train.checkpoint import CheckpointError
    from wfm_jax.train.metrics import NonFiniteLoss
    from wfm_jax.train.s3_sync import S3UploadError
    from wfm_jax.train.setup import SetupError
    bad_input = (UserError, SetupError, CheckpointError, FileNotFoundError)
    return bad_input, (RunFailure, NonFiniteLoss, RewardError, S3UploadError)


def train(config) -> int:
    """Dispatch on train.train_policy.type; returns the last step trained."""
    kind = config.train.train_policy.type
    from wfm_jax.config.schema import VLM_FAMILIES
    if config.policy.family in VLM_FAMILIES:  # the schema allows SFT and GRPO for these
        if kind == "grpo":
            from wfm_jax.train import vlm_grpo
            return vlm_grpo.run(config)
        from wfm_jax.train import vlm_sft
        return vlm_sft.run(config)
    if kind == "sft":
        from wfm_jax.train import sft
        return sft.run(config)
    from wfm_jax.train import rl  # the RL loop (nft / grpo / ddrl)
    return rl.run(config)


def prepare(argv: Sequence[str], held: contextlib.ExitStack | None = None):
    """Parse + validate the config (a resume against the stored one), start jax.distributed.
    With `held`, process 0 locks train.output_dir into it (released when `held` closes): a
    second run on the same folder is refused here, before any build or training."""
    from wfm_jax.config.recipe import config_from_argv
    from wfm_jax.config.resume import check_resumed_config
    from wfm_jax.train.s3_sync import fetch_resume_checkpoint
    from wfm_jax.train.setup import check_fresh_output, checkpoint_steps, init_distributed
    config = config_from_argv(argv)
    check_fresh_output(config)
    init_distributed(config)  # before anything touches a JAX backend
    if held is not None:
        hold_output_dir(config, held)
    fetch_resume_checkpoint(config)  # resume with nothing local: the newest S3 checkpoint
    if config.train.resume and checkpoint_steps(config):  # no checkpoint: nothing to keep true to
        check_resumed_config(config, os.path.join(config.train.output_dir, "config.json"))
    build_pretrained(config)
    return config


def hold_output_dir(config, held: contextlib.ExitStack) -> None:
    """Lock train.output_dir (a sibling lock file naming the owner's pid) for the run."""
    import jax

    from wfm_jax.io.lock import exclusive_lock
    if jax.process_index() != 0:  # one lock per run, not per process
        return
    out = os.path.abspath(config.train.output_dir)
    lock = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.lock")
    held.enter_context(exclusive_lock(lock, f"train.output_dir {out}"))


def build_pretrained(config) -> None:
    """policy.build_tiny_pretrained: build (or reuse the cached) shapes-world pipeline before
    training. Process 0 builds; every process waits for it."""
    path = config.policy.model_name_or_path
    if not (config.policy.build_tiny_pretrained and path):
        return
    import jax

    from wfm_jax.core.console import say
    from wfm_jax.train.preempt import sigterm_stops_after_step
    from wfm_jax.train.pretrain import ensure_pretrained
    if jax.process_index() == 0:  # checks the cache's marker: an incomplete one is rebuilt
        with sigterm_stops_after_step():  # SIGTERM: BuildStopped, the work kept for a rerun
            ensure_pretrained(path, log=say)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"build {path}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        from wfm_jax.cli.usage import usage_text
        print(usage_text(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else EXIT_BAD_INPUT
    from wfm_jax.core import xla_flags
    xla_flags.apply()  # before jax starts its backend
    try:
        bad_input, failed = _known_errors()
    except ImportError as e:  # a broken install: still one line
        print(f"error: cannot import wfm_jax: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    held = contextlib.ExitStack()  # the output dir's lock, for the whole run
    try:
        from wfm_jax.cli.launch import check_launcher, dry_run, split_launcher_args
        from wfm_jax.config.base import parse_overrides
        argv, dry, wfm_mode, module = split_launcher_args(argv)
        check_launcher(parse_overrides(argv)[0], wfm_mode, module)
        if dry:  # resolve and report only: no distributed start, weights, data or outputs
            from wfm_jax.config.recipe import config_from_argv
            return dry_run(config_from_argv(argv))
        config = prepare(argv, held)
        from wfm_jax.plan import check_fits
        check_fits(config)  # on accelerators: refuse what cannot fit before loading weights
        from wfm_jax.train.preempt import sigterm_stops_after_step
        with sigterm_stops_after_step():
            step = train(config)
        from wfm_jax.core.mesh import shutdown_distributed
        shutdown_distributed()  # every process has finished the same steps: leave together
    except bad_input as e:
        if isinstance(e, FileNotFoundError) and e.filename:
            print(f"error: no such file or directory: {e.filename}", file=sys.stderr)
        else:
            print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except failed as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    except KeyboardInterrupt as e:
        from wfm_jax.train.preempt import Stopped
        from wfm_jax.train.pretrain import BuildStopped
        if isinstance(e, BuildStopped):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_PREEMPTED
        if isinstance(e, Stopped):
            from wfm_jax.core.mesh import shutdown_distributed
            shutdown_distributed()  # every process voted to stop after this step (preempt.py)
            print(f"error: stopped by SIGTERM after step {e.step}, its checkpoint is saved; "
                  f"resume with --config.train.resume=True", file=sys.stderr)
            return EXIT_PREEMPTED
        print("error: interrupted; the last finished checkpoint is kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        held.close()
    print(f"done: trained to step {step}; outputs in {config.train.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
