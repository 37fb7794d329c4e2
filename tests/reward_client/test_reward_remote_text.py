"""Text rewards through the reference server on loopback (media_type "text", wfm_jax's extension of
the cosmos-rl protocol): the scores equal the local functions' and hand-written expectations on
tricky completions; a wrong token is 401; rewards asked of the wrong media are one 422 line."""
import numpy as np
import pytest

from reward_client import protocol
from reward_client.catalog import score_local
from reward_client.client import RemoteRewardClient
from reward_client.config import RemoteConfig
from reward_client.errors import RewardProtocolError, RewardServiceError

pytest.importorskip("fastapi")

TOKEN = "text-tok"

# (completion, reference, format, single_choice): expectations from cosmos-rl's rules (reason.py)
CHOICE_TABLE = [
    ("<think>red is left</think>\n\n<answer>B</answer>", "B", 1.0, 1.0),
    ("<answer>B</answer>", "B", 0.0, 1.0),  # no think block
    ("<think>x</think>\n\n<answer>B.</answer>", "B", 1.0, 0.0),  # punctuation is compared
    ("<think>x</think>\n\n<answer>(B)</answer>", "B", 1.0, 0.0),
    ("<think>x</think>\n\n<answer> b </answer>", "B", 1.0, 1.0),  # stripped, any case
    # two answers: the format's lazy group spans both; single_choice reads the first
    ("<think>x</think>\n\n<answer>A</answer>\n<answer>B</answer>", "B", 1.0, 0.0),
    ("<think>a <think> b</think>\n\n<answer>B</answer>", "B", 0.0, 1.0),  # nested think
    ("B", "<answer>B</answer>", 0.0, 1.0),  # no tags: the whole text against the reference's answer
    ("<think>x</think><answer>B</answer>", "B", 0.0, 1.0),  # no blank line
    ("", "B", 0.0, 0.0),
    ("<think>é</think>\n\n<answer>Ü</answer>", "ü", 1.0, 1.0),  # non-ASCII survives the .npy
]
# (completion, LaTeX reference, boxed_math)
MATH_TABLE = [
    ("\\boxed{\\frac{1}{2}}", "$\\frac{1}{2}$", 1.0),
    ("\\boxed{0.5}", "$\\frac{1}{2}$", 1.0),  # equal values
    ("\\boxed{\\frac{2}{4}}", "$\\frac{1}{2}$", 1.0),
    ("\\boxed{\\frac{1}{3}}", "$\\frac{1}{2}$", 0.0),
    ("<think>x</think>\n\n<answer>\\boxed{3}</answer>", "$3$", 1.0),
    ("the answer is 7", "$7$", 1.0),  # a bare expression counts
    ("no answer", "$7$", 0.0),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 0.0),  # a reference outside $...$ is no LaTeX: no gold, 0
]


@pytest.fixture(scope="module")
def server():
    from reward_client.background import BackgroundServer
    from reward_client.server import create_app

    with BackgroundServer(create_app(TOKEN)) as srv:
        yield srv


def _client(srv, token=TOKEN) -> RemoteRewardClient:
    return RemoteRewardClient(RemoteConfig(srv.url + protocol.ENQUEUE_PATH, srv.url + protocol.PULL_PATH,
                                           token=token, budget_s=20.0, poll_initial_s=0.01, poll_max_s=0.05,
                                           max_attempts=2, backoff_initial_s=0.01))


def _remote(srv, completions, references, weights):
    client = _client(srv)
    receipt = client.enqueue_text(completions, [f"q{i}" for i in range(len(completions))], references, weights)
    return {name: client.pull(receipt.uuid, name, replica_id=receipt.replica_id).scores[name]
            for name in weights}


def _local(name, completions, references):
    return score_local(name, protocol.text_media(completions), ["q"] * len(completions),
                       media_type="text", extras={"references": references})[name].tolist()


def test_remote_choice_and_format_equal_local_and_expected(server):
    completions, refs, fmt, choice = (list(col) for col in zip(*CHOICE_TABLE, strict=True))
    got = _remote(server, completions, refs, {"format": 0.5, "single_choice": 2.0})
    assert got["format"] == fmt == _local("format", completions, refs)
    assert got["single_choice"] == choice == _local("single_choice", completions, refs)


def test_remote_boxed_math_equals_local_and_expected(server):
    completions, refs, want = (list(col) for col in zip(*MATH_TABLE, strict=True))
    got = _remote(server, completions, refs, {"boxed_math": 1.0})
    assert got["boxed_math"] == want == _local("boxed_math", completions, refs)


def test_wrong_token_is_401(server):
    with pytest.raises(RewardServiceError, match="rejected the token") as info:
        _client(server, token="nope").enqueue_text(["B"], ["q"], ["B"], {"single_choice": 1.0})
    assert info.value.status == 401


def test_reward_of_the_other_media_is_one_422_line(server):
    client = _client(server)
    with pytest.raises(RewardServiceError, match=r"jpeg_compressibility.*cannot score a media_type 'text'") \
            as info:
        client.enqueue_text(["B", "C"], ["q", "q"], ["B", "B"], {"single_choice": 1.0, "jpeg_compressibility": 1.0})
    assert info.value.status == 422 and "\n" not in str(info.value)
    with pytest.raises(RewardServiceError, match=r"'format'\] cannot score a media_type 'image'") as info:
        client.enqueue(np.zeros((1, 8, 8, 3), np.uint8), ["q"], {"format": 1.0})
    assert info.value.status == 422


def test_enqueue_text_checks_its_arguments(server):
    client = _client(server)
    with pytest.raises(RewardProtocolError, match="1 references for 2 completions"):
        client.enqueue_text(["B", "C"], ["q", "q"], ["B"], {"single_choice": 1.0})
    with pytest.raises(RewardProtocolError, match="one string"):
        client.enqueue_text("B", ["q"], ["B"], {"single_choice": 1.0})
