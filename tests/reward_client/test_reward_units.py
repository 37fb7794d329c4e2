"""Pure parts of reward_client: wire format, config resolution, combine math, jpeg rewards, registry,
OCR text rule, the server's task store."""
import functools
import io
import threading

import numpy as np
import pytest
from PIL import Image

from reward_client import protocol
from reward_client.catalog import frame_indices, score_local
from reward_client.combine import RewardFnSpec, combine_scores, keyed_scores, nonfinite, parse_reward_fns
from reward_client.computer import RewardComputer
from reward_client.config import RemoteConfig, resolve_remote_config
from reward_client.errors import RewardConfigError, RewardProtocolError, RewardServiceError, RewardValueError
from reward_client.ocr import levenshtein, quoted_target, text_score
from reward_client.registry import register_reward, unregister_reward
from reward_client.task_store import QueueFull, TaskStore


def test_enqueue_body_round_trip_and_layout():
    media = np.random.default_rng(0).integers(0, 256, (2, 3, 4, 5, 6), dtype=np.uint8)
    header = protocol.build_header(["a", "b"], {"ocr": 1.0}, "video", {"video_infos": [{"video_fps": 16.0}] * 2})
    body = protocol.encode_enqueue(header, media)
    head, npy = body.split(b"\n", 1)  # the cosmos-rl layout: JSON, one newline, np.save bytes
    assert np.array_equal(np.load(io.BytesIO(npy)), media)
    got_header, got_media = protocol.decode_enqueue(body)
    assert got_header == header and np.array_equal(got_media, media)


@pytest.mark.parametrize("body, fragment", [
    (b'{"prompts": ["a"]}', "no newline"),
    (b'{"prompts": [1], "reward_fn": {"x": 1}}\n' + protocol.encode_npy(np.zeros((1, 2, 2, 3), np.uint8)), "prompts"),
    (b'{"prompts": ["a"], "reward_fn": {"x": 1}, "media_type": "image"}\n' + protocol.encode_npy(np.zeros((1, 2, 2, 3), np.float32)), "uint8"),
    (b'{"prompts": ["a", "b"], "reward_fn": {"x": 1}, "media_type": "image"}\n' + protocol.encode_npy(np.zeros((1, 2, 2, 3), np.uint8)), "2 prompts"),
    (b'{"prompts": ["a"], "reward_fn": {"x": 1}}\n' + protocol.encode_npy(np.zeros((1, 2, 2, 3), np.uint8)), "media_type"),
    (b'{"prompts": ["a"], "reward_fn": {"x": 1}}\nnot-npy', ".npy"),
])
def test_decode_enqueue_names_the_problem(body, fragment):
    with pytest.raises(RewardProtocolError, match=fragment):
        protocol.decode_enqueue(body)


def test_parse_pull_response():
    assert protocol.parse_pull_response(b'{"scores": {"ocr_reward": [1.0, NaN]}}', "ocr", "u")["ocr_reward"][0] == 1.0
    with pytest.raises(RewardProtocolError, match="not JSON"):
        protocol.parse_pull_response(b"<html>", "ocr", "u1")
    with pytest.raises(RewardProtocolError, match="no 'scores'"):
        protocol.parse_pull_response(b'{"score": {}}', "ocr", "u1")
    with pytest.raises(RewardServiceError, match="boom"):
        protocol.parse_pull_response(b'{"scores": null, "error": "boom"}', "ocr", "u1")
    assert protocol.parse_form(b"uuid=a%20b&type=ocr") == {"uuid": "a b", "type": "ocr"}


def test_remote_config_resolution_order():
    env = {"WFM_REWARD_ENQUEUE_URL": "http://old/api/reward/enqueue", "WFM_REWARD_FETCH_URL": "http://old/f",
           "WFM_REWARD_TOKEN": "old", "REMOTE_REWARD_TOKEN": "new"}
    cfg = resolve_remote_config(None, env)
    assert (cfg.enqueue_url, cfg.token) == ("http://old/api/reward/enqueue", "new")  # new names win
    assert cfg.ping_endpoint() == "http://old/api/reward/ping"
    cfg = resolve_remote_config({"fetch_url": "http://cfg/f", "token": "cfg"}, env)  # config wins
    assert (cfg.fetch_url, cfg.token) == ("http://cfg/f", "cfg")
    assert resolve_remote_config(None, {}) is None
    with pytest.raises(RewardConfigError, match="REMOTE_REWARD_FETCH_URL"):
        resolve_remote_config(None, {"REMOTE_REWARD_ENQUEUE_URL": "http://x"})
    with pytest.raises(RewardConfigError, match="did you mean 'budget_s'"):
        resolve_remote_config({"budget": 3}, env)
    read = RemoteConfig("u", "f").enqueue_read_timeout
    assert read(1000) == 60.0 and read(int(20e6)) == 90.0 and read(int(1e9)) == 600.0


