"""The RL loop shared by DiffusionNFT, Flow-GRPO and DDRL: rollout -> reward -> update.

One step: the GroupBatcher gives this process's prompts (each repeated n_generation times), each
distinct prompt encoded once; the rollout runs in chunks, and each chunk's decoded images go to
the reward service (or local rewards) once the next chunk is dispatched, so sampling continues
while images are fetched and rewards computed; then
advantages over the whole global batch, the algorithm's update (per inner epoch one optimizer
step, or one per chunk of batch_size_per_optimize rows in a fresh order; gradients accumulated
over micro-batches), the algorithm's post-update (e.g. NFT's old-policy soft
update), EMA, metrics, checkpoint, validation. The algorithms differ only in their
RLAlgorithm objects (algorithms/{nft,grpo,ddrl}/algorithm.py): sampler, stored rollout fields and
loss; their programs come from programs.build.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from reward_client.protocol import prompt_extras
from wfm_jax.algorithms.advantages import clip_advantages, zero_std_ratio
from wfm_jax.train import preempt, rl_setup
from wfm_jax.train.metrics import Timers, check_finite
from wfm_jax.train.reward_media import reward_media
from wfm_jax.train.validation_out import write_validation


def _stats(prefix: str, values: np.ndarray) -> dict:
    v = np.asarray(values, np.float64)
    return {f"{prefix}_mean": float(v.mean()), f"{prefix}_std": float(v.std()),
            f"{prefix}_min": float(v.min()), f"{prefix}_max": float(v.max())}


def gather_host(x: np.ndarray) -> np.ndarray:
    """Concatenate a per-process host array over all processes (identity for one process)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True))


def rollout_batch(run, state, batch: dict, key, timers: Timers, after_dispatch=None) -> dict:
    """Sample, decode and submit every chunk of this process's rows; collect rewards at the end.

    A one-deep pipeline: chunk i's pixels are fetched to the host and submitted only after
    chunk i + 1's rollout is dispatched (and its host inputs, e.g. DDRL's data, prepared), so
    the device never waits for the host's fetch, encoding or PIL work between chunks.

    after_dispatch(): called once the first chunk's rollout is dispatched, before any chunk is
    fetched or submitted (the loop finishes the previous step there).

    Returns host/device arrays of the whole local batch: the algorithm's stored fields, the
    conditioning, rewards, the per-function scores and the keep mask.
    """
    prompts = list(batch["prompt"])
    chunk = run.rollout_chunk
    stored, handles, pending = [], [], None
    conds, kept = run.rollout_conditions(prompts)  # each distinct prompt encoded once
    for lo in range(0, len(prompts), chunk):
        rows = prompts[lo:lo + chunk]
        key, k_lat, k_alg = jax.random.split(key, 3)
        cond = conds[lo // chunk]
        latents = run.initial_latents(k_lat, len(rows))
        inputs = dict(run.chunk_inputs(batch, lo, lo + chunk))
        # an algorithm's per-row conditioning (video2world frames of its data) joins the text's
        row_cond = inputs.pop("cond", {})
        cond = {**cond, **row_cond}
        fields, pixels = run.rollout(state, latents, cond, k_alg, inputs)  # pixels: uint8 already
        media = run.algo.final_latents(fields) if run.rewards.media_type == "latent" else pixels
        if isinstance(media, jax.Array):
            media.copy_to_host_async()  # the transfer starts when the chunk is done
        if after_dispatch is not None:
            after_dispatch()
            after_dispatch = None
        if pending is not None:
            handles.append(_submit(run, batch, *pending))
        pending = (lo, fields, pixels)
        # the update's conditioning: the prompts' once per step (`kept`), the rest per row
        stored.append(dict(fields, cond=row_cond if kept else cond))
    handles.append(_submit(run, batch, *pending))
    with timers("reward_wait"):
        results = [h.result() for h in handles]
    out = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *stored)
    out.update(kept)
    out["reward"] = np.concatenate([r.total for r in results])
    keep = np.concatenate([r.keep for r in results])
    # a group split over chunks is dropped whole when any of its rewards was dropped
    groups = np.asarray(batch["group"])
    out["keep"] = keep & ~np.isin(groups, groups[~keep])
    out["per_fn"] = {name: np.concatenate([r.per_fn[name] for r in results])
                     for name in results[0].per_fn}
    out["dropped_groups"] = sum(r.dropped_groups for r in results)
    out["extra"] = {key: np.concatenate([r.extra[key] for r in results])
                    for key in results[0].extra}
    return out


