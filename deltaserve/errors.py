"""Exception types, one per kind of problem; bad input is refused before any work is scheduled."""


class DeltaServeError(Exception):
    """Base of every error deltaserve raises on purpose."""


class UnsupportedArchitectureError(DeltaServeError):
    """config.json names an architecture deltaserve has no model class for."""


class WeightLoadError(DeltaServeError):
    """A weight file is missing, unreadable or lacks a tensor the model needs."""


class ShapeMismatchError(DeltaServeError):
    """A checkpoint tensor's shape does not match what the config implies."""


class InvalidPromptError(DeltaServeError):
    """The prompt is empty, malformed, or holds token ids outside the vocabulary."""


class PromptTooLongError(InvalidPromptError):
    """The prompt (plus the requested tokens, where that is checked) exceeds max_model_len."""

    def __init__(self, message: str, prompt_len: int, max_model_len: int):
        super().__init__(message)
        self.prompt_len = prompt_len
        self.max_model_len = max_model_len


class InvalidSamplingParamsError(DeltaServeError, ValueError):
    """A sampling value is out of its range or of the wrong type."""


class NoTokenAllowedError(InvalidSamplingParamsError):
    """A request's constraints together refuse every token at some point of its output (allowed_token_ids
    and min_tokens, bad words or a structured output): it cannot go on, and fails with this message."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.fields = fields


class RequestNotFoundError(DeltaServeError, KeyError):
    """abort() or a lookup named a request the engine does not hold."""


class StepFailedError(DeltaServeError):
    """A step failed inside the engine, which aborted the requests in it (the cause is chained)."""


class EngineDeadError(DeltaServeError):
    """The engine loop stopped after an internal failure and serves no more requests."""
