"""Exceptions raised by reward_client; every message names the reward, key, uuid or URL at fault.
Bad configuration is a wfm_jax UserError, the rest RunFailures (core.errors imports no jax)."""
from wfm_jax.core.errors import RunFailure, UserError


class RewardError(RuntimeError):
    """Base class of every reward_client error."""


class RewardConfigError(RewardError, UserError, ValueError):
    """Bad configuration: unknown key, missing URL, unknown reward name, bad weight or clip."""


class RewardProtocolError(RewardError, RunFailure):
    """A request or response that does not follow the wire protocol (malformed JSON, missing field)."""


class RewardServiceError(RewardError, RunFailure):
    """The service gave a final answer that retrying cannot change (401, 413, unknown uuid, failed reward)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RewardUnavailableError(RewardError, RunFailure):
    """A reward could not be obtained within the attempt limit or the time budget."""


class RewardValueError(RewardError, RunFailure, ValueError):
    """Scores that cannot be used: missing key, wrong length, non-numeric, NaN or inf."""
