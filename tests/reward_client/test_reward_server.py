"""Client <-> reference server on loopback: image and video batches, auth, size limit, full queue,
and the two command lines (server as a subprocess, score CLI)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

from reward_client import __main__ as cli
from reward_client.background import BackgroundServer
from reward_client.catalog import score_local
from reward_client.computer import RewardComputer
from reward_client.config import RemoteConfig
from reward_client.protocol import ENQUEUE_PATH, PING_PATH, PULL_PATH, build_header, encode_enqueue
from reward_client.registry import register_reward, unregister_reward
from reward_client.server import create_app
from tests._support.paths import REPO_ROOT

TOKEN = "test-token"
REPO = REPO_ROOT
FNS = [{"name": "jpeg_compressibility", "weight": 1.0}, {"name": "jpeg_incompressibility", "weight": 0.5}]


def fast_config(url, token=TOKEN, **kw):
    base = dict(token=token, connect_timeout_s=2.0, enqueue_timeout_min_s=5.0, enqueue_timeout_max_s=5.0,
                pull_timeout_s=5.0, max_attempts=5, backoff_initial_s=0.02, backoff_max_s=0.2,
                poll_initial_s=0.01, poll_max_s=0.05, budget_s=20.0)
    base.update(kw)
    return RemoteConfig(url + ENQUEUE_PATH, url + PULL_PATH, **base)


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(TOKEN, max_body_bytes=1 << 20, max_queue=8)) as srv:
        yield srv


def local_total(media, prompts, media_type):
    comp = score_local("jpeg_compressibility", media, prompts, media_type=media_type)["jpeg_compressibility"]
    incomp = score_local("jpeg_incompressibility", media, prompts, media_type=media_type)["jpeg_incompressibility"]
    return comp, incomp, np.clip(comp * 1.0 + incomp * 0.5, -5, 5)


@pytest.mark.parametrize("shape", [(3, 32, 24, 3), (2, 3, 5, 16, 16)], ids=["image", "video"])
def test_round_trip_matches_local_scores(server, shape):
    media = _regen(shape)
    prompts = [f"prompt {i}" for i in range(shape[0])]
    with RewardComputer(FNS, remote=fast_config(server.url)) as rc:
        info = rc.check_reachable()
        assert "jpeg_compressibility" in info["rewards"]
        handle = rc.submit(media, prompts)
        media[:] = 0  # the batch was snapshotted at submit: overwriting it must not change the scores
        res = handle.result(timeout=30)
        report = rc.close()
    comp, incomp, total = local_total(_regen(shape), prompts, "image" if len(shape) == 4 else "video")
    assert np.allclose(res.per_fn["jpeg_compressibility"], comp)
    assert np.allclose(res.per_fn["jpeg_incompressibility"], incomp)
    assert np.allclose(res.total, total, atol=1e-6) and res.keep.all() and len(res.uuids) == 1
    assert report == {"uncollected": [], "unaccounted": {}}
    assert rc.metrics()["pulled"] == 2 and rc.metrics()["enqueued"] == 1


def _regen(shape):
    media = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    media[0] //= 8  # different compressibility per sample
    return media


def _body(batch=1, side=8):
    media = np.zeros((batch, side, side, 3), np.uint8)
    return encode_enqueue(build_header(["p"] * batch, {"jpeg_compressibility": 1.0}, "image"), media)


@pytest.mark.parametrize("path", [ENQUEUE_PATH, PULL_PATH, PING_PATH])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Bearer {TOKEN}x", TOKEN])
def test_missing_or_wrong_token_is_401(server, path, auth):
    headers = {"Authorization": auth} if auth else {}
    data = _body() if path == ENQUEUE_PATH else {"uuid": "x", "type": "jpeg_compressibility"}
    assert requests.post(server.url + path, data=data, headers=headers, timeout=10).status_code == 401


def test_client_reports_rejected_token(server):
    from reward_client.errors import RewardServiceError

    with RewardComputer(FNS, remote=fast_config(server.url, token="nope")) as rc:
        with pytest.raises(RewardServiceError, match="rejected the token"):
            rc.check_reachable()
        with pytest.raises(Exception, match="rejected the token"):
            rc.score(np.zeros((1, 8, 8, 3), np.uint8), ["p"])


def test_oversized_body_is_413(server):
    body = _body(batch=1, side=700)  # ~1.5 MB > 1 MiB limit
    resp = requests.post(server.url + ENQUEUE_PATH, data=body, timeout=10,
                         headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 413 and "limit" in resp.json()["detail"]
    from reward_client.errors import RewardServiceError

    with RewardComputer(FNS[:1], remote=fast_config(server.url)) as rc:
        with pytest.raises(RewardServiceError, match="413"):
            rc.client.enqueue(np.zeros((1, 700, 700, 3), np.uint8), ["p"], {"jpeg_compressibility": 1.0})


def test_bad_requests_get_clear_answers(server):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    media = np.zeros((1, 8, 8, 3), np.uint8)
    unknown = encode_enqueue(build_header(["p"], {"no_such_reward": 1.0}, "image"), media)
    resp = requests.post(server.url + ENQUEUE_PATH, data=unknown, headers=auth, timeout=10)
    assert resp.status_code == 422 and "no_such_reward" in resp.json()["detail"]
    resp = requests.post(server.url + PULL_PATH, data={"uuid": "nope", "type": "x"}, headers=auth, timeout=10)
    assert resp.status_code == 404 and "nope" in resp.json()["detail"]


def test_full_queue_is_503_and_client_retries_until_room(server):
    started, release = threading.Event(), threading.Event()

    @register_reward("t_blocking")
    def blocking(images, prompts, extras):
        started.set()
        release.wait(20)
        return np.ones(len(prompts))

    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = encode_enqueue(build_header(["p"], {"t_blocking": 1.0}, "image"), np.zeros((1, 4, 4, 3), np.uint8))
    try:
        with BackgroundServer(create_app(TOKEN, max_queue=1)) as small:
            first = requests.post(small.url + ENQUEUE_PATH, data=body, headers=auth, timeout=10)
            assert started.wait(10)  # the worker holds the first task; the queue is empty again
            second = requests.post(small.url + ENQUEUE_PATH, data=body, headers=auth, timeout=10)
            third = requests.post(small.url + ENQUEUE_PATH, data=body, headers=auth, timeout=10)
            assert (first.status_code, second.status_code, third.status_code) == (200, 200, 503)
            assert third.headers["Retry-After"] and "full" in third.json()["detail"]
            with RewardComputer([{"name": "t_blocking", "local": False}],
                                remote=fast_config(small.url, max_attempts=1000)) as rc:
                handle = rc.submit(np.zeros((1, 4, 4, 3), np.uint8), ["p"])  # meets 503, backs off
                time.sleep(0.3)
                release.set()
                assert handle.result(timeout=30).total.tolist() == [1.0]
            for resp in (first, second):  # nothing accepted was dropped
                pulled = requests.post(small.url + PULL_PATH, headers=auth, timeout=10,
                                       data={"uuid": resp.json()["uuid"], "type": "t_blocking"})
                assert pulled.status_code == 200 and pulled.json()["scores"] == {"t_blocking": [1.0]}
    finally:
        release.set()
        unregister_reward("t_blocking")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_and_score_command_lines(tmp_path):
    media = _regen((2, 3, 4, 16, 16))
    np.save(tmp_path / "batch.npy", media)
    (tmp_path / "prompts.txt").write_text("a cat\na dog\n")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "reward_client.server", "--host", "127.0.0.1",
                             "--port", str(port), "--token", TOKEN], env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if requests.post(url + PING_PATH, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("reward server subprocess did not answer ping: "
                        + (tmp_path / "server.log").read_text()[-500:])
        # it says where it listens and what it serves (it once printed nothing)
        first = (tmp_path / "server.log").read_text().splitlines()[0]
        assert first.startswith(f"reward server on {url}: POST {ENQUEUE_PATH}, POST {PULL_PATH}, "
                                f"POST {PING_PATH} (Bearer token); rewards: "), first
        assert "jpeg_compressibility" in first
        args = ["score", "--reward", "jpeg_compressibility=1", "--reward", "jpeg_incompressibility=0.5",
                "--images", str(tmp_path / "batch.npy"), "--prompts", str(tmp_path / "prompts.txt")]
        out = subprocess.run([sys.executable, "-m", "reward_client", *args, "--enqueue-url", url + ENQUEUE_PATH,
                              "--fetch-url", url + PULL_PATH, "--token", TOKEN],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        remote = json.loads(out.stdout)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    local = _run_cli(args + ["--local"])
    comp, incomp, total = local_total(media, ["a cat", "a dog"], "video")
    for got in (remote, local):
        assert np.allclose(got["per_fn"]["jpeg_compressibility"], comp)
        assert np.allclose(got["total"], total, atol=1e-6)
    assert remote["uuids"] and not local["uuids"]


def _run_cli(argv):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    return json.loads(buf.getvalue())


def test_score_command_line_bad_input(tmp_path, capsys):
    np.save(tmp_path / "batch.npy", np.zeros((2, 8, 8, 3), np.uint8))
    (tmp_path / "prompts.txt").write_text("only one\n")
    argv = ["score", "--reward", "jpeg_compressibility=1", "--images", str(tmp_path / "batch.npy"),
            "--prompts", str(tmp_path / "prompts.txt"), "--local"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "1 prompts for 2 items" in err
    assert cli.main(argv[:-1] + ["--enqueue-url", "http://127.0.0.1:9/api/reward/enqueue"]) == 2
    assert "fetch_url" in capsys.readouterr().err


def test_reward_failing_on_the_server_is_reported_not_invented(server):
    from reward_client.errors import RewardServiceError

    @register_reward("t_broken")
    def broken(images, prompts, extras):
        raise ValueError("bad pixels")

    try:
        with RewardComputer([{"name": "t_broken", "local": False}], remote=fast_config(server.url)) as rc:
            with pytest.raises(RewardServiceError, match="'t_broken'.*ValueError: bad pixels"):
                rc.score(np.zeros((2, 4, 4, 3), np.uint8), ["a", "b"])
            assert rc.metrics()["failed_pulls"] == 1 and rc.ledger.unaccounted() == {}
    finally:
        unregister_reward("t_broken")
