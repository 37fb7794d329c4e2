"""The one error type of the data pipelines: its message is one line naming the file or numbers."""
from wfm_jax.core.errors import UserError


class DataError(UserError, ValueError):
    """Bad dataset input: a missing directory, a JSON without "prompt", a corrupt image ..."""


class BadSample(DataError):
    """A sample whose media cannot be decoded; skippable with data.skip_bad_samples."""
