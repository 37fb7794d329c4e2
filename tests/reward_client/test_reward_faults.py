"""RewardComputer against a fault-injecting reward service: every fault is retried or reported as
specified, every uuid the client received is pulled or reported, and every test is bounded."""
import json
import socket
import threading
import time
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import numpy as np
import pytest

from reward_client.computer import RewardComputer
from reward_client.config import RemoteConfig
from reward_client.errors import RewardServiceError, RewardUnavailableError, RewardValueError
from reward_client.protocol import ENQUEUE_PATH, PULL_PATH, decode_enqueue

FNS = [{"name": "alpha", "weight": 2.0}, {"name": "beta", "weight": 0.5, "score_key": "b1+b2", "clip": 1.0}]


class FaultService:
    """Scripted service: ``script[endpoint]`` is a list of faults consumed one per request, then it
    answers normally. Faults: int (HTTP status), ("delay", s), "malformed", "html", "not_ready"."""

    def __init__(self, port=0):
        self.script = {"enqueue": [], "pull": []}
        self.requests = {"enqueue": 0, "pull": 0}
        self.issued, self.pulled = [], []
        self.batches = {}
        self.values = {}  # (reward name -> {key: list}) overrides, e.g. NaN injection
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                endpoint = "enqueue" if self.path == ENQUEUE_PATH else "pull"
                with service.lock:
                    service.requests[endpoint] += 1
                    fault = service.script[endpoint].pop(0) if service.script[endpoint] else None
                try:
                    self.answer(endpoint, body, fault)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on a delayed answer

            def send(self, status, payload: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def answer(self, endpoint, body, fault):
                if isinstance(fault, tuple):
                    time.sleep(fault[1])
                elif isinstance(fault, int):
                    return self.send(fault, b'{"detail": "injected"}')
                elif fault == "malformed":
                    return self.send(200, b'{"uuid": "trunc')
                elif fault == "html":
                    return self.send(200, b"<html>502 Bad Gateway</html>")
                elif fault == "not_ready":
                    return self.send(400, b'{"detail": "not ready"}')
                if endpoint == "enqueue":
                    header, media = decode_enqueue(body)
                    uid = str(uuidlib.uuid4())
                    with service.lock:
                        service.issued.append(uid)
                        service.batches[uid] = len(header["prompts"])
                    return self.send(200, json.dumps({"uuid": uid}).encode())
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                batch = service.batches[form["uuid"]]
                with service.lock:
                    service.pulled.append((form["uuid"], form["type"]))
                scores = service.values.get(form["type"]) or service.default_scores(form["type"], batch)
                self.send(200, json.dumps({"scores": scores, "type": form["type"]}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @staticmethod
    def default_scores(name, batch):
        i = np.arange(batch, dtype=float)
        if name == "alpha":
            return {"alpha": (0.1 * i - 0.2).tolist()}
        return {"b1": (0.3 * i).tolist(), "b2": (0.05 * i + 0.1).tolist(), "extra": ["text"] * batch}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def expected_total(batch):
    i = np.arange(batch, dtype=float)
    return np.clip(2.0 * (0.1 * i - 0.2) + 0.5 * np.clip(0.3 * i + 0.05 * i + 0.1, -1, 1), -5, 5)


def config(url, **kw):
    base = dict(connect_timeout_s=2.0, enqueue_timeout_base_s=0.0, enqueue_timeout_per_mb_s=0.0,
                enqueue_timeout_min_s=5.0, enqueue_timeout_max_s=5.0, pull_timeout_s=5.0, max_attempts=6,
                backoff_initial_s=0.02, backoff_max_s=0.1, poll_initial_s=0.01, poll_max_s=0.03, budget_s=15.0)
    base.update(kw)
    return RemoteConfig(url + ENQUEUE_PATH, url + PULL_PATH, **base)


@pytest.fixture
def service():
    svc = FaultService()
    yield svc
    svc.close()


BATCH = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
PROMPTS = ["a", "b", "c", "d"]


def run(service, faults, on_failure="raise", group_ids=None, **kw):
    service.script = {k: list(faults.get(k, [])) for k in ("enqueue", "pull")}
    rc = RewardComputer(FNS, remote=config(service.url, **kw), on_failure=on_failure)
    try:
        handle = rc.submit(BATCH, PROMPTS, group_ids=group_ids)
        try:
            return handle.result(timeout=60), rc
        finally:
            report = rc.close()
            assert report == {"uncollected": [], "unaccounted": {}}  # every uuid pulled or reported
    finally:
        rc.close()


def assert_accounted(service, res):
    assert res.uuids and set(res.uuids) <= set(service.issued)
    assert sorted(service.pulled) == sorted((u, n) for u in res.uuids for n in ("alpha", "beta"))


SHORT_TIMEOUTS = dict(enqueue_timeout_min_s=0.5, enqueue_timeout_max_s=0.5, pull_timeout_s=0.5)


@pytest.mark.parametrize("faults, timeouts", [
    ({"enqueue": [500, 503], "pull": [502]}, {}),
    ({"enqueue": [("delay", 2.0)], "pull": [("delay", 2.0)]}, SHORT_TIMEOUTS),  # answers after the timeout
    ({"pull": ["not_ready"] * 7}, {}),                                          # N polls of 400 first
    ({"enqueue": ["malformed"], "pull": ["html", "malformed"]}, {}),
], ids=["5xx", "timeouts", "not_ready", "malformed"])
def test_transient_faults_are_retried(service, faults, timeouts):
    res, rc = run(service, faults, **timeouts)
    assert np.allclose(res.total, expected_total(4), atol=1e-6) and res.keep.all()
    assert np.allclose(res.per_fn["beta"], 0.35 * np.arange(4) + 0.1)
    assert_accounted(service, res)
    assert not service.script["enqueue"] and not service.script["pull"]  # every fault was met
    assert service.requests["pull"] >= 2 + len(faults.get("pull", []))
    assert rc.metrics()["pulled"] == 2 and rc.metrics()["failed_pulls"] == 0


def test_connection_refused_then_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = RewardComputer(FNS, remote=config(f"http://127.0.0.1:{port}", max_attempts=1000))
    handle = rc.submit(BATCH, PROMPTS)  # nothing listens yet: connection refused, retried
    time.sleep(0.4)
    assert not handle.done()
    service = FaultService(port)
    try:
        res = handle.result(timeout=30)
        assert np.allclose(res.total, expected_total(4), atol=1e-6)
        assert_accounted(service, res)
    finally:
        rc.close()
        service.close()


@pytest.mark.parametrize("faults, budget_s, fragment", [
    ({"pull": [500] * 50}, 15.0, "gave up after 6 failed attempts; last error: HTTP 500"),
    ({"pull": ["malformed"] * 50}, 15.0, "not JSON"),
    ({"pull": ["not_ready"] * 10_000}, 1.5, "no result within the 1.5 s budget"),
], ids=["5xx", "malformed", "never_ready"])
def test_persistent_faults_fail_naming_reward_and_uuid(service, faults, budget_s, fragment):
    with pytest.raises(RewardUnavailableError, match=fragment) as info:
        run(service, faults, budget_s=budget_s)
    uid = service.issued[0]
    assert f"'alpha' for uuid {uid}" in str(info.value)  # the first pull that failed
    assert "beta" in str(info.value)  # the other reward was still pulled (or tried) and reported


def test_unauthorised_is_final_and_not_retried(service):
    with pytest.raises(RewardServiceError, match="rejected the token"):
        run(service, {"enqueue": [401]})
    assert service.requests["enqueue"] == 1
    rc = RewardComputer(FNS, remote=config(service.url))
    service.script["enqueue"] = [401]
    with pytest.raises(RewardServiceError):
        rc.client.enqueue(BATCH, PROMPTS, {"alpha": 1.0})
    rc.close()


def test_nan_scores_are_rejected_by_name(service):
    service.values["beta"] = {"b1": [0.0, float("nan"), 0.0, 0.0], "b2": [0.0, 0.0, float("inf"), 0.0]}
    with pytest.raises(RewardValueError, match=r"'beta' key 'b1': NaN/inf scores at samples \[1\]") as info:
        run(service, {})
    assert "'b2'" in str(info.value) and service.issued[0] in str(info.value)


def test_drop_policy_drops_affected_groups_and_counts_them(service):
    service.values["alpha"] = {"alpha": [0.5, 0.25, float("nan"), 1.0]}
    res, rc = run(service, {}, on_failure="drop", group_ids=[7, 7, 8, 8])
    assert res.keep.tolist() == [True, True, False, False] and res.dropped_groups == 1
    assert np.isnan(res.total[2:]).all() and np.isnan(res.per_fn["alpha"][2:]).all()  # nothing invented
    i = np.arange(2, dtype=float)
    want = np.clip(2.0 * np.array([0.5, 0.25]) + 0.5 * np.clip(0.35 * i + 0.1, -1, 1), -5, 5)
    assert np.allclose(res.total[:2], want, atol=1e-6)
    assert rc.metrics()["dropped_groups"] == 1 and rc.metrics()["dropped_samples"] == 2
    assert "alpha" in res.failures[0]


def test_drop_policy_when_the_service_is_down(service):
    res, rc = run(service, {"enqueue": [503] * 50}, on_failure="drop", group_ids=[0, 0, 1, 2], budget_s=2.0)
    assert not res.keep.any() and res.dropped_groups == 3 and np.isnan(res.total).all()
    assert not res.uuids and not service.issued and rc.metrics()["failed_batches"] == 1


def test_submit_returns_before_results_arrive(service):
    service.script["pull"] = ["not_ready"] * 10_000
    rc = RewardComputer(FNS, remote=config(service.url))
    try:
        handle = rc.submit(BATCH, PROMPTS)
        for _ in range(200):
            if handle.uuids:
                break
            time.sleep(0.01)
        assert handle.uuids and not handle.done()  # enqueued; rollouts may continue meanwhile
        with service.lock:
            service.script["pull"] = []
        res = handle.result(timeout=30)
        assert np.allclose(res.total, expected_total(4), atol=1e-6) and res.uuids == handle.uuids
    finally:
        rc.close()