def _submit(run, batch: dict, lo: int, fields: dict, pixels):
    """Fetch one chunk's media to the host and hand it to the rewards (returns the handle)."""
    hi = lo + run.rollout_chunk
    media, media_type = reward_media(run.rewards.media_type, pixels,
                                     run.algo.final_latents(fields))
    extras = prompt_extras(batch["metadata"][lo:hi])  # geneval keys as the service reads them
    groups = np.asarray(batch["group"][lo:hi])
    return run.rewards.submit(media, list(batch["prompt"])[lo:hi], group_ids=groups,
                              extras=extras, media_type=media_type)


def advantages_for(run, rollout: dict, batch: dict) -> tuple[np.ndarray, dict]:
    """Group advantages over the GLOBAL batch (per-prompt mean, global or per-prompt std)."""
    rewards = gather_host(rollout["reward"])
    keep = gather_host(rollout["keep"])
    groups = gather_host(np.asarray(batch["group"]))
    adv = np.zeros_like(rewards, dtype=np.float32)
    if keep.any():  # the algorithm's (default group-normalised; DDRL's exp-mapped)
        adv[keep] = run.algo.advantages(rewards[keep], groups[keep], global_std=run.global_std,
                                        ddof=run.std_ddof)
    low, high = run.adv_range
    adv = clip_advantages(adv, high, low)  # the one clip, both bounds, every algorithm
    lo = jax.process_index() * len(rollout["reward"])
    mine = adv[lo:lo + len(rollout["reward"])]
    metrics = _stats("train/reward", rewards[keep]) if keep.any() else {}
    metrics.update(_stats("rollout/advantage", adv[keep]) if keep.any() else {})
    metrics["rollout/dropped_groups"] = int(rollout["dropped_groups"])
    if keep.any():
        metrics["rollout/zero_std_ratio"] = zero_std_ratio(rewards[keep], groups[keep])
    for name, scores in rollout["per_fn"].items():
        metrics[f"train/reward_{name}_mean"] = float(np.nanmean(gather_host(scores)))
    for key, scores in rollout.get("extra", {}).items():  # a reward's per-attribute keys
        metrics[f"train/reward_{key}_mean"] = float(np.nanmean(gather_host(scores)))
    return mine, metrics


def validate(run, state, step: int) -> dict:
    """The family's deterministic sampler (eval_num_steps) on the validation prompts with the
    evaluation weights; a captioned grid (PNG for images, mp4 for videos) in output_dir and in
    wandb."""
    scored, pending = [], None
    for batch in run.validation_batches():  # batch i + 1 dispatched before batch i is fetched
        rows = list(batch["prompt"])
        cond = run.encode(rows)
        latents = run.initial_latents(jax.random.key(run.seed + 1), len(rows), evaluation=True)
        final, pixels = run.evaluate(state, latents, cond)
        if pending is not None:
            scored.append(_score_validation(run, *pending))
        pending = (batch, rows, final, pixels)
    if pending is not None:
        scored.append(_score_validation(run, *pending))
    rewards, images, prompts, extra = [], [], [], {}
    for batch, rows, imgs, handle in scored:
        res = handle.result()
        valid = np.asarray(batch["valid"])
        rewards.append(res.total[valid])
        for key, values in res.extra.items():
            extra.setdefault(key, []).append(values[valid])
        images.append(imgs[valid])
        prompts += [p for p, v in zip(rows, valid) if v]
    if not rewards:
        return {}
    rewards = np.concatenate(rewards)
    write_validation(np.concatenate(images), prompts, rewards, f"{run.output_dir}/validation",
                     step, fps=run.setup.pipe.default_fps, logger=run.logger)
    metrics = _stats("val/reward", rewards)
    metrics.update({f"val/reward_{k}_mean": float(np.nanmean(np.concatenate(v)))
                    for k, v in extra.items()})
    return metrics


