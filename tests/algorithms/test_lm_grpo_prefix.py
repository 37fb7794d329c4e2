"""cosmos-rl's min_filter_prefix_tokens (lm_grpo.ignore_prefix_lengths): the expected lengths are
worked out by hand from its rule (reward/local_calculator.py + utils/util.find_maximal_prefix_groups):
the deepest trie nodes at depth >= N shared by 2+ completions, none of whose children is shared,
and only where those completions' rewards differ."""
import pytest

from wfm_jax.algorithms.lm_grpo import ignore_prefix_lengths

GROUP = [[1, 2, 3], [1, 2, 4], [5, 6], [5, 6]]


@pytest.mark.parametrize("completions, rewards, n, want", [
    # [1,2] is the maximal node of rows 0-1 (rewards differ); rows 2-3 are the prefix itself
    (GROUP, [1.0, 0.0, 1.0, 0.0], 1, [2, 2, 0, 0]),
    (GROUP, [1.0, 0.0, 1.0, 0.0], 3, [0, 0, 0, 0]),   # no shared node that deep
    (GROUP, [1.0, 0.0, 1.0, 0.0], None, [0, 0, 0, 0]),  # off
    (GROUP, [1.0, 1.0, 1.0, 1.0], 1, [0, 0, 0, 0]),   # equal rewards: a filtered group
    (GROUP, [1.0, 1.0, 0.0, 1.0], 1, [0, 0, 0, 0]),   # [1,2] shared with equal rewards
    # 'A' is shared by all four but its child D is shared too, so only [A, D] is a group:
    # rows 0 and 1 keep their 'A' in the loss, as cosmos-rl's trie walk does
    ([[7, 8], [7, 9], [7, 10, 11], [7, 10, 12]], [1.0, 0.0, 1.0, 0.0], 1, [0, 0, 2, 2]),
    ([[7, 8], [7, 9, 3]], [1.0, 0.0], 1, [1, 1]),
    ([[7], [7, 9, 3]], [1.0, 0.0], 1, [0, 1]),   # row 0 is the prefix itself: it keeps its token
])
def test_ignore_prefix_lengths(completions, rewards, n, want):
    assert ignore_prefix_lengths(completions, rewards, n) == want
