"""cosmos-rl's text rewards (format, single_choice, boxed_math, direct_math, gsm8k) on tables of
tricky answers, and the text payload through the local path, the wire format and the server."""
import threading

import numpy as np
import pytest

from reward_client import protocol
from reward_client.catalog import score_local
from reward_client.computer import RewardComputer
from reward_client.errors import RewardProtocolError, RewardUnavailableError, RewardValueError
from reward_client.reason import (
    REASON2_FORMAT_PATTERN,
    boxed_math_reward,
    direct_math_reward,
    format_reward,
    gsm8k_reward,
    single_choice_reward,
)

GOOD = "<think>The red circle is in the top-left cell.</think>\n\n<answer>B</answer>"

# (completion, cosmos-rl format, Reason2-style format); spec reason2.md 4.3
FORMAT_TABLE = [
    (GOOD, 1.0, 1.0),
    (GOOD + "\n", 1.0, 1.0),  # `$` tolerates one final newline
    (GOOD + "\n\n", 0.0, 1.0),  # but not two
    (" " + GOOD, 0.0, 0.0),  # must start with <think>
    ("<think>a</think>\n<answer>B</answer>", 0.0, 0.0),  # one newline between the blocks
    ("<think>a</think><answer>B</answer>", 0.0, 0.0),
    ("<answer>B</answer>", 0.0, 0.0),  # missing think
    ("<think>a</think>\n\n", 0.0, 0.0),  # missing answer
    ("<think>a</think>\n\n<answer>B", 0.0, 1.0),  # unclosed answer tag
    ("<think>a<think>b</think>\n\n<answer>B</answer>", 0.0, 0.0),  # nested think
    ("<think>a</think>c</think>\n\n<answer>B</answer>", 0.0, 0.0),  # second </think>
    ("<think>if a < b then</think>\n\n<answer>B</answer>", 1.0, 1.0),  # a bare '<' is fine
    ("<think>see <thinking></think>\n\n<answer>B</answer>", 1.0, 1.0),  # only think tags are banned
    ("<think></think>\n\n<answer></answer>", 1.0, 1.0),  # empty blocks still match
    ("<think>a</think>\n\n<answer>B</answer><answer>C</answer>", 1.0, 1.0),  # two answers: lazy group spans
    ("<think>a</think>\n\n<answer>B</answer> done", 0.0, 1.0),  # text after the answer
    ("<think>\nline1\nline2\n</think>\n\n<answer>\nB\n</answer>", 1.0, 1.0),
    ("<think>a</think>\n\nB", 0.0, 1.0),  # Reason2's bare answer: cosmos-rl's format says 0
    ("<think>a</think>\n\n   ", 0.0, 0.0),
    ("<think>a</think>\n\nB <think>again</think>", 0.0, 0.0),
]


@pytest.mark.parametrize(("completion", "cosmos", "reason2"), FORMAT_TABLE)
def test_format_table(completion, cosmos, reason2):
    assert format_reward(completion) == cosmos
    assert format_reward(completion, REASON2_FORMAT_PATTERN) == reason2


# (completion, reference, reward): stripped inside of the first <answer>, case-insensitive equality
SINGLE_CHOICE_TABLE = [
    (GOOD, "B", 1.0),
    (GOOD, "b", 1.0),
    ("<answer> b </answer>", "B", 1.0),
    ("<answer>\nB\n</answer>", "<answer>B</answer>", 1.0),  # reference with tags too
    ("B", "B", 1.0),  # no tags: the whole stripped completion
    ("  B\n", "B", 1.0),
    ("<answer>B.</answer>", "B", 0.0),  # punctuation is not stripped
    ("<answer>(B)</answer>", "B", 0.0),
    ("<answer>B)</answer>", "B", 0.0),
    ("<answer>B: red</answer>", "B", 0.0),
    ("<answer>Option B</answer>", "B", 0.0),
    ("<answer>A</answer><answer>B</answer>", "B", 0.0),  # two answers: the first counts
    ("<answer>B</answer><answer>A</answer>", "B", 1.0),
    ("<answer>B</answer", "B", 0.0),  # broken tag: the whole text is compared
    ("<think>B</think>", "B", 0.0),  # missing answer tag
    ("<answer></answer>", "B", 0.0),
    ("<answer>red</answer>", "Red", 1.0),
]


