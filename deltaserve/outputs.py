"""What generate() and the engine's step() hand back, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


# One entry per generated token: token id -> Logprob, the sampled token first, then the top ones.
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class RequestStateStats:
    """vLLM's: when one sampled sequence passed through the engine. arrival_time is wall-clock (time.time());
    the *_ts fields are time.perf_counter() on the engine's thread, 0.0 until they happen."""

    arrival_time: float = 0.0
    queued_ts: float = 0.0  # the engine took the request
    scheduled_ts: float = 0.0  # its first step was planned
    first_token_ts: float = 0.0  # its first output token was read back
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0

    @property
    def first_token_latency(self) -> float:
        return self.first_token_ts - self.queued_ts if self.first_token_ts else 0.0

    @property
    def queued_time(self) -> float:
        """Waiting for its first step (vLLM's request_queue_time)."""
        return self.scheduled_ts - self.queued_ts if self.scheduled_ts else 0.0

    @property
    def prefill_time(self) -> float:
        """From its first step to its first token."""
        return self.first_token_ts - self.scheduled_ts if self.first_token_ts else 0.0

    @property
    def decode_time(self) -> float:
        """From its first token to its last."""
        return self.last_token_ts - self.first_token_ts if self.first_token_ts else 0.0

    @property
    def inference_time(self) -> float:
        """From its first step to its last token."""
        return self.last_token_ts - self.scheduled_ts if self.first_token_ts else 0.0

    @property
    def mean_time_per_output_token(self) -> float:
        """Its decode time over the tokens after the first (0.0 with fewer than two)."""
        return self.decode_time / (self.num_generation_tokens - 1) if self.num_generation_tokens > 1 else 0.0

    @staticmethod
    def spanning(samples: list["RequestStateStats"]) -> "RequestStateStats":
        """One request's times over its samples: the earliest start of each phase, the latest last token, and
        the tokens of all."""
        def earliest(name: str) -> float:
            return min((t for t in (getattr(s, name) for s in samples) if t), default=0.0)

        return RequestStateStats(arrival_time=earliest("arrival_time"), queued_ts=earliest("queued_ts"),
                                 scheduled_ts=earliest("scheduled_ts"), first_token_ts=earliest("first_token_ts"),
                                 last_token_ts=max(s.last_token_ts for s in samples),
                                 num_generation_tokens=sum(s.num_generation_tokens for s in samples))


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    logprobs: SampleLogprobs | None = None
    metrics: RequestStateStats | None = None  # once this sample has finished: its times in the engine
    # vLLM's, for its code to read: no LoRA adapter, no expert routing kept
    lora_request: None = None
    routed_experts: None = None

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
    # vLLM's, once the request has finished: its sample's times in the engine (with n > 1, spanning them all:
    # each sample's own are its CompletionOutput.metrics)
    metrics: RequestStateStats | None = None
    # Why the engine ended it early, where the request itself was at fault (its outputs' finish_reason "abort"):
    # errors.NoTokenAllowedError where its constraints refused every token.
    error: Exception | None = None
    # vLLM's, for its code to read: no LoRA adapter, no encoder prompt (decoder-only models), no KV transfer
    lora_request: None = None
    encoder_prompt: None = None
    encoder_prompt_token_ids: None = None
    kv_transfer_params: None = None


@dataclass
class BeamSearchSequence:
    """vLLM's: one of a beam search's results. tokens: the prompt's and the generated ones (a stop token that ended
    it last); logprobs: each generated position's candidates; text: all of tokens decoded, as vLLM's."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" or "length"
    stop_reason: int | None = None


@dataclass
class BeamSearchOutput:
    """vLLM's: a prompt's best beams, best first."""

    sequences: list[BeamSearchSequence]
