"""Reward reference-server round trips: wfm_jax's RewardComputer vs a cosmos-rl-style client.

Both talk to the same in-process reference server (reward_client.server on loopback) about the
same uint8 batch; one round trip = encode + enqueue + poll/pull until scored. The reward itself
is `bench_mean` (mean pixel value, microseconds), so the figure measures the protocol and
transport, not a reward model. The baseline is what cosmos-rl's client does per batch
(requests.post of JSON header + .npy, then form-encoded pulls, a 400 meaning "poll again"), with
the same 10 ms poll interval as the wfm_jax client so neither waits on a retry policy.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from wfm_jax.bench import inputs, timing

TOKEN = "bench-token"
REWARD = "bench_mean"
POLL_S = 0.01


def _mean_reward(images, prompts, extras):
    return np.asarray(images, np.float64).reshape(len(images), -1).mean(axis=1) / 255.0


def _server():
    from reward_client.background import BackgroundServer
    from reward_client.registry import register_reward
    from reward_client.server import create_app
    register_reward(REWARD, replace=True)(_mean_reward)
    return BackgroundServer(create_app(TOKEN))


def _baseline_round_trip(url: str, media: np.ndarray, prompts: list[str], parts: dict):
    import requests

    from reward_client.protocol import ENQUEUE_PATH, PULL_PATH, build_header, encode_enqueue
    auth = {"Authorization": f"Bearer {TOKEN}"}
    start = time.perf_counter()
    body = encode_enqueue(build_header(prompts, {REWARD: 1.0}, "image"), media)
    r = requests.post(url + ENQUEUE_PATH, data=body, timeout=60,
                      headers={**auth, "Content-Type": "application/octet-stream"})
    r.raise_for_status()
    uuid = r.json()["uuid"]
    enqueued = time.perf_counter()
    while True:
        r = requests.post(url + PULL_PATH, data={"uuid": uuid, "type": REWARD}, headers=auth,
                          timeout=10)
        if r.status_code != 400:
            break
        time.sleep(POLL_S)
    r.raise_for_status()
    scores = r.json()["scores"][REWARD]
    parts.setdefault("enqueue_s", []).append(enqueued - start)
    parts.setdefault("pull_s", []).append(time.perf_counter() - enqueued)
    return scores


def _figures(stack, impl, t, media, parts, scores) -> dict:
    return timing.record(
        stack, impl, t, samples=media.shape[0], flops=None, peak_flops=None,
        memory=(None, "n/a: host-side I/O workload"), compile_time_s=None,
        compile_note="n/a: nothing is compiled",
        notes={"flops_per_step": "n/a: I/O workload (no model FLOPs)"},
        extra={"round_trips_per_s": 1.0 / t["step_time_s"],
               "enqueue_s": statistics.median(parts["enqueue_s"]),
               "pull_s": statistics.median(parts["pull_s"]),
               "payload_bytes": int(media.nbytes),
               "first_score": float(scores[0])})


def run(suite, stack: str) -> dict:
    media = inputs.reward_batch(suite.reward_shape)
    prompts = [f"bench prompt {i}" for i in range(media.shape[0])]
    with _server() as srv:
        if stack == "wfm_jax":
            return _run_wfm(srv.url, media, prompts, suite)
        return _run_baseline(srv.url, media, prompts, suite)


def _run_wfm(url, media, prompts, suite) -> dict:
    from reward_client import RemoteConfig, RewardComputer
    from reward_client.protocol import ENQUEUE_PATH, PULL_PATH
    cfg = RemoteConfig(url + ENQUEUE_PATH, url + PULL_PATH, token=TOKEN, poll_initial_s=POLL_S,
                       poll_max_s=POLL_S)
    parts, scores = {}, []
    with RewardComputer([{"name": REWARD, "weight": 1.0, "local": False}], remote=cfg) as rc:
        def call():
            res = rc.score(media, prompts)
            parts.setdefault("enqueue_s", []).append(res.timings["enqueue_s"])
            parts.setdefault("pull_s", []).append(res.timings["pull_s"])
            scores.append(res.per_fn[REWARD])
            return res

        t = timing.time_calls(call, lambda _: None, warmup=suite.warmup,
                              repeats=max(suite.repeats, 5))
    return _figures("wfm_jax", "reward_client.RewardComputer (remote, worker thread, "
                    f"{POLL_S * 1e3:.0f} ms poll)", t, media, parts, scores[0])


def _run_baseline(url, media, prompts, suite) -> dict:
    parts, scores = {}, []

    def call():
        scores.append(_baseline_round_trip(url, media, prompts, parts))

    t = timing.time_calls(call, lambda _: None, warmup=suite.warmup,
                          repeats=max(suite.repeats, 5))
    return _figures("torch", "cosmos-rl-style requests client (enqueue + polled pull, "
                    f"{POLL_S * 1e3:.0f} ms poll); no torch involved", t, media, parts, scores[0])
