"""The three roots every wfm_jax error hangs from, so a front end needs no list of error classes.

A `UserError` is bad input (a recipe key, a model directory, a dataset, a checkpoint layout): the
CLIs print its message as one line and exit 2. A `RunFailure` is a run that started and then
could not go on (NaN loss, an unreachable reward service): one line, exit 1. The project's own
error classes keep their old builtin bases too (`class ConfigError(UserError, ValueError)`), so
`except ValueError` still catches them. No jax here: the reward server imports this module.
"""
from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_RUN_FAILURE = 1


class WfmError(Exception):
    """Base of every error wfm_jax raises on purpose; its message is one line."""


class UserError(WfmError):
    """Bad input: the message names the key, file or value at fault (exit 2)."""


class RunFailure(WfmError):
    """A run that started and stopped (exit 1)."""


def exit_code(error: BaseException) -> int | None:
    """The exit status for one of ours (2 bad input, 1 failed run); None for any other error."""
    if isinstance(error, UserError):
        return EXIT_USER_ERROR
    if isinstance(error, RunFailure):
        return EXIT_RUN_FAILURE
    return None
