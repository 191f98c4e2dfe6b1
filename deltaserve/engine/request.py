"""Request: one sequence being generated, its progress, and what it holds in the pools."""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field

from deltaserve.engine.grammar import RequestGrammar
from deltaserve.engine.thinking_budget import ThinkingBudget
from deltaserve.errors import NoTokenAllowedError
from deltaserve.outputs import Logprob, RequestStateStats
from deltaserve.sampling_params import SamplingParams


# Stands in the output for a token sampled by a step still running on the device (asynchronous
# scheduling): the next step is planned before the token is read back.
PENDING_TOKEN = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens or what fits in max_model_len
    sample_index: int = 0  # which of the parent's n samples this sequence is
    capture_points: list[int] = field(default_factory=list)
    prompt_bytes: bytes = b""  # the prompt's ids as int64 bytes, for the prefix cache's names (b"": not given)
    hash_root: bytes | None = None  # the name its block chain starts from: its cache salt's (block_hash.salt_root)
    output_token_ids: list[int] = field(default_factory=list)  # the last num_pending_tokens are PENDING_TOKEN
    num_pending_tokens: int = 0
    output_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] = field(default_factory=lambda: [None])
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    state_slot: int | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    priority: int = 0  # under the priority policy, a lower value is admitted first and preempted last (vLLM's)
    arrival: int = 0  # the order the scheduler took it in (Scheduler.add): of equal priorities, the earliest first
    # prefix cache
    block_hashes: list[bytes] = field(default_factory=list)  # names of the full blocks known so far
    num_registered_blocks: int = 0  # leading blocks of block_ids already in the prefix cache
    replay_point: int = 0  # no prefill pass crosses it: the same request sent again restores from here
    snapshot_positions: list[int] = field(default_factory=list)  # block-aligned prefill capture points
    snapshot_refs: dict[int, bytes | None] = field(default_factory=dict)  # slot -> hash (capture) or None (restore)
    last_decode_snapshot: bytes | None = None
    tail_source: int | None = None  # the cached tail block its hit copied from, held until it stops
    grammar: RequestGrammar | None = None  # structured outputs: what its next tokens may be (engine/grammar.py)
    held_back: list[int] = field(default_factory=list)  # stop tokens the sampler refuses before min_tokens
    bad_words_ids: list[list[int]] = field(default_factory=list)  # params.bad_words as token ids (engine's)
    thinking: ThinkingBudget | None = None  # thinking_token_budget: where a think block's end is forced
    # (output index, error): the sampler found that its constraints refuse every token there (mark_dead_end)
    dead_end: tuple[int, NoTokenAllowedError] | None = None
    stats: RequestStateStats = field(default_factory=RequestStateStats)  # when it was queued, scheduled, ...
    # speculative decoding: the tokens the MTP head proposed to follow its last one, verified by its next step
    draft_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        # read every step, so kept: logit biases, allowed tokens or bad words change every step's logits
        self._adjusts_every_step = bool(self.params.logit_bias or self.bad_words_ids
                                        or self.params.allowed_token_ids is not None)
        allowed = self.params.allowed_token_ids
        self._allowed = frozenset(allowed) if allowed is not None else None  # for allows_no_token, every step

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, position: int) -> int:
        prompt_len = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < prompt_len else self.output_token_ids[position - prompt_len]

    def token_bytes(self, start: int, end: int) -> bytes:
        """Token ids [start, end) as int64 bytes (what the prefix cache hashes)."""
        prompt_len = len(self.prompt_token_ids)
        if self.prompt_bytes and start < prompt_len:  # the prompt's part from the bytes validation built
            tail = array("q", self.output_token_ids[: end - prompt_len]).tobytes() if end > prompt_len else b""
            return self.prompt_bytes[start * 8 : min(end, prompt_len) * 8] + tail
        return array("q", self.token_ids_slice(start, end)).tobytes()

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:  # decode: a slice of the output alone, without copying the prompt
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - prompt_len]

    @property
    def resolved_output_ids(self) -> list[int]:
        """The output tokens read back so far (without those still on the device)."""
        return self.output_token_ids[: len(self.output_token_ids) - self.num_pending_tokens]

    def add_pending_token(self) -> None:
        self.output_token_ids.append(PENDING_TOKEN)
        self.num_pending_tokens += 1

    def resolve_token(self, position: int, token: int) -> None:
        """The token at `position` (the oldest pending one) has been read back."""
        self.output_token_ids[position - len(self.prompt_token_ids)] = token
        self.num_pending_tokens -= 1

    def insert_pending_tokens(self, tokens: list[int]) -> None:
        """Kept drafts of a verify step, before its one pending token: pending too, until each is taken in
        (resolve_token), but their values stand in the output already."""
        if tokens:
            self.output_token_ids[-1:-1] = tokens
            self.num_pending_tokens += len(tokens)

    def drop_pending_tokens(self) -> None:
        """The request stops: tokens still on the device will never be part of its output."""
        if self.num_pending_tokens:
            del self.output_token_ids[-self.num_pending_tokens :]
            self.num_pending_tokens = 0

    @property
    def holds_back_stops(self) -> bool:
        """Whether the token sampled next must not be a stop token: the output is still short of min_tokens."""
        return bool(self.held_back) and len(self.output_token_ids) < self.params.min_tokens

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampler changes this row's logits before temperature and top-k/p now (Sampler._adjusted)."""
        return self._adjusts_every_step or self.holds_back_stops or self.forced_token is not None

    @property
    def forced_token(self) -> int | None:
        """The token the next one must be (a think block's end past its budget), or None."""
        return self.thinking.forced_token if self.thinking is not None else None

    def refused_tokens(self, drafted: list[int] | tuple = ()) -> list[int]:
        """The tokens the next one may not be: its stop tokens while short of min_tokens, and the last token of
        each bad word whose other tokens end the output (of a one-token word, always). drafted: tokens taken to
        follow the output first (a verify row's drafts before it)."""
        short = bool(self.held_back) and len(self.output_token_ids) + len(drafted) < self.params.min_tokens
        return (list(self.held_back) if short else []) + self._bad_word_ends(drafted)

    def _bad_word_ends(self, drafted: list[int] | tuple = ()) -> list[int]:
        if not self.bad_words_ids:
            return []
        past = self.output_token_ids + list(drafted) if drafted else self.output_token_ids
        return [word[-1] for word in self.bad_words_ids if _ends_with(past, word[:-1])]

    def allows_no_token(self, refused: list[int]) -> bool:
        """Whether every one of its allowed_token_ids is refused now: outside a grammar, the way its constraints
        leave no token (short of bad words and stop tokens that span the whole vocabulary, which is not looked for)."""
        if self._allowed is None or len(refused) < len(self._allowed):  # too few refused to cover them all
            return False
        return self._allowed <= set(refused)

    def mark_dead_end(self, index: int | None = None) -> None:
        """The constraints allow no token as output token `index` (the one sampled now where None): the request
        fails there with an error naming them (LLMEngine._take_token), rather than take a token they refuse. The
        sampler finds this from its masks, the engine where a finished grammar leaves only an end that min_tokens
        holds back. The first stays: a step launched ahead samples the token after it before that one is read
        back."""
        if self.dead_end is not None:
            return
        index = len(self.output_token_ids) if index is None else index
        fields = [name for name, present in (
            ("allowed_token_ids", self.params.allowed_token_ids is not None),
            ("min_tokens", bool(self.held_back) and index < self.params.min_tokens),
            ("bad_words", bool(self._bad_word_ends())),
            ("structured_outputs", self.grammar is not None and self.grammar.active),
        ) if present]
        # the structured output by what it is: a server request may have asked for it as response_format
        named = [{"structured_outputs": "the structured output"}.get(f, f) for f in fields]
        refuse = f"{' and '.join(named)} together refuse" if len(named) > 1 else f"{named[0]} refuses"
        message = f"{refuse} every token for output token {index}, so the request cannot go on"
        self.dead_end = (index, NoTokenAllowedError(message, fields))

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


def _ends_with(tokens: list[int], head: list[int]) -> bool:
    return not head or (len(tokens) >= len(head) and tokens[len(tokens) - len(head):] == head)