def test_combine_matches_numpy_by_hand():
    rng = np.random.default_rng(1)
    scores = {"a": rng.normal(size=6).tolist(), "b": rng.normal(size=6).tolist(), "c": rng.normal(size=6).tolist()}
    specs = parse_reward_fns([{"name": "r1", "weight": 0.5, "score_key": "a+b", "clip": 1.0},
                              {"name": "r2", "weight": 3.0, "score_key": "c", "clip": [-0.2, 0.4]},
                              {"name": "c", "weight": 2.0}])
    raw = {s.name: sum(keyed_scores(s, scores, 6).values()) for s in specs}
    a, b, c = (np.asarray(scores[k]) for k in "abc")
    assert np.allclose(raw["r1"], a + b) and np.allclose(raw["c"], c)
    by_hand = np.clip(np.clip(a + b, -1, 1) * 0.5 + np.clip(c, -0.2, 0.4) * 3.0 + c * 2.0, -1.5, 2.5) * 0.7
    got = combine_scores(specs, raw, total_clip=(-1.5, 2.5), scale=0.7)
    assert got.dtype == np.float32 and np.allclose(got, by_hand, atol=1e-6)


def test_score_key_errors_and_defaults():
    spec = RewardFnSpec("pick", score_key="a+zz")
    with pytest.raises(RewardValueError, match=r"'zz'.*available keys: \['a', 'b'\]"):
        keyed_scores(spec, {"a": [1.0], "b": [2.0]}, 1)
    assert list(keyed_scores(RewardFnSpec("ocr"), {"ocr_reward": [1.0]}, 1)) == ["ocr_reward"]
    with pytest.raises(RewardValueError, match="no score_key"):
        keyed_scores(RewardFnSpec("x"), {"a": [1.0], "b": [2.0]}, 1)
    with pytest.raises(RewardValueError, match="2 values for a batch of 3"):
        keyed_scores(RewardFnSpec("x"), {"x": [1.0, 2.0]}, 3)
    with pytest.raises(RewardValueError, match="non-numeric"):
        keyed_scores(RewardFnSpec("x"), {"x": ["Good"]}, 1)
    keyed = keyed_scores(RewardFnSpec("x", score_key="p+q"), {"p": [1.0, None, 2.0], "q": [0.0, 1.0, np.inf]}, 3)
    bad = nonfinite(keyed)
    assert bad["p"].tolist() == [1] and bad["q"].tolist() == [2]
    with pytest.raises(RewardValueError, match="'x'.*samples \\[1\\]"):
        combine_scores([RewardFnSpec("x")], {"x": np.array([1.0, np.nan])})


@pytest.mark.parametrize("entry, fragment", [
    ({"name": "x", "weight": 0}, "weight"), ({"name": "x", "wieght": 1}, "did you mean 'weight'"),
    ({"name": "x", "clip": [1, -1]}, "lo < hi"), ({"weight": 1}, "name"), ({"name": "x", "score_key": "a+"}, "a\\+b"),
])
def test_reward_fn_config_errors(entry, fragment):
    with pytest.raises(RewardConfigError, match=fragment):
        parse_reward_fns([entry])


def _pil_jpeg_kb(image):
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=95)
    return len(buf.getvalue()) / 1000.0


def test_jpeg_rewards_match_pil_for_images_and_videos():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (3, 24, 32, 3), dtype=np.uint8)
    images[0] = 128  # a flat image compresses far better than noise
    kb = np.array([_pil_jpeg_kb(im) for im in images])
    comp = score_local("jpeg_compressibility", images, ["p"] * 3)["jpeg_compressibility"]
    incomp = score_local("jpeg_incompressibility", images, ["p"] * 3)["jpeg_incompressibility"]
    assert np.allclose(comp, -kb / 500) and np.allclose(incomp, kb / 500) and comp[0] > comp[1]
    video = rng.integers(0, 256, (2, 3, 7, 16, 16), dtype=np.uint8)  # [B,C,T,H,W]
    frames = frame_indices(7, 4)
    assert frames.tolist() == [0, 2, 4, 6]
    want = np.array([np.mean([_pil_jpeg_kb(np.moveaxis(v[:, t], 0, -1).copy()) for t in frames]) for v in video])
    got = score_local("jpeg_incompressibility", video, ["p", "q"], media_type="video", max_video_frames=4)
    assert np.allclose(got["jpeg_incompressibility"], want / 500)


