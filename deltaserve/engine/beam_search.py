"""Beam search over the engine's one-token requests, as vLLM runs it: each step every live beam is sent as a
prompt asking one token and its 2 * width likeliest tokens' logprobs, and the best `width` of the extended beams
live on. The search itself is plain Python; its callers (LLM.beam_search, engine/beam_search_stream.py) run
the requests. Each beam's request starts where its parent's stopped, so the prefix cache's tails hand it the
parent's KV and GDN state and the step computes a token a beam."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from deltaserve.outputs import Logprob
from deltaserve.sampling_params import BeamSearchParams, SamplingParams


@dataclass
class Beam:
    tokens: list[int]  # generated tokens, a stop token that ended it last
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # each position's candidates
    cum_logprob: float = 0.0
    finish_reason: str | None = None  # "stop" or "length" once finished
    stop_reason: int | None = None  # the stop token that ended it (None: the primary end of sequence, or none)

    def extended(self, token: int, entry: dict[int, Logprob]) -> Beam:
        return Beam(self.tokens + [token], self.logprobs + [entry], self.cum_logprob + entry[token].logprob)

    @property
    def stopped_by_token(self) -> bool:
        return self.finish_reason == "stop"


class BeamSearch:
    """One prompt's search. The caller runs `next_prompts()` (each live beam's tokens, one request each with
    `step_params`) and hands each request's first-token logprobs to `advance`, until `finished`; `best()` are the
    results, best first."""

    def __init__(self, prompt: list[int], params: BeamSearchParams, eos_token_ids: set[int],
                 primary_eos: int | None, top_logprobs: int = 0, logprobs_fall: bool = True):
        self.prompt = list(prompt)
        # whether a beam's sum only falls as it grows (logprobs do; the logits of a logits logprobs_mode need not):
        # the early stop stands on it
        self.logprobs_fall = logprobs_fall
        self.top_logprobs = top_logprobs  # the top logprobs the results' tokens carry, where more than the candidates
        self.params = params
        self.eos_token_ids, self.primary_eos = set(eos_token_ids), primary_eos
        self.live: list[Beam] = [Beam([])]
        self.done: list[Beam] = []
        self.steps = 0

    @property
    def candidates_per_beam(self) -> int:
        return 2 * self.params.beam_width

    def step_params(self) -> SamplingParams:
        """A beam's request: one greedy token (its own draw is not used) and the candidates' logprobs."""
        return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                              logprobs=max(self.candidates_per_beam, self.top_logprobs), detokenize=False)

    def next_prompts(self) -> list[list[int]]:
        return [self.prompt + beam.tokens for beam in self.live]

    @property
    def finished(self) -> bool:
        return not self.live or self.steps >= self.params.max_tokens or self._settled()

    def advance(self, entries: list[dict[int, Logprob]]) -> None:
        """Extends each live beam by each of its candidates (`entries`, one per live beam: the logprobs of its next
        position): those that a stop token ends are finished, the best `beam_width` others live on."""
        assert len(entries) == len(self.live), "one logprobs entry a live beam"
        growing = []
        for beam, entry in zip(self.live, entries):
            for token in self._candidates(entry):
                child = beam.extended(token, entry)
                stopping, reason = self._stopping(token, len(child.tokens))
                if stopping is None:
                    continue  # held back by min_tokens: the engine would never sample it
                if stopping:
                    child.finish_reason, child.stop_reason = "stop", reason
                    self.done.append(child)
                else:
                    growing.append(child)
        growing.sort(key=self.score, reverse=True)  # stable: among equal scores, the earlier beam's first
        self.live = growing[:self.params.beam_width]
        self.steps += 1
        if self.steps >= self.params.max_tokens:
            for beam in self.live:
                beam.finish_reason = "length"

    def best(self) -> list[Beam]:
        """The best `beam_width` of the finished beams and those still live (finished by length), best first."""
        for beam in self.live:
            beam.finish_reason = beam.finish_reason or "length"
        return sorted(self.done + self.live, key=self.score, reverse=True)[:self.params.beam_width]

    def score(self, beam: Beam) -> float:
        """vLLM's ranking: the summed logprobs over the sequence's length (prompt included, a stop token not) to the
        power length_penalty."""
        length = len(self.prompt) + len(beam.tokens) - (1 if beam.stopped_by_token else 0)
        return _over_length(beam.cum_logprob, length, self.params.length_penalty)

    def _candidates(self, entry: dict[int, Logprob]) -> list[int]:
        """The position's likeliest tokens, best first (the entry may also hold the request's own draw)."""
        ranked = sorted(entry.items(), key=lambda item: item[1].rank)
        return [token for token, logprob in ranked if logprob.rank <= self.candidates_per_beam]

    def _stopping(self, token: int, length: int) -> tuple[bool | None, int | None]:
        """Whether `token` at output length `length` ends the beam, and its stop reason, as the engine stops a
        sequence; None where min_tokens holds the token back."""
        params = self.params
        ends = token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids)
        if token in params.stop_token_ids or token in self.eos_token_ids:
            if length <= params.min_tokens:
                return None, None
        if not ends:
            return False, None
        return True, None if token == self.primary_eos and not params.ignore_eos else token

    def _settled(self) -> bool:
        """Whether no live beam can end better than the worst of the best `beam_width` finished ones: their logprobs
        only fall, so a live beam's best is its score now stretched over the longest length it may reach (with a
        positive length penalty) or over its length now (otherwise). Stopping here returns what running to
        max_tokens would."""
        width = self.params.beam_width
        if len(self.done) < width or not self.logprobs_fall:
            return False
        kept = sorted((self.score(b) for b in self.done), reverse=True)[width - 1]
        return all(self._best_reachable(beam) < kept for beam in self.live)

    def _best_reachable(self, beam: Beam) -> float:
        penalty = self.params.length_penalty
        now = len(self.prompt) + len(beam.tokens)
        longest = len(self.prompt) + self.params.max_tokens
        return _over_length(beam.cum_logprob, longest if penalty > 0 else now, penalty)


def _over_length(cum_logprob: float, length: int, penalty: float) -> float:
    """cum_logprob / length ** penalty, vLLM's score, where length ** penalty leaves float's range too (a penalty
    of hundreds): the sum over an infinite length is 0, over a length rounded to 0 infinite."""
    try:
        return cum_logprob / (float(max(length, 1)) ** penalty)
    except OverflowError:
        return math.copysign(0.0, cum_logprob)
    except ZeroDivisionError:
        return 0.0 if cum_logprob == 0 else math.copysign(math.inf, cum_logprob)
