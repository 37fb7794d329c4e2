"""Interoperability with cosmos-rl's reward client and service (issue 18, item 1): torch.save
bodies, nested score dicts, GenEval metadata keys, per-function clipping, dropped tasks, a
missing media_type and NaN scores. Real HTTP on loopback: the reference server or the scripted
FaultService."""
import io
import json

import numpy as np
import pytest
import requests

from reward_client import protocol
from reward_client.background import BackgroundServer
from reward_client.computer import RewardComputer
from reward_client.errors import RewardConfigError, RewardUnavailableError, RewardValueError
from reward_client.protocol import ENQUEUE_PATH, PULL_PATH, build_header, encode_enqueue
from reward_client.registry import register_reward, unregister_reward
from reward_client.server import create_app
from tests.reward_client.test_reward_faults import FaultService
from tests.reward_client.test_reward_faults import config as fault_config
from tests.reward_client.test_reward_server import TOKEN, fast_config, local_total

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(TOKEN, max_body_bytes=4 << 20, max_queue=8)) as srv:
        yield srv


@pytest.fixture
def service():
    svc = FaultService()
    yield svc
    svc.close()


def _pull(url, uuid, name, tries=200):
    for _ in range(tries):
        resp = requests.post(url + PULL_PATH, data={"uuid": uuid, "type": name}, headers=AUTH, timeout=10)
        if resp.status_code != 400:
            return resp
    raise AssertionError("result never ready")


def _torch_body(header, tensor):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save(tensor, buf)  # what cosmos-rl's video example and latency benchmark send
    return json.dumps(header).encode() + b"\n" + buf.getvalue()


# -- torch.save payloads ------------------------------------------------------------------------

