"""LLMEngine: validates and queues requests, runs one scheduled step at a time, and turns sampled
tokens into outputs. The body of both LLM.generate's loop and the server's engine thread."""

from __future__ import annotations

import logging
import numbers
import struct
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from deltaserve.cache.block_hash import salt_root
from deltaserve.engine.beam_search import BeamSearch
from deltaserve.engine.detokenizer import IncrementalDetokenizer
from deltaserve.engine.engine_config import EngineConfig
from deltaserve.engine.grammar import GrammarCompiler
from deltaserve.engine.logprob_text import MAX_CONTEXT, logprob_token_text
from deltaserve.engine.model_setup import LoadedModel, load_engine_model
from deltaserve.engine.prefix_cache import PrefixCache
from deltaserve.engine.profiler import StepProfiler
from deltaserve.engine.repetition import ends_in_repetition
from deltaserve.engine.request import Request
from deltaserve.engine.sampling_defaults import max_tokens_cap
from deltaserve.engine.scheduler import Scheduler
from deltaserve.engine.thinking_budget import (THINK_END, THINK_START, ThinkingBudget, opens_think_block,
                                               think_tag_ids)
from deltaserve.engine.warm_up import warm_up
from deltaserve.errors import (DeltaServeError, InvalidPromptError, InvalidSamplingParamsError, PromptTooLongError,
                               RequestNotFoundError)
from deltaserve.outputs import CompletionOutput, RequestOutput, RequestStateStats
from deltaserve.sampling_params import BeamSearchParams, SamplingParams, logprobs_count