def _score_validation(run, batch: dict, rows: list, final, pixels) -> tuple:
    imgs = np.asarray(jax.device_get(pixels))  # uint8 already (programs.sample)
    media, media_type = reward_media(run.rewards.media_type, imgs, final)
    return batch, rows, imgs, run.rewards.submit(media, rows, media_type=media_type)


def run(config) -> int:
    """Entry point for train.train_policy.type in {nft, grpo, ddrl}; returns the last step."""
    run = rl_setup.build(config)
    try:
        _loop(run)
    finally:
        run.close()
    return run.max_steps


def _loop(run) -> None:
    """Steps from the restored one to max_steps. Step N's update metrics are fetched (one
    device_get) once step N + 1's first rollout chunk is dispatched, so the device goes on from
    the update to the next rollout while the host waits; they are then checked, logged, and
    step N validated and saved before anything of step N + 1 is fetched, submitted or
    trained: a NaN stops the run before step N is saved, a SIGTERM checkpoints step N, a kill
    after step N's log resumes from the same place as when each step waited for its own
    metrics (step N + 1's batch is only read: GroupBatcher.batch_at is a pure lookup)."""
    state = run.state
    timers = Timers()
    if run.validation_enabled and run.val_before_train and run.start_step == 0:
        run.logger.log(0, validate(run, state, 0))
    pending = None
    for step in range(run.start_step + 1, run.max_steps + 1):
        t0 = time.perf_counter()
        batch = run.batcher.batch_at(step - 1)
        key = jax.random.fold_in(run.base_key, step)
        k_roll, k_update = jax.random.split(key)
        spent: list = []
        finish = None if pending is None else functools.partial(_timed_finish, run, pending, spent)
        try:
            with timers("rollout"):
                rollout = rollout_batch(run, state, batch, k_roll, timers, after_dispatch=finish)
        except BaseException:
            if finish is not None and not spent:  # step N + 1 failed before its first dispatch
                finish()  # step N is done: its log and checkpoint stand
            raise
        if spent:  # the previous step's bookkeeping is not this step's rollout time
            timers.totals["rollout"] -= spent[0]
        with timers("advantages"):
            adv, metrics = advantages_for(run, rollout, batch)
        with timers("update"):
            state, update = run.dispatch_update(state, rollout, adv, k_update, step)
        metrics.update(timers.metrics())
        timers.reset()
        pending = (state, step, metrics, update, t0)
    if pending is not None:
        _finish(run, *pending)
    run.save(state, run.max_steps, final=True)


def _timed_finish(run, pending: tuple, spent: list) -> None:
    spent.append(time.perf_counter())  # started: not to be run again
    _finish(run, *pending)
    spent[0] = time.perf_counter() - spent[0]


def _finish(run, state, step: int, metrics: dict, update, t0: float) -> None:
    """Step `step`'s bookkeeping: wait for its update metrics, check, validate, log, save, and
    stop if preempted. time/update is the update's dispatch plus this wait for its results
    (the device's remaining update time, as the host sees it)."""
    wait = time.perf_counter()
    metrics = {**metrics, **run.update_metrics(update)}
    metrics["time/update"] = metrics.get("time/update", 0.0) + time.perf_counter() - wait
    elapsed = time.perf_counter() - t0
    metrics["train/samples_per_s"] = run.global_batch / elapsed
    metrics["train/iteration_time"] = elapsed
    check_finite(step, metrics, keys=["train/loss"])
    if run.validation_enabled and step % run.validation_freq == 0:
        metrics.update(validate(run, state, step))
    run.logger.log(step, metrics)
    run.batcher.step = step
    run.save(state, step)
    if step < run.max_steps and preempt.requested():  # the checkpoint only: exports can wait for the resume
        run.save(state, step, final=True, export=False)
        raise preempt.Stopped(step)