def test_registered_reward_runs_through_reward_computer():
    @register_reward("t_mean_and_const")
    def mean_and_const(images, prompts, extras):
        return {"mean": images.mean(axis=(1, 2, 3)) / 255.0, "const": [extras["bonus"]] * len(prompts)}

    try:
        images = np.random.default_rng(3).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
        with RewardComputer([{"name": "t_mean_and_const", "score_key": "mean+const", "weight": 2.0}],
                            clip=None) as rc:
            res = rc.score(images, ["a", "b", "c", "d"], extras={"bonus": 0.25})
        want = images.reshape(4, -1).mean(axis=1) / 255.0 + 0.25
        assert np.allclose(res.per_fn["t_mean_and_const"], want)
        assert np.allclose(res.total, 2.0 * want, atol=1e-6) and res.keep.all()
        with pytest.raises(RewardConfigError, match="already registered"):
            register_reward("t_mean_and_const")(lambda i, p, e: p)
    finally:
        unregister_reward("t_mean_and_const")
    with pytest.raises(RewardConfigError, match="'jpeg_compresibility' is not a local reward \\(did you mean 'jpeg_compressibility'"):
        RewardComputer([{"name": "jpeg_compresibility"}])
    with pytest.raises(RewardConfigError, match="'pickscore' is not a local reward and no reward service is configured"):
        RewardComputer([{"name": "pickscore"}])


def test_ocr_text_rule_and_levenshtein():
    @functools.cache
    def naive(a, b):  # textbook recursion, independent of the two-row version
        if not a or not b:
            return len(a) + len(b)
        return min(naive(a[1:], b) + 1, naive(a, b[1:]) + 1, naive(a[1:], b[1:]) + (a[0] != b[0]))

    rng = np.random.default_rng(4)
    for _ in range(30):
        a = "".join(rng.choice(list("abc"), rng.integers(0, 7)))
        b = "".join(rng.choice(list("abc"), rng.integers(0, 7)))
        assert levenshtein(a, b) == naive(a, b)
    assert quoted_target('a sign that says "Hello World" and "x"') == "Hello World"
    assert quoted_target("no quotes") is None
    assert text_score("OPEN: hello world!", "Hello World") == 1.0  # contained after normalising
    assert text_score("hellp", "hello") == pytest.approx(1 - 1 / 5)
    assert text_score("", "hello") == 0.0 and text_score("a much longer unrelated text", "hi") == 0.0


def test_task_store_bounded_queue_ttl_and_grace():
    now = [0.0]
    gate = threading.Event()

    def scorer(name, header, media):
        gate.wait(5)
        return {name: [1.0] * media.shape[0]}

    store = TaskStore(scorer, max_queue=1, ttl_s=100.0, clock=lambda: now[0])

    def wait_idle():
        for _ in range(500):
            if store.counts()["pending"] == 0:
                return
            threading.Event().wait(0.01)
        raise AssertionError("task store worker did not finish")
    media = np.zeros((2, 2, 2, 3), np.uint8)
    first = store.submit({"prompts": ["a", "b"]}, media, ["r"])
    with pytest.raises(QueueFull):  # no worker yet: the one queue slot is taken
        store.submit({"prompts": ["a", "b"]}, media, ["r"])
    store.start()
    try:
        assert store.pull(first, "r")[0] == "pending"
        gate.set()
        wait_idle()
        state, answer = store.pull(first, "r")
        assert state == "ready" and answer["scores"] == {"r": [1.0, 1.0]} and answer["type"] == "r"
        assert store.pull(first, "zz")[0] == "unknown"
        now[0] = 29.0  # pulled: kept for a grace period only
        assert store.pull(first, "r")[0] == "ready"
        now[0] = 31.0
        assert store.pull(first, "r")[0] == "unknown"
        second = store.submit({"prompts": ["a", "b"]}, media, ["r"])
        wait_idle()  # without pulling: a pull would start the grace period
        now[0] = 130.0
        assert store.pull(second, "r")[0] == "ready"
        now[0] = 131.5  # done at 31 and pulled only at 130: expires at 31 + TTL, not 130 + grace
        assert store.pull(second, "r")[0] == "unknown"
    finally:
        gate.set()
        store.stop()
