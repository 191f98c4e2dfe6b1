"""What generate() and the engine's step() hand back, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


# One entry per generated token: token id -> Logprob, the sampled token first, then the top ones.
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    logprobs: SampleLogprobs | None = None

    def finished(self) -> bool:
        """A method, as vLLM's (RequestOutput.finished is a field)."""
        return self.finish_reason is not None

    @property
    def cumulative_logprob(self) -> float | None:
        """vLLM's: the sum of the sampled tokens' logprobs, where the request asked for logprobs (else None)."""
        if self.logprobs is None:
            return None
        return sum(entry[token].logprob for entry, token in zip(self.logprobs, self.token_ids))


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    metrics: dict = field(default_factory=dict)
    # Why the engine ended it early, where the request itself was at fault (its outputs' finish_reason "abort"):
    # errors.NoTokenAllowedError where its constraints refused every token.
    error: Exception | None = None