@pytest.mark.parametrize(("completion", "reference", "reward"), SINGLE_CHOICE_TABLE)
def test_single_choice_table(completion, reference, reward):
    assert single_choice_reward(completion, reference) == reward


# (completion, reference, reward) as math-verify's math_metric (gold LaTeX; pred Expr, LaTeX) scores
BOXED_TABLE = [
    ("so the answer is \\boxed{0.5}", "$\\frac{1}{2}$", 1.0),
    ("the answer is \\boxed{1/2}", "\\boxed{\\frac{1}{2}}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "$\\frac{3}{4}$", 1.0),
    ("\\boxed{\\frac34}", "$\\frac{3}{4}$", 1.0),  # shorthand fraction
    ("\\boxed{\\frac{2}{4}}", "$\\frac{1}{2}$", 1.0),  # unreduced
    ("\\boxed{\\frac{1}{3}}", "$\\frac{1}{2}$", 0.0),
    ("\\boxed{5 \\text{ cm}}", "$5$", 1.0),  # units
    ("\\boxed{5^\\circ}", "$5$", 1.0),
    ("\\boxed{\\$5}", "$5$", 1.0),
    ("\\boxed{10\\%}", "$10\\%$", 1.0),
    ("\\boxed{2}", "$x=2$", 1.0),
    ("\\boxed{(2,1)}", "$(1,2)$", 0.0),  # ordered pair
    ("\\boxed{6}", "$5$", 0.0),
    ("no answer here", "$5$", 0.0),
    ("\\boxed{5}", "5", 0.0),  # a gold without LaTeX delimiters does not parse: cosmos-rl scores 0
    ("<think>x</think>\n\n<answer>5</answer>", "$5$", 0.0),
]


@pytest.mark.parametrize(("completion", "reference", "reward"), BOXED_TABLE)
def test_boxed_math_table_and_cosmos_call(completion, reference, reward):
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    assert boxed_math_reward(completion, reference) == reward
    cosmos = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:  # the exact call cosmos-rl makes, errors scored 0 as it does
        expected = cosmos([reference], [completion])[0]
    except Exception:
        expected = 0.0
    assert expected == reward


def test_boxed_math_off_the_main_thread():
    """math-verify's signal timeouts refuse worker threads; the reward must still score there."""
    got = {}
    thread = threading.Thread(target=lambda: got.update(
        {i: boxed_math_reward(c, r) for i, (c, r, _) in enumerate(BOXED_TABLE)}))
    thread.start()
    thread.join()
    assert [got[i] for i in range(len(BOXED_TABLE))] == [r for _, _, r in BOXED_TABLE]


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("work...\nAnswer: $\\frac12$", "\\frac{1}{2}", 1.0),
    ("Answer: 1,000 dollars", "1000", 1.0),
    ("Answer: 3\nanswer: 4", "4", 1.0),  # the last Answer line
    ("Answer: x = 7", "7", 1.0),
    ("the result is 4", "4", -1.0),
    ("Answer: 5", "4", -1.0),
])
def test_direct_math_table(completion, reference, reward):
    assert direct_math_reward(completion, reference) == reward


@pytest.mark.parametrize(("completion", "reference", "reward"), [
    ("so #### 1,000", "#### 1000", 1.0),
    ("#### -3", "steps\n#### -3", 1.0),
    ("#### 3 then #### 4", "#### 4", 0.0),  # the first match counts
    ("42", "#### 42", 0.0),
    ("no number", "no number either", 1.0),  # cosmos-rl compares None == None
])
def test_gsm8k_table(completion, reference, reward):
    assert gsm8k_reward(completion, reference) == reward


COMPLETIONS = [GOOD, "<answer>B</answer>", "<think>x</think>\n\n<answer>C</answer>", "B."]
REFS = ["B", "B", "B", "B"]


