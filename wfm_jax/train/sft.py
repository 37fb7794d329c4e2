"""Supervised fine-tuning (rectified flow) of a model family's transformer: LoRA or full.

One optimizer step = train.grad_accum_steps micro-steps; each micro-step takes one global batch
(train.train_batch_per_replica images or clips over all processes), encodes prompts and pixels
in their own gradient-free jits, and runs the run's SFT step (programs.build(setup).sft_step:
programs/sft.py; donated state, explicit shardings).

Logs train/loss (= train/loss_avg), train/learning_rate, optimizer/grad_norm,
train/iteration_time to metrics.jsonl / console / wandb; checkpoints every train.ckpt.save_freq
steps (and at the end); exports to output_dir/safetensors/step_N with each checkpoint when
train.ckpt.export_safetensors. A NaN/inf loss stops the run before anything is saved for it.
A step's metrics are fetched after the next step's data is loaded and encoded and, unless the
step is saved, after the next step is dispatched (run()).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable

import jax
import numpy as np

from wfm_jax.config.run_length import resolve_max_steps
from wfm_jax.core.mesh import check_batch
from wfm_jax.data import sft_loader_from_config
from wfm_jax.data.errors import DataError
from wfm_jax.programs import build
from wfm_jax.programs.encode import TextEncoder, VisualEncoder, local_sample_ids
from wfm_jax.programs.sft import KEY_VAE
from wfm_jax.train import preempt
from wfm_jax.train import setup as setup_lib
from wfm_jax.train.encode_cache import EncodeCache
from wfm_jax.train.export import export_step
from wfm_jax.train.metrics import MetricsLogger, check_finite


def _check_batch(batch: dict, is_video: bool) -> None:
    """Images (B, H, W, 3) for image families, clips (B, T, H, W, 3) for video ones."""
    pixels = batch["pixels"]
    if pixels.ndim != (5 if is_video else 4):
        kind = "videos (B, T, H, W, 3)" if is_video else "images (B, H, W, 3)"
        raise DataError(f"this model trains on {kind}; the dataset gives pixels of shape "
                        f"{tuple(pixels.shape)} (policy.diffusers.is_video and the dataset must "
                        f"match the model family)")


class SFTTrainer:
    """Owns the setup, data, encoders and step; `run()` trains to train.max_steps (resolved from
    the dataset's size and train.epoch when unset: config/run_length.py)."""

    def __init__(self, config, *, on_step: Callable[[int, dict], None] | None = None):
        self.config, self.on_step = config, on_step
        setup_lib.check_video_flag(config)
        # data problems (missing dir, JSON without "prompt") surface before the model loads
        setup_lib.init_distributed(config)
        setup_lib.ensure_tiny_assets(config)
        setup_lib.check_model_dir(config)
        self.loader = sft_loader_from_config(config)
        try:
            # before build: the LR schedule and config.json take the resolved length
            resolve_max_steps(config, self.loader.dataset_size, "training samples")
            self.setup = s = setup_lib.build(config)
            pipe, d = s.pipe, config.policy.diffusers
            try:
                pipe.latent_shape(1, *d.inference_size, frames=d.train_frames)  # fit VAE x patch
            except ValueError as e:
                raise setup_lib.SetupError(f"policy.diffusers.inference_size: {e}") from e
            try:
                check_batch(s.mesh, config.train.train_batch_per_replica, s.rules)
            except ValueError as e:
                raise setup_lib.SetupError(f"train.train_batch_per_replica: {e}") from e
            if s.data_state is not None:
                self.loader.restore(s.data_state)
            data = s.batch_sharding()
            self.text = TextEncoder(pipe, d.max_prompt_length, out_sharding=data)
            self.visual = VisualEncoder(pipe, out_sharding=data)
            self.cache = (EncodeCache(s, self.text, self.visual)
                          if config.train.train_policy.cache_encodings else None)
            self.programs = build(s)  # the step the planner lowers and the bench times
            self.step_fn = self.programs.sft_step
        except BaseException:
            self.loader.close()
            if hasattr(self, "setup"):
                self.setup.close()
            raise

    def prepare(self, batch: dict) -> tuple:
        """Dispatch the encoders of one micro-batch -> (x0, cond, ids) on the device. The VAE
        draw is keyed by the current state's rng, so this must run after the previous
        micro-step's dispatch. With train.train_policy.cache_encodings, prompts and items
        seen before skip their encoders (encode_cache; a miss waits for its encoding)."""
        s = self.setup
        _check_batch(batch, s.pipe.is_video)
        local = len(batch["prompt"])
        ids_host = local_sample_ids(local)
        if "text_embedding" in batch:  # precomputed (WFM layout)
            try:
                cond = s.pipe.cond_from_embedding(batch["text_embedding"])
            except ValueError as e:
                raise DataError(str(e)) from e
            cond = s.global_batch(cond)
        elif self.cache is not None:
            cond = self.cache.cond(list(batch["prompt"]))
        else:
            cond = self.text(s.global_batch(self.text.tokenize(batch["prompt"])))
        pixels = np.asarray(batch["pixels"])  # uint8 from the loaders: the encoder maps it
        if pixels.dtype != np.uint8:
            pixels = pixels.astype(np.float32, copy=False)
        key = jax.random.fold_in(s.state.rng, KEY_VAE)  # not advanced: the step splits rng
        if self.cache is not None:
            ids = s.global_batch(ids_host)
            return self.cache.latents(pixels, key, ids), cond, ids
        pixels, ids = s.global_batch((pixels, ids_host))
        return self.visual(pixels, key, ids), cond, ids

    def micro_step(self, batch: dict):
        """One train step on `batch` (its encoders too, unless run() dispatched them already)."""
        s, ready = self.setup, getattr(self, "_prepared", None)
        self._prepared = None
        x0, cond, ids = ready[1] if ready is not None and ready[0] is batch else self.prepare(batch)
        s.state, out = self.step_fn(s.state, s.frozen, x0, cond, ids)
        return out

    def run(self) -> int:
        """Train from the restored step to train.max_steps; returns the last step done.

        Step N's metrics are fetched (one device_get) once step N + 1's first batch is loaded
        and its text and VAE encoders are dispatched, so the host's data loading and the
        device's encoding overlap step N. Unless step N is a checkpoint step (or a SIGTERM
        came), step N + 1's train step is dispatched before that fetch too: the host's ~30 ms of
        dispatch (argument flattening, XLA's launch set-up) then overlaps step N on the device
        instead of idling it (docs/bench_notes.md, "gpu 2026-12-04 H200"). Step N's metrics
        are checked, logged and passed to on_step after that; a NaN still stops the run before
        anything is saved for it, and a SIGTERM checkpoints the last step dispatched, once its
        own metrics are in."""
        s, t = self.setup, self.config.train
        accum = int(t.grad_accum_steps)
        logger = MetricsLogger(t.output_dir, total_steps=t.max_steps,
                               wandb_cfg=dict(t.wandb), start_step=s.start_step)
        step = s.start_step
        self._saved = self._exported = step if step > 0 else None
        try:
            pending = None
            for step in range(s.start_step + 1, t.max_steps + 1):
                start = time.perf_counter()
                batch = next(self.loader)
                self._prepared = (batch, self.prepare(batch))
                # the previous step's state is needed only to save it (a due checkpoint, a
                # SIGTERM): otherwise this step is queued behind it before its metrics are in.
                # (With several processes preempt.requested() is an all-gather that waits for
                # the previous step, so there the order is kept but nothing overlaps.)
                ahead = pending is not None and not (s.checkpointer.should_save(pending[0])
                                                     or preempt.requested())
                if pending is not None and not ahead:
                    self._finish(logger, *pending)
                outs = [self.micro_step(batch)]
                outs += [self.micro_step(next(self.loader)) for _ in range(accum - 1)]
                for leaf in jax.tree.leaves(outs):
                    leaf.copy_to_host_async()
                outs = (outs, s.lr_schedule(step - 1))  # queued before step N + 1's work
                if ahead:  # its state is donated to this step: nothing may save it now
                    self._finish(logger, *pending, state_moved_on=True)
                # the data position after this step's batches: a save of it must not count the
                # next step's batch, loaded before this step's metrics are in
                pending = (step, outs, self.loader.skipped, copy.deepcopy(self.loader.state()),
                           start)
            if pending is not None:
                self._finish(logger, *pending)
            if step > s.start_step:
                if self._saved != step:
                    s.save(step, data_state=pending[3], force=True)
                if t.ckpt.export_safetensors and self._exported != step:
                    export_step(s, step)
        finally:
            logger.close()
            self.loader.close()
            s.close()
        return step

    def _finish(self, logger, step: int, outs: tuple, skipped: int, data_state: dict,
                start: float, state_moved_on: bool = False) -> None:
        """Step `step`'s bookkeeping: fetch its outputs (the micro-steps' and the learning
        rate), check and log its metrics (the micro-steps' mean loss), checkpoint and export
        when due, on_step, and stop if preempted. state_moved_on: the next step is dispatched
        already (run()), so this step is not one to save and a SIGTERM waits for the next."""
        s, t = self.setup, self.config.train
        host, lr = fetch_metrics(outs)  # the step's one wait for the device
        loss = float(np.mean([float(o["loss"]) for o in host]))
        metrics = {"train/loss": loss, "train/loss_avg": loss,
                   "train/learning_rate": float(lr),
                   "optimizer/grad_norm": float(host[-1]["grad_norm"]),
                   "train/iteration_time": time.perf_counter() - start}
        if skipped:
            metrics["data/skipped_samples"] = skipped
        check_finite(step, metrics, keys=("train/loss", "optimizer/grad_norm"))
        if step % t.log_freq == 0 or step == t.max_steps:
            logger.log(step, metrics)
        if not state_moved_on and s.save(step, data_state=data_state, extra={"loss": loss}):
            self._saved = step
            if t.ckpt.export_safetensors:
                export_step(s, step)
                self._exported = step
        if self.on_step is not None:
            self.on_step(step, metrics)
        if step < t.max_steps and preempt.requested() and not state_moved_on:
            if self._saved != step:  # the checkpoint only: exports can wait for the resume
                s.save(step, data_state=data_state, force=True)
            raise preempt.Stopped(step)


def fetch_metrics(tree):
    """The loop's one blocking device-to-host fetch per step."""
    return jax.device_get(tree)


def run(config, *, on_step: Callable[[int, dict], None] | None = None) -> int:
    """Train with `config` (train.train_policy.type == "sft"); returns the last step."""
    return SFTTrainer(config, on_step=on_step).run()