log = logging.getLogger(__name__)
REPETITION_STOP_REASON = "repetition_detected"  # vLLM's stop_reason beside finish_reason "repetition"


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    state_slots_used: int = 0
    state_slots_total: int = 0
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0  # of those, found in the prefix cache when their request started
    generation_tokens_total: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    snapshot_slots_used: int = 0
    snapshot_slots_total: int = 0
    num_preemptions: int = 0
    # speculative decoding (vLLM's spec_decode counters): verify chunks, the drafts they verified, those kept, and
    # how often the draft at each position was kept
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_accepted_per_position: list[int] = field(default_factory=list)

    def count_verified(self, drafted: int, kept: int) -> None:
        """A verify chunk checked `drafted` drafts and kept the first `kept`."""
        self.spec_decode_num_drafts += 1
        self.spec_decode_num_draft_tokens += drafted
        self.spec_decode_num_accepted_tokens += kept
        per_position = self.spec_decode_accepted_per_position
        per_position += [0] * (drafted - len(per_position))
        for position in range(kept):
            per_position[position] += 1

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of the prompt tokens looked up in the prefix cache that were found there."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def kv_cache_usage(self) -> float:
        """Share of the KV pool's blocks in use."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


@dataclass
class StepStats:
    """What one call of step() did, for the step listeners (vLLM's iteration stats): the tokens it read back
    plus, for each sequence whose first token is among them, the prompt tokens it computed (vLLM's iteration
    tokens; None where it read none back), and for each output token after a sequence's first, the seconds since
    that sequence's previous token."""

    num_tokens: int | None = None
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass(eq=False)
class ParentRequest:
    """What the caller asked for: one prompt, n sampled sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    detokenizers: list[IncrementalDetokenizer]
    error: Exception | None = None  # the request's own fault that ended it (RequestOutput.error)

    @property
    def finished(self) -> bool:
        return all(c.is_finished for c in self.children)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        loaded: LoadedModel = load_engine_model(config)
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.model_config = loaded.model_config
        self.model_name = loaded.name
        self.max_model_len = loaded.max_model_len
        self.sampling_defaults = loaded.sampling_defaults
        self.max_tokens_cap = max_tokens_cap(config.generation_config, self.sampling_defaults,
                                             config.override_generation_config)
        self.vocab_size = loaded.model_config.vocab_size
        self.max_logprobs = logprobs_count(config.max_logprobs, self.vocab_size)  # resolved: -1 is the vocabulary
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(loaded.model_config.eos_token_ids)
        # vLLM's primary end of sequence, the tokenizer's: it stops with no stop_reason; the checkpoint's other
        # end tokens stop as stop_token_ids do, naming themselves
        self.primary_eos = self.tokenizer.hf.eos_token_id
        prefix_cache = None
        if config.enable_prefix_caching:
            snapshots = loaded.snapshots.index if loaded.snapshots is not None else None
            prefix_cache = PrefixCache(loaded.blocks, snapshots, config.block_size, config.ssm_snapshot_interval,
                                       config.decode_snapshot_interval)
        speculative = config.speculative_config
        # the MTP head's passes after a step's first write KV for drafts past the chunk (MtpDrafter)
        lookahead = speculative.num_speculative_tokens - 1 if speculative is not None and speculative.drafts_with_head \
            else 0
        self.scheduler = Scheduler(loaded.blocks, loaded.slots, config.block_size, config.max_num_seqs,
                                   config.max_num_batched_tokens, prefix_cache, config.scheduling_policy, lookahead)
        self.runner = loaded.runner
        self.grammars = GrammarCompiler(self.tokenizer.hf, self.model_config.vocab_size, self.eos_token_ids,
                                        lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        tags = think_tag_ids(lambda text: self.tokenizer.encode(text, add_special_tokens=False))
        self.think_tags = tags if tags is not None and max(tags) < self.vocab_size else None  # (<think>, </think>)
        self._parents: dict[str, ParentRequest] = {}
        self._owner: dict[Request, ParentRequest] = {}
        self._launched = None  # LaunchedStep of a step still running, its tokens not read back
        self.stats_counters = EngineStats()
        # told of each step() call's StepStats, on the thread that steps; what they count must not fail it
        self.step_listeners: list[Callable[[StepStats], None]] = []
        self._step_stats = StepStats()
        self.last_failure: BaseException | None = None  # what the newest failed step raised
        profiling = config.profiler_config is not None and config.profiler_config.profiler is not None
        self.profiler = StepProfiler(config.profiler_config, loaded.device) if profiling else None
        if config.warm_up if config.warm_up is not None else loaded.device.type == "cuda":
            started = time.perf_counter()
            steps = warm_up(self)
            log.info("warmed up the prefill kernels in %d steps, %.1f s", steps, time.perf_counter() - started)

    @classmethod
    def from_args(cls, model: str | None = None, **kwargs) -> "LLMEngine":
        return cls(EngineConfig(model=model, **kwargs))

    def default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the checkpoint's recommended values (engine/sampling_defaults.py)."""
        return SamplingParams(**self.sampling_defaults)

    # -- requests ---------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                    prompt_text: str | None = None, capture_points: list[int] | None = None,
                    cache_salt: str | None = None, priority: int = 0) -> None:
        """Queues a request. cache_salt (vLLM's): its prefix-cache entries are shared only with requests of the
        same salt. priority (vLLM's): under the priority policy, a lower value is served first (every one of its n
        sequences); under fcfs only 0 is taken."""
        if not isinstance(params, SamplingParams):
            raise InvalidSamplingParamsError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        params.validate()  # again: a field may have been set since construction
        params.check_logprobs(self.max_logprobs, self.vocab_size)
        if not isinstance(request_id, str) or not request_id:  # as vLLM's: outputs and aborts name it
            raise InvalidPromptError(f"request id {request_id!r}: must be a non-empty string")
        if request_id in self._parents:
            raise InvalidPromptError(f"request id {request_id!r} is already in use")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidPromptError(f"cache_salt={cache_salt!r}: must be a non-empty string")
        priority = self._checked_priority(priority)
        self._check_token_ids(params)
        self._check_thinking_budget(params)
        token_ids, text, token_bytes = self._prompt_tokens(prompt, prompt_text)
        max_tokens = self._resolve_max_tokens(len(token_ids), params)
        structured = self._structure_after_thinking(params.structured_outputs, token_ids)
        grammar = self.grammars.compile(structured) if structured is not None else None
        think_tags = self._think_opening(structured, token_ids) if grammar is not None else None  # once, for all n
        held_back = self._stop_tokens(params) if params.min_tokens else []
        bad_words_ids = self._bad_words_ids(params.bad_words or [])
        hash_root = salt_root(cache_salt)
        arrival, queued = time.time(), time.perf_counter()
        children = [
            Request(f"{request_id}#{i}" if params.n > 1 else request_id, token_ids, params, max_tokens,
                    sample_index=i, capture_points=list(capture_points or []), prompt_bytes=token_bytes,
                    grammar=self.grammars.matcher(structured, grammar, think_tags) if grammar is not None else None,
                    held_back=held_back, bad_words_ids=bad_words_ids, hash_root=hash_root,
                    thinking=self._thinking_budget(params, token_ids),
                    stats=RequestStateStats(arrival_time=arrival, queued_ts=queued), priority=priority)
            for i in range(params.n)
        ]
        parent = ParentRequest(request_id, text, token_ids, children,
                               [IncrementalDetokenizer(self.tokenizer, token_ids, params) for _ in children])
        self._parents[request_id] = parent
        for child in children:
            self._owner[child] = parent
            self.scheduler.add(child)

    def beam_search(self, prompt: str | list[int], params: BeamSearchParams, top_logprobs: int = 0) -> BeamSearch:
        """A beam search over `prompt` (engine/beam_search.py), checked as add_request checks a request: its
        max_tokens capped by the context the prompt leaves, its width by max_logprobs. top_logprobs: how many top
        logprobs its results' tokens carry (checked by the caller). The caller runs its steps."""
        if not isinstance(params, BeamSearchParams):
            raise InvalidSamplingParamsError(f"beam search params must be a BeamSearchParams, got "
                                             f"{type(params).__name__}")
        params.validate()
        if 2 * params.beam_width > self.max_logprobs:
            raise InvalidSamplingParamsError(
                f"beam_width={params.beam_width}: each step takes a beam's {2 * params.beam_width} likeliest tokens, "
                f"more than the engine's max_logprobs of {self.max_logprobs} allows (--max-logprobs raises it)")
        self._check_token_ids(SamplingParams(stop_token_ids=params.stop_token_ids))
        token_ids, _, _ = self._prompt_tokens(prompt, None)
        max_tokens = self._resolve_max_tokens(len(token_ids), SamplingParams(max_tokens=params.max_tokens))
        return BeamSearch(token_ids, replace(params, max_tokens=max_tokens), self.eos_token_ids,
                          None if self.primary_eos is None else int(self.primary_eos), top_logprobs,
                          logprobs_fall=self.config.logprobs_mode.endswith("logprobs"))

    def _checked_priority(self, priority) -> int:
        """An integer (a numpy one too), and under fcfs 0: vLLM documents that refusal (0.24 takes any value there
        and drops it)."""
        if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
            raise InvalidPromptError(f"priority={priority!r}: must be an integer")
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise InvalidPromptError(f"priority={priority}: priority scheduling is not enabled (only 0 is taken): "
                                     "start the engine with scheduling_policy='priority'")
        return int(priority)

    def _stop_tokens(self, params: SamplingParams) -> list[int]:
        """The tokens min_tokens holds back: its stop_token_ids and the ends of sequence, ignore_eos or not (as
        vLLM's min-tokens processor, which holds back every token that could end the output)."""
        return sorted(set(params.stop_token_ids) | self.eos_token_ids)

    def _stopping(self, token: int, params: SamplingParams) -> tuple[bool, int | None]:
        """Whether `token` ends the output, and the stop_reason it gives (vLLM's check_stop): the primary end of
        sequence none, a stop_token_id or another end of sequence itself; an end of sequence stops nothing under
        ignore_eos."""
        if not params.ignore_eos and token == self.primary_eos:
            return True, None
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return True, token
        return False, None

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word's tokens as vLLM reads them: the word without its leading spaces, and after one space
        where that spells it with as many tokens but another first one (a word's form inside a sentence)."""
        found = []
        for word in words:
            bare = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            found += [bare] + ([spaced] if bare and len(spaced) == len(bare) and spaced[0] != bare[0] else [])
        vocab = self.model_config.vocab_size
        return [ids for ids in found if ids and all(t < vocab for t in ids)]

    def _check_token_ids(self, params: SamplingParams) -> None:
        """The token ids of logit_bias, stop_token_ids, allowed_token_ids and logprob_token_ids name tokens of the
        vocabulary."""
        vocab = self.model_config.vocab_size
        for name, tokens in (("logit_bias", params.logit_bias or ()), ("stop_token_ids", params.stop_token_ids),
                             ("allowed_token_ids", params.allowed_token_ids or ()),
                             ("logprob_token_ids", params.logprob_token_ids or ())):
            for token in tokens:
                if not 0 <= token < vocab:
                    raise InvalidSamplingParamsError(
                        f"{name}={token}: token id {token} is outside the vocabulary [0, {vocab})")

    def _structure_after_thinking(self, structured, prompt_ids: list[int]):
        """Where the prompt leaves a think block open, the reasoning stays free and the constraint holds from its
        "</think>" on (`start_after`), as the server's routes ask; a structure that says where it starts keeps it."""
        if structured is None or structured.start_after is not None:
            return structured
        if not opens_think_block(prompt_ids, self.think_tags):
            return structured
        return replace(structured, start_after=THINK_END)

    def _think_opening(self, structured, prompt_ids: list[int]) -> tuple[int, int] | None:
        """The think tags where the prompt holds neither and the structure says nowhere else to start: a model
        that thinks opens its block itself, and the constraint waits for its end (vLLM, with a reasoning parser,
        leaves such an output free until a </think>; here only a first <think> frees it)."""
        if structured.start_after is not None or self.think_tags is None:
            return None
        return None if set(self.think_tags) & set(prompt_ids) else self.think_tags

    def _check_thinking_budget(self, params: SamplingParams) -> None:
        if params.thinking_token_budget is not None and self.think_tags is None:
            raise InvalidSamplingParamsError(
                f"thinking_token_budget={params.thinking_token_budget}: the model's tokenizer has no {THINK_START} and "
                f"{THINK_END} tokens, so its output has no think block to end")

    def _thinking_budget(self, params: SamplingParams, prompt_ids: list[int]) -> ThinkingBudget | None:
        """A sequence's own count of its think block's tokens (each of n samples thinks apart)."""
        if params.thinking_token_budget is None:
            return None
        start, end = self.think_tags
        return ThinkingBudget(params.thinking_token_budget, [start], [end], prompt_ids)

    def _prompt_tokens(self, prompt, prompt_text) -> tuple[list[int], str | None, bytes]:
        """(token ids, text, the ids as int64 bytes: the prefix cache names blocks from them)."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidPromptError("the prompt is empty")
            token_ids = self.tokenizer.encode(prompt)
            return token_ids, prompt, array("q", token_ids).tobytes()
        if not isinstance(prompt, (list, tuple)):
            raise InvalidPromptError("a prompt must be a string or a list of token ids (integers)")
        if not prompt:
            raise InvalidPromptError("the prompt is empty")
        # One C pass packs the ids (and rejects what is not an integer or does not fit in int64): on an
        # 8k-token follow-up turn a per-id type check in Python took 0.24 ms of the turn's time to first
        # token, and packing with array() as long again. Booleans pack as 0 and 1: only the ids 0 and 1
        # are checked for them. Other integer types (numpy's) pack as their values.
        try:
            token_bytes = struct.pack(f"{len(prompt)}q", *prompt)
        except struct.error:
            raise self._invalid_ids(prompt) from None
        ids = np.frombuffer(token_bytes, dtype=np.int64)
        low, high = int(ids.min()), int(ids.max())
        if low <= 1 and any(type(prompt[i]) is bool for i in np.flatnonzero(ids <= 1)):
            raise InvalidPromptError("a prompt must be a string or a list of token ids (integers)")
        vocab = self.model_config.vocab_size
        if low < 0 or high >= vocab:
            raise InvalidPromptError(f"token id {low if low < 0 else high} is outside the vocabulary [0, {vocab})")
        # The ids are kept as given (numpy integers stay numpy integers: everything downstream reads them
        # as integers); turning 8k ids into fresh ints would cost another 0.15 ms of the turn.
        return list(prompt), prompt_text, token_bytes

    def _invalid_ids(self, prompt) -> InvalidPromptError:
        """The error of ids that do not pack as int64: not integers, or out of any vocabulary's range."""
        if not all(hasattr(t, "__index__") for t in prompt):  # ints and the other integer types have it
            return InvalidPromptError("a prompt must be a string or a list of token ids (integers)")
        return InvalidPromptError(f"a token id is outside the vocabulary [0, {self.model_config.vocab_size})")

    def _resolve_max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        if prompt_len >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {prompt_len} tokens, which leaves no room to generate within "
                f"max_model_len={self.max_model_len}", prompt_len, self.max_model_len)
        room = self.max_model_len - prompt_len
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def abort(self, request_id: str) -> None:
        parent = self._parents.get(request_id)
        if parent is None:
            raise RequestNotFoundError(f"no request {request_id!r}")
        for child in parent.children:
            if not child.is_finished:
                self.scheduler.finish(child, "abort")
        self._forget(parent)

    def reset_prefix_cache(self) -> None:
        """Forgets every cached KV block and state snapshot that no running request holds."""
        self.scheduler.reset_prefix_cache()

    def start_profile(self, prefix: str | None = None) -> None:
        """vLLM's: the profiler of profiler_config traces the steps from here (engine/profiler.py); `prefix` names
        the trace's file."""
        self._profiler_or_refusal().start(prefix)

    def stop_profile(self) -> None:
        """vLLM's: the profiler stops, and a torch profiler writes its trace."""
        self._profiler_or_refusal().stop()

    def _profiler_or_refusal(self) -> StepProfiler:
        if self.profiler is None:
            raise DeltaServeError("profiling is off: start the engine with profiler_config (--profiler-config), "
                                  "e.g. {\"profiler\": \"torch\", \"torch_profiler_dir\": \"./traces\"}")
        return self.profiler

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._launched is not None

    # -- one step ---------------------------------------------------------------------------------
    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One step. Returns an output per request that progressed, or with final_only only per
        request that finished (cheaper when nobody streams). The outputs are the caller's: the
        engine keeps no reference to their lists, so another thread may read them meanwhile.

        Asynchronous scheduling: a decode step whose rows sample on the device alone is queued and
        left running; its tokens are read back during the next call, after that call has queued its
        own step (planned with the pending tokens as placeholders, which the device fills in). So the
        host's work of one step overlaps the GPU's work of the other."""
        plan = self.scheduler.schedule()
        touched: dict[str, ParentRequest] = {}
        failed: list[RequestOutput] = []
        previous, self._launched = self._launched, None
        if plan and self.config.async_scheduling and self.runner.can_launch(plan):
            try:
                launched = self.runner.launch(plan, previous)
            except Exception as exc:
                log.exception("step failed; aborting the %d requests it held", len(plan.chunks))
                failed = self._fail(plan, exc)
            else:
                self._started(plan)
                self._launched = launched
            plan = None
        if previous is not None:
            self._finish_step(previous.plan, previous.plan.chunks, previous.token_ids(), None, touched)
        if plan is not None:
            plan.drop_finished()  # tokens just read back may have stopped some of its requests
        if plan:
            try:
                result = self.runner.execute(plan)
            except Exception as exc:
                log.exception("step failed; aborting the %d requests it held", len(plan.chunks))
                failed += self._fail(plan, exc)
            else:
                self._started(plan)
                self._record_prompt_logprobs(result.prompt_logprobs)
                self._finish_step(plan, result.sampling, result.tokens, result.logprobs, touched, result.accepted,
                                  result.draft_logprobs)
                self._keep_drafts(plan, result.drafts)
        self._report_step()
        if self.profiler is not None:
            self.profiler.step()
        if final_only:
            return failed + [self._output(p) for p in touched.values() if p.finished]
        return failed + [self._output(parent) for parent in touched.values()]

    def _report_step(self) -> None:
        if not self.step_listeners:  # nothing listens (offline): the gaps were not kept, nor is the count
            self._step_stats.num_tokens = None
            return
        stats, self._step_stats = self._step_stats, StepStats()
        for listener in self.step_listeners:
            try:
                listener(stats)
            except Exception:
                log.exception("step listener failed")

    def _started(self, plan) -> None:
        """The plan's step is queued: its requests advance, each sampling one a pending token."""
        now = time.perf_counter()
        for request in plan.admitted:
            if request.num_preemptions == 0:  # a prompt counts once, as vLLM's: a restart recomputes, not adds
                self.stats_counters.prompt_tokens_total += request.num_prompt_tokens
                self.stats_counters.prompt_tokens_cached_total += request.num_cached_tokens
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed_tokens = chunk.end
            if not request.stats.scheduled_ts:
                request.stats.scheduled_ts = now
            if chunk.samples:
                request.add_pending_token()

    def _finish_step(self, plan, sampling, tokens, logprobs, touched: dict, accepted: dict | None = None,
                     draft_logprobs: dict | None = None) -> None:
        """The step's tokens are back: caches what it computed, then takes each token in. accepted: {verify chunk:
        the drafts it kept}, taken before the chunk's token; draft_logprobs: their logprob entries, where asked."""
        for chunk, drafts in (accepted or {}).items():
            if not chunk.request.is_finished:
                chunk.request.insert_pending_tokens(drafts)  # the prefix cache names its blocks by them
            self.stats_counters.count_verified(len(chunk.draft_token_ids) + chunk.num_refuted, len(drafts))
        self.scheduler.step_done(plan)  # before any request finishes
        now = time.perf_counter()
        for i, (chunk, token) in enumerate(zip(sampling, tokens)):
            request = chunk.request
            if request.is_finished:  # aborted, or stopped by its previous token while this step ran
                continue
            entries = (draft_logprobs or {}).get(chunk) or [None] * len(chunk.draft_token_ids)
            for offset, (draft, entry) in enumerate(zip(chunk.draft_token_ids, entries), start=1):
                self._take_token(request, chunk.start + offset, draft, entry, now)
                if request.is_finished:  # a kept draft ended it: the tokens after it are dropped
                    break
            else:
                self._take_token(request, chunk.end, token, logprobs[i] if logprobs else None, now)
            touched[self._owner[request].request_id] = self._owner[request]
        self.runner.save_states(self.scheduler.take_state_saves())  # the tails of requests that finished

    @staticmethod
    def _keep_drafts(plan, drafts: dict) -> None:
        """Each request of the step that goes on keeps the drafts its next step verifies (none where it has none)."""
        for chunk in plan.chunks:
            if not chunk.request.is_finished:
                chunk.request.draft_token_ids = drafts.get(chunk.request, [])

    def _record_prompt_logprobs(self, found: dict) -> None:
        for request, (first, entries) in found.items():
            for position, entry in enumerate(entries, start=first):
                if position == len(request.prompt_logprobs):  # a recompute after preemption adds nothing new
                    if request.params.detokenize:
                        self._decode_logprob_tokens(entry, request.prompt_token_ids[max(0, position - MAX_CONTEXT):
                                                                                    position])
                    request.prompt_logprobs.append(entry)

    def _decode_logprob_tokens(self, entry, before: list[int]) -> None:
        """Each token's text in the entry, after the tokens `before` its position (logprob_text)."""
        for tid, logprob in entry.items():
            logprob.decoded_token = logprob_token_text(self._decode_with_specials, tid, before)

    def _decode_with_specials(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _take_token(self, request: Request, position: int, token: int, logprob, now: float) -> None:
        """The token sampled at `position` (the request's oldest pending one), read back at `now`: stop checks,
        text."""
        parent = self._owner[request]
        if request.dead_end is not None and position - request.num_prompt_tokens >= request.dead_end[0]:
            self._end_at_fault(parent, request.dead_end[1])  # the token sampled there is one they refuse
            return
        detok = parent.detokenizers[request.sample_index]
        forced = request.forced_token
        request.resolve_token(position, token)
        if request.thinking is not None:
            request.thinking.accept(token)
        if logprob is not None:  # read after the output's tokens before it, as vLLM reads them
            index = position - request.num_prompt_tokens
            if request.params.detokenize:  # else no text, as vLLM's
                self._decode_logprob_tokens(logprob, request.output_token_ids[max(0, index - MAX_CONTEXT):index])
            request.output_logprobs.append(logprob)
        self._count_token(request, now)
        params = request.params
        if request.grammar is not None and not request.grammar.accept(token):
            if forced is not None:  # the budget's "</think>" stands over the grammar, which had not waited for it
                index = position - request.num_prompt_tokens
                self._end_at_fault(parent, InvalidSamplingParamsError(
                    f"thinking_token_budget ended the think block at output token {index} where structured_outputs "
                    f"does not take its end: give the structure a start_after of {THINK_END!r} to hold after it"))
                return
            # the mask allows only what the grammar accepts: a refused token is the matcher's own failure (a
            # limit of its parser), which ends this request with an error naming it, not a failed step
            why = request.grammar.error().split("\n", 1)[0]  # the rest is the matcher's state and grammar
            log.error("request %s: structured output refused token %d: %s", request.request_id, token, why)
            self._end_at_fault(parent, InvalidSamplingParamsError(f"structured_outputs: the grammar failed: {why}"))
            return
        stops, reason = self._stopping(token, params)
        if stops:
            if params.include_stop_str_in_output and params.detokenize:  # vLLM's: the stop token's text kept,
                reason = detok.append(token) or reason  # and a stop string it completes is the reason
            self.scheduler.finish(request, "stop", reason)
            return
        stop = detok.append(token) if params.detokenize else None
        if stop is not None:
            self.scheduler.finish(request, "stop", stop)
        elif request.grammar is not None and request.grammar.finished:  # the grammar takes nothing more
            following = position - request.num_prompt_tokens + 1
            if request.held_back and following < params.min_tokens:
                # only the end may follow, and min_tokens holds it back: no token may come next
                request.mark_dead_end(following)
                self._end_at_fault(parent, request.dead_end[1])
            else:
                self.scheduler.finish(request, "stop")
        elif position - request.num_prompt_tokens + 1 >= request.max_tokens:
            self.scheduler.finish(request, "length")
        elif self._repeats_itself(request, position):
            self.scheduler.finish(request, "repetition", REPETITION_STOP_REASON)

    def _count_token(self, request: Request, now: float) -> None:
        stats, step = request.stats, self._step_stats
        self.stats_counters.generation_tokens_total += 1
        step.num_tokens = (step.num_tokens or 0) + 1
        if not stats.first_token_ts:
            stats.first_token_ts = now
            step.num_tokens += request.num_prompt_tokens - request.num_cached_tokens  # its prompt, as vLLM's
        elif self.step_listeners:  # kept only for a listener: a token a row every step
            step.inter_token_latencies.append(now - stats.last_token_ts)
        stats.last_token_ts = now
        stats.num_generation_tokens += 1

    @staticmethod
    def _repeats_itself(request: Request, position: int) -> bool:
        """Whether the output up to `position` (min_tokens long at least) ends in the pattern its
        repetition_detection looks for, read from the tail that could hold it."""
        detection = request.params.repetition_detection
        taken = position - request.num_prompt_tokens + 1
        if detection is None or not detection.active or taken < request.params.min_tokens:
            return False
        tail = request.output_token_ids[max(taken - detection.max_pattern_size * detection.min_count, 0):taken]
        return ends_in_repetition(tail, detection.max_pattern_size, detection.min_pattern_size, detection.min_count)

    def _output(self, parent: ParentRequest) -> RequestOutput:
        outputs = []
        for child, detok in zip(parent.children, parent.detokenizers):
            finished = child.is_finished
            outputs.append(CompletionOutput(
                index=child.sample_index,
                text=detok.visible_text(finished),
                token_ids=child.resolved_output_ids,  # a new list (a slice), as logprobs below
                finish_reason=child.finish_reason,
                stop_reason=child.stop_reason,
                logprobs=list(child.output_logprobs) if child.params.returns_logprobs else None,
                metrics=child.stats if finished else None,  # no longer changed once it has finished
            ))
        out = RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, outputs,
                            finished=parent.finished,
                            num_cached_tokens=min(c.num_cached_tokens for c in parent.children), error=parent.error)
        if out.finished:
            samples = [c.stats for c in parent.children]
            out.metrics = samples[0] if len(samples) == 1 else RequestStateStats.spanning(samples)
        first = parent.children[0]
        if first.params.prompt_logprobs is not None and len(first.prompt_logprobs) == first.num_prompt_tokens:
            out.prompt_logprobs = list(first.prompt_logprobs)
        if out.finished:
            self._forget(parent)
        return out

    def _end_at_fault(self, parent: ParentRequest, error: Exception) -> None:
        """Ends every sequence of a request that cannot go on for a reason of its own, keeping the error for
        its output; nothing else in the step is touched."""
        log.info("request %s ends: %s", parent.request_id, error)
        parent.error = error
        for child in parent.children:
            if not child.is_finished:
                self.scheduler.finish(child, "abort")

    def _fail(self, plan, exc: BaseException) -> list[RequestOutput]:
        self.last_failure = exc
        parents = {self._owner[c.request].request_id: self._owner[c.request] for c in plan.chunks}
        for parent in parents.values():
            for child in parent.children:
                if not child.is_finished:
                    self.scheduler.finish(child, "abort")
        return [self._output(p) for p in parents.values()]

    def _forget(self, parent: ParentRequest) -> None:
        self._parents.pop(parent.request_id, None)
        for child in parent.children:
            self._owner.pop(child, None)

    def cache_config_info(self) -> dict[str, str]:
        """The cache as this engine runs it, under the names of vLLM's cache_config_info metric's labels."""
        info = {"block_size": str(self.config.block_size), "num_gpu_blocks": str(self.loaded.blocks.num_blocks),
                "enable_prefix_caching": str(self.config.enable_prefix_caching),
                "gpu_memory_utilization": str(self.config.gpu_memory_utilization),
                "cache_dtype": str(self.loaded.dtype).removeprefix("torch.")}
        state_pool = getattr(self.runner, "state_pool", None)
        if state_pool is not None:  # the GDN state's dtype (--gdn-state-dtype)
            info["mamba_ssm_cache_dtype"] = str(state_pool.h_all.dtype).removeprefix("torch.")
        return info

    def reset_stats(self) -> None:
        """Zeroes the counters (tokens, prefix-cache lookups, preemptions); the gauges stay live."""
        self.stats_counters = EngineStats()
        self.scheduler.reset_stats()

    def stats(self) -> EngineStats:
        s = self.stats_counters
        for key, value in self.scheduler.stats().items():
            setattr(s, key, value)
        return s
