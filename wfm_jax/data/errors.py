"""The one error type of the data pipelines: its message is one line naming the file or numbers."""


class DataError(ValueError):
    """Bad dataset input: a missing directory, a JSON without "prompt", a corrupt image ..."""


class BadSample(DataError):
    """A sample whose media cannot be decoded; skippable with data.skip_bad_samples."""