def test_local_rewards_combine_by_weight():
    fns = [{"name": "single_choice", "weight": 0.9}, {"name": "format", "weight": 0.1}]
    with RewardComputer(fns) as rc:
        res = rc.score(COMPLETIONS, ["q"] * 4, extras={"references": REFS})  # list -> media_type text
    assert res.per_fn["single_choice"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert res.per_fn["format"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert np.allclose(res.total, [1.0, 0.9, 0.1, 0.0]) and res.keep.all()


def test_text_payload_wire_round_trip():
    media = protocol.text_media(["<answer>é</answer>", "", "two\nlines"])
    header = protocol.build_header(["p1", "p2", "p3"], {"single_choice": 1.0}, "text",
                                   {"references": ["é", "x", "y"]})
    got_header, got_media = protocol.decode_enqueue(protocol.encode_enqueue(header, media))
    assert got_header["media_type"] == "text" and got_header["references"] == ["é", "x", "y"]
    assert got_media.tolist() == ["<answer>é</answer>", "", "two\nlines"]
    assert protocol.infer_media_type(got_media) == "text"
    with pytest.raises(RewardProtocolError, match="1-D array of strings"):
        protocol.check_media(np.zeros((2, 4, 4, 3), np.uint8), "text")
    with pytest.raises(RewardProtocolError, match="one string"):
        protocol.text_media("just one")


def test_text_through_the_reference_server():
    pytest.importorskip("fastapi")
    from reward_client.background import BackgroundServer
    from reward_client.config import RemoteConfig
    from reward_client.server import create_app

    with BackgroundServer(create_app("tok")) as srv:
        cfg = RemoteConfig(srv.url + protocol.ENQUEUE_PATH, srv.url + protocol.PULL_PATH, token="tok",
                           budget_s=20.0, poll_initial_s=0.01, poll_max_s=0.05)
        fns = [{"name": "single_choice", "weight": 1.0}, {"name": "boxed_math", "weight": 2.0}]
        with RewardComputer(fns, remote=cfg) as rc:
            res = rc.score(["<answer>B</answer>", "\\boxed{\\frac{1}{2}}"], ["q1", "q2"],
                           extras={"references": ["b", "$0.5$"]})
    assert res.per_fn["single_choice"].tolist() == [1.0, 0.0]
    assert res.per_fn["boxed_math"].tolist() == [0.0, 1.0]
    assert np.allclose(res.total, [1.0, 2.0]) and len(res.uuids) == 1


def test_bad_text_inputs_name_the_problem():
    text = protocol.text_media(["<answer>B</answer>"])
    with pytest.raises(RewardValueError, match="references"):
        score_local("single_choice", text, ["q"], media_type="text")
    with pytest.raises(RewardValueError, match=r"has 2 entries for 1 completions"):
        score_local("single_choice", text, ["q"], media_type="text", extras={"references": ["A", "B"]})
    with pytest.raises(RewardValueError, match="scores images or videos"):
        score_local("jpeg_compressibility", text, ["q"], media_type="text")
    with pytest.raises(RewardValueError, match="scores text completions"):
        score_local("format", np.zeros((1, 8, 8, 3), np.uint8), ["q"], media_type="image")
    with RewardComputer([{"name": "single_choice"}]) as rc, \
            pytest.raises(RewardUnavailableError, match="references"):
        rc.score(["B"], ["q"])
    assert score_local("format", text, ["q"], media_type="text")["format"].tolist() == [0.0]


def test_score_cli_on_text(tmp_path, capsys):
    import json

    from reward_client import __main__ as cli

    (tmp_path / "c.json").write_text(json.dumps([GOOD, "<answer>a</answer>"]))
    (tmp_path / "r.json").write_text(json.dumps(["B", "B"]))
    (tmp_path / "p.txt").write_text("q1\nq2\n")
    args = ["score", "--reward", "single_choice=1", "--reward", "format=0.5", "--local",
            "--completions", str(tmp_path / "c.json"), "--references", str(tmp_path / "r.json"),
            "--prompts", str(tmp_path / "p.txt")]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == [1.5, 0.0] and out["per_fn"]["format"] == [1.0, 0.0]
    (tmp_path / "r.json").write_text(json.dumps(["B"]))
    assert cli.main(args) == 2
    assert "--references has 1 answers for 2 completions" in capsys.readouterr().err