def test_torch_save_body_is_scored_when_torch_is_available(server):
    torch = pytest.importorskip("torch")
    video = np.random.default_rng(1).integers(0, 256, (2, 3, 4, 16, 16), dtype=np.uint8)
    header = build_header(["a", "b"], {"jpeg_compressibility": 1.0}, "video")
    resp = requests.post(server.url + ENQUEUE_PATH, data=_torch_body(header, torch.from_numpy(video)),
                         headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    scores = _pull(server.url, resp.json()["uuid"], "jpeg_compressibility").json()["scores"]
    comp, _, _ = local_total(video, ["a", "b"], "video")
    assert np.allclose(scores["jpeg_compressibility"], comp)


def test_torch_save_body_without_torch_is_a_clear_4xx(server, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(protocol, "_import_torch", lambda: None)
    header = build_header(["a"], {"jpeg_compressibility": 1.0}, "image")
    resp = requests.post(server.url + ENQUEUE_PATH, headers=AUTH, timeout=30,
                         data=_torch_body(header, torch.zeros((1, 8, 8, 3), dtype=torch.uint8)))
    assert resp.status_code == 422 and "torch.save" in resp.json()["detail"]
    assert "np.save" in resp.json()["detail"]


def test_other_archives_and_objects_are_4xx_not_5xx(server):
    pytest.importorskip("torch")
    header = build_header(["a"], {"jpeg_compressibility": 1.0}, "image")
    npz = io.BytesIO()
    np.savez(npz, x=np.zeros((1, 8, 8, 3), np.uint8))
    for payload in (npz.getvalue(), _torch_body(header, {"not": "a tensor"}).split(b"\n", 1)[1]):
        body = json.dumps(header).encode() + b"\n" + payload
        resp = requests.post(server.url + ENQUEUE_PATH, data=body, headers=AUTH, timeout=30)
        assert resp.status_code == 422, resp.text


# -- nested extras in 'scores' (cosmos-rl's gen_eval) -------------------------------------------

GEN_EVAL = {"gen_eval_score": [0.5, 1.0, 0.0, 0.25], "gen_eval_reward": [0.4, 0.9, 0.1, 0.2],
            "gen_eval_strict": [0.0, 1.0, 0.0, 0.0],
            "gen_eval_group": {"single_object": [0.4, 0.9, 0.1, 0.2], "counting": [-10.0] * 4}}
BATCH = np.zeros((4, 8, 8, 3), np.uint8)


def test_nested_score_dicts_are_accepted_and_exposed(service):
    service.values["gen_eval"] = GEN_EVAL
    fns = [{"name": "gen_eval", "score_key": "gen_eval_reward"}]
    with RewardComputer(fns, remote=fault_config(service.url, budget_s=5.0)) as rc:
        res = rc.score(BATCH, list("abcd"))
    assert np.allclose(res.per_fn["gen_eval"], GEN_EVAL["gen_eval_reward"])
    assert service.requests["pull"] == 1  # accepted at once, not retried as malformed
    fns = [{"name": "gen_eval", "score_key": "gen_eval_group.counting", "clip": None}]
    with RewardComputer(fns, remote=fault_config(service.url, budget_s=5.0), clip=None) as rc:
        assert rc.score(BATCH, list("abcd")).total.tolist() == [-10.0] * 4


def test_malformed_per_sample_lists_are_still_rejected(service):
    service.values["gen_eval"] = dict(GEN_EVAL, gen_eval_reward=["x", 1.0, 0.0, 0.0])
    with RewardComputer([{"name": "gen_eval", "score_key": "gen_eval_reward"}],
                        remote=fault_config(service.url, budget_s=5.0)) as rc:
        with pytest.raises(RewardValueError, match="non-numeric"):
            rc.score(BATCH, list("abcd"))
    service.values["gen_eval"] = dict(GEN_EVAL, gen_eval_reward=[0.1, 0.2])
    with RewardComputer([{"name": "gen_eval", "score_key": "gen_eval_reward"}],
                        remote=fault_config(service.url, budget_s=5.0)) as rc:
        with pytest.raises(RewardValueError, match="2 values for a batch of 4"):
            rc.score(BATCH, list("abcd"))


# -- GenEval metadata in the keys the service reads ---------------------------------------------

GENEVAL_META = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a red car"},
]


def test_prompt_extras_sends_geneval_metadata_as_the_service_reads_it():
    extras = protocol.prompt_extras(GENEVAL_META)
    assert extras["geneval_tags"] == ["single_object", "colors"]
    assert extras["geneval_includes"] == [m["include"] for m in GENEVAL_META]
    assert extras["metadata"] == GENEVAL_META  # still there for local rewards
    assert "geneval_tags" not in protocol.prompt_extras([{"source": "x"}, {"source": "y"}])
    assert protocol.prompt_extras([{}, {}]) is None


def test_geneval_keys_reach_the_reward_on_the_server(server):
    seen = {}

    @register_reward("t_geneval")
    def geneval_like(images, prompts, extras):
        seen.update(extras)
        return [float(len(inc)) for inc in extras["geneval_includes"]]

    try:
        with RewardComputer([{"name": "t_geneval", "local": False}], remote=fast_config(server.url)) as rc:
            res = rc.score(np.zeros((2, 8, 8, 3), np.uint8), [m["prompt"] for m in GENEVAL_META],
                           extras=protocol.prompt_extras(GENEVAL_META))
        assert res.total.tolist() == [1.0, 1.0]
        assert seen["geneval_tags"] == ["single_object", "colors"]
    finally:
        unregister_reward("t_geneval")


# -- per-function clipping (cosmos-rl clip_min / clip_max, default [-5, 5]) ---------------------

def test_per_function_clip_defaults_to_cosmos_rl_and_takes_clip_min_max():
    @register_reward("t_big")
    def big(images, prompts, extras):
        return np.array([10.0, -10.0, 1.0])

    try:
        media, prompts = np.zeros((3, 4, 4, 3), np.uint8), ["a", "b", "c"]
        with RewardComputer([{"name": "t_big", "weight": 0.5}], clip=None) as rc:
            assert rc.score(media, prompts).total.tolist() == [2.5, -2.5, 0.5]  # clip(s, -5, 5) * w
        with RewardComputer([{"name": "t_big", "weight": 0.5, "clip_min": 0.0, "clip_max": 2.0}],
                            clip=None) as rc:
            assert rc.score(media, prompts).total.tolist() == [1.0, 0.0, 0.5]
        with RewardComputer([{"name": "t_big", "weight": 0.5, "clip": None}], clip=None) as rc:
            assert rc.score(media, prompts).total.tolist() == [5.0, -5.0, 0.5]
        with pytest.raises(RewardConfigError, match="clip_min"):
            RewardComputer([{"name": "t_big", "clip": 1.0, "clip_min": 0.0}])
    finally:
        unregister_reward("t_big")


# -- a task the service silently dropped --------------------------------------------------------

def test_never_ready_names_the_likely_causes_and_the_budget_key(service):
    service.script["pull"] = ["not_ready"] * 10_000
    with RewardComputer([{"name": "alpha"}], remote=fault_config(service.url, budget_s=1.0)) as rc:
        with pytest.raises(RewardUnavailableError) as info:
            rc.score(BATCH, list("abcd"))
    msg = str(info.value)
    assert "no result within the 1 s budget" in msg and "budget_s" in msg
    for cause in ("unknown reward name", "payload", "crashed", "restart"):
        assert cause in msg


def test_start_up_check_names_rewards_the_service_does_not_serve(server):
    with RewardComputer([{"name": "pickscore", "local": False}], remote=fast_config(server.url)) as rc:
        with pytest.raises(RewardConfigError, match="does not serve \\['pickscore'\\]"):
            rc.check_reachable()


# -- missing media_type, NaN scores -------------------------------------------------------------

def test_missing_media_type_is_refused_not_guessed(server):
    header = {"prompts": ["a"], "reward_fn": {"jpeg_compressibility": 1.0}}
    body = encode_enqueue(header, np.zeros((1, 8, 8, 3), np.uint8))
    resp = requests.post(server.url + ENQUEUE_PATH, data=body, headers=AUTH, timeout=10)
    assert resp.status_code == 422 and "media_type" in resp.json()["detail"]


def test_nan_scores_go_out_as_null_and_are_rejected_by_name(server):
    @register_reward("t_nan")
    def nan_reward(images, prompts, extras):
        return np.array([np.nan, 1.0])

    def no_constants(token):
        raise AssertionError(f"bare {token} token in the JSON answer")

    try:
        body = encode_enqueue(build_header(["a", "b"], {"t_nan": 1.0}, "image"), np.zeros((2, 4, 4, 3), np.uint8))
        uuid = requests.post(server.url + ENQUEUE_PATH, data=body, headers=AUTH, timeout=10).json()["uuid"]
        resp = _pull(server.url, uuid, "t_nan")
        assert json.loads(resp.text, parse_constant=no_constants)["scores"]["t_nan"] == [None, 1.0]
        with RewardComputer([{"name": "t_nan", "local": False}], remote=fast_config(server.url)) as rc:
            with pytest.raises(RewardValueError, match=r"'t_nan'.*samples \[0\]"):
                rc.score(np.zeros((2, 4, 4, 3), np.uint8), ["a", "b"])
    finally:
        unregister_reward("t_nan")


def test_trainer_config_takes_clip_min_max_and_budget(service):
    from wfm_jax.config.recipe import ConfigError, from_tree, validate
    from wfm_jax.train.rl_setup import reward_config

    rr = "train.train_policy.remote_reward"
    config = validate(from_tree({
        "train.train_policy.type": "nft", "train.train_policy.use_remote_reward": True,
        "rollout.n_generation": 4,
        f"{rr}.enqueue_url": service.url + ENQUEUE_PATH, f"{rr}.fetch_url": service.url + PULL_PATH,
        f"{rr}.budget_s": 20.0,
        f"{rr}.reward_fns": [{"name": "alpha", "weight": 2.0, "clip_min": -0.1, "clip_max": 0.0}]}))
    with RewardComputer.from_config(reward_config(config)) as rc:
        assert rc.remote.budget_s == 20.0
        res = rc.score(BATCH, list("abcd"))  # alpha scores: 0.1 * i - 0.2
    assert np.allclose(res.total, 2.0 * np.clip(0.1 * np.arange(4) - 0.2, -0.1, 0.0))
    with pytest.raises(ConfigError, match="budget_s"):
        validate(from_tree({f"{rr}.budget_s": 0.0}))


def test_cosmos_rl_timeout_environment_variables():
    from reward_client.config import resolve_remote_config

    env = {"REMOTE_REWARD_ENQUEUE_URL": "http://h/api/reward/enqueue", "REMOTE_REWARD_FETCH_URL": "http://h/f",
           "REMOTE_REWARD_ENQUEUE_TIMEOUT_BASE_S": "7", "REMOTE_REWARD_ENQUEUE_TIMEOUT_PER_MB_S": "2",
           "REMOTE_REWARD_ENQUEUE_TIMEOUT_MIN_S": "9", "REMOTE_REWARD_ENQUEUE_CONNECT_TIMEOUT_S": "4"}
    cfg = resolve_remote_config(None, env)
    assert cfg.connect_timeout_s == 4.0 and cfg.enqueue_read_timeout(0) == 9.0
    assert cfg.enqueue_read_timeout(10_000_000) == 7.0 + 2.0 * 10.0
    fixed = resolve_remote_config({"connect_timeout_s": 1.0}, dict(env, REMOTE_REWARD_ENQUEUE_TIMEOUT_S="33"))
    assert fixed.enqueue_read_timeout(0) == fixed.enqueue_read_timeout(10**9) == 33.0
    assert fixed.connect_timeout_s == 1.0  # a config key wins over the environment
    with pytest.raises(RewardConfigError, match="REMOTE_REWARD_ENQUEUE_TIMEOUT_S='soon'"):
        resolve_remote_config(None, dict(env, REMOTE_REWARD_ENQUEUE_TIMEOUT_S="soon"))
