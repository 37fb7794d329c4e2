"""The VLM GRPO trainer's reward step (train/vlm_rewards.TextRewards, what VLMGRPOTrainer.rollout
calls): with use_remote_reward the reference server on loopback scores the completions, and the
weighted rewards equal the in-process ones and hand-computed sums; a reward the service fails is
one RewardError line, never a silently missing term; bad settings are one setup line."""
import numpy as np
import pytest

from reward_client import protocol
from reward_client.errors import RewardError
from wfm_jax.config.schema import default_config
from wfm_jax.train.vlm_rewards import TextRewards, VLMRewardError

pytest.importorskip("fastapi")

TOKEN = "vlm-tok"
COMPLETIONS = ["<think>a</think>\n\n<answer>B</answer>", "<answer>B</answer>",
               "<think>a</think>\n\n<answer>C</answer>", "B.", "<think>x</think>\n\n<answer>\\boxed{0.5}</answer>"]
REFERENCES = ["B", "B", "B", "B", "$\\frac{1}{2}$"]
PROMPTS = [f"question {i}" for i in range(5)]
# hand-written: format, single_choice, boxed_math per completion
FORMAT = [1, 0, 1, 0, 1]
CHOICE = [1, 1, 0, 0, 0]
MATH = [0, 0, 0, 0, 1]
WEIGHTS = (0.25, 2.0, 3.0)


def _config(srv=None, token=TOKEN):
    c = default_config()
    tp = c.train.train_policy
    tp.lm_grpo.rewards, tp.lm_grpo.reward_weights = ("format", "single_choice", "boxed_math"), WEIGHTS
    if srv is not None:
        tp.use_remote_reward = True
        tp.remote_reward.enqueue_url = srv.url + protocol.ENQUEUE_PATH
        tp.remote_reward.fetch_url = srv.url + protocol.PULL_PATH
        tp.remote_reward.token = token
        tp.remote_reward.budget_s = 20.0
    return c


@pytest.fixture(scope="module")
def server():
    from reward_client.background import BackgroundServer
    from reward_client.server import create_app, local_scorer

    score = local_scorer(4)

    def scorer(name, header, media):  # the real scorer, except one reward that crashes
        if name == "single_choice" and header["prompts"][0] == "crash":
            raise RuntimeError("model server out of memory")
        return score(name, header, media)

    with BackgroundServer(create_app(TOKEN, scorer=scorer)) as srv:
        yield srv


def test_remote_rewards_equal_local_and_the_weighted_sum(server):
    local = TextRewards.from_config(_config())
    remote = TextRewards.from_config(_config(server), environ={})
    assert not local.remote and remote.remote
    remote.check_reachable()
    want = WEIGHTS[0] * np.array(FORMAT) + WEIGHTS[1] * np.array(CHOICE) + WEIGHTS[2] * np.array(MATH)
    per_local, total_local = local.score(COMPLETIONS, PROMPTS, REFERENCES)
    per_remote, total_remote = remote.score(COMPLETIONS, PROMPTS, REFERENCES)
    remote.close()
    for name, hand in zip(("format", "single_choice", "boxed_math"), (FORMAT, CHOICE, MATH), strict=True):
        assert per_remote[name].tolist() == per_local[name].tolist() == hand, name
    assert np.array_equal(total_remote, total_local) and np.allclose(total_remote, want)
    assert np.allclose(want, [0.25 + 2, 2, 0.25, 0, 0.25 + 3])  # the weights really differ per reward


def test_a_failed_remote_reward_stops_with_one_line(server):
    remote = TextRewards.from_config(_config(server), environ={})
    with pytest.raises(RewardError, match=r"single_choice.*model server out of memory") as info:
        remote.score(["B"], ["crash"], ["B"])
    remote.close()
    assert "\n" not in str(info.value)
    bad_token = TextRewards.from_config(_config(server, token="wrong"), environ={})
    with pytest.raises(RewardError, match="HTTP 401"):
        bad_token.check_reachable()


def test_bad_remote_settings_are_one_setup_line(server):
    c = _config(server)
    c.train.train_policy.remote_reward.enqueue_url = ""
    c.train.train_policy.remote_reward.fetch_url = ""
    with pytest.raises(VLMRewardError, match="no reward service is set"):
        TextRewards.from_config(c, environ={})
    c = _config(server)
    c.train.train_policy.lm_grpo.reward_weights = (0.0, 1.0, 1.0)  # weight 0 means 'skip' to a service
    with pytest.raises(VLMRewardError, match=r"remote_reward: reward 'format': weight 0.0 must be"):
        TextRewards.from_config(c, environ={})
    c.train.train_policy.lm_grpo.rewards = ("format", "jpeg_compressibility", "boxed_math")
    with pytest.raises(VLMRewardError, match=r"\['jpeg_compressibility'\] score pixels, not text"):
        TextRewards.from_config(c, environ={})
