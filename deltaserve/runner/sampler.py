"""Sampler: turns the logits of the rows that sample into tokens (and logprobs when asked).

Randomness: each sampled row draws its noise from a 63-bit seed (kernels.sampling.reference.uniforms
hashes it with the token's index, so the draws are the same on every device). A request with a seed
gives its rows the seed of (seed + sample index, output position), so the same request gives the same
text whatever runs beside it and whether or not it was preempted, and its sample i draws as sample 0 of a
request seeded seed + i (vLLM seeds its n samples so); other rows take theirs from the engine's generator,
seeded once.
"""

from __future__ import annotations

import random
import weakref
from array import array

import numpy as np
import torch

from deltaserve import kernels
from deltaserve.engine.grammar import fill_masks, fill_masks_along_drafts, mask_shape
from deltaserve.engine.request import Request
from deltaserve.outputs import Logprob
from deltaserve.host_to_device import to_device
from deltaserve.kernels.sampling.reference import mask_logits, token_bits, without_tokens
from deltaserve.sampling_params import SamplingParams, logprobs_count

_MIX = 0x9E3779B97F4A7C15


def row_top_k(params: SamplingParams, vocab: int) -> int:
    """A row's k, at most the vocabulary (any int64 is asked for); 0 where top-k is off (-1)."""
    return min(params.top_k, vocab) if params.top_k > 0 else 0


def mask_plan(params: list[SamplingParams], vocab: int) -> kernels.MaskPlan:
    """The batch's MaskPlan from its sampled rows' parameters (greedy rows take their argmax unmasked)."""
    sampled = [p for p in params if p.temperature > 0]
    top_k = [row_top_k(p, vocab) for p in sampled]
    nucleus = any(not k and (p.top_p < 1 or p.min_p > 0) for k, p in zip(top_k, sampled))
    min_p = any(not k and p.min_p > 0 for k, p in zip(top_k, sampled))
    return kernels.MaskPlan(max(top_k, default=0), bool(sampled) and all(top_k), nucleus, len(sampled) < len(params),
                            min_p)


def row_seed(seed: int, sample_index: int, position: int) -> int:
    """A 63-bit seed that differs for every (seed, sample, position)."""
    value = (seed * _MIX + sample_index * 0x632BE59BD9B4E019 + position * 0x85EBCA77C2B2AE63) & (2**64 - 1)
    return value >> 1


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int, logprobs_mode: str = "raw_logprobs"):
        self.vocab_size = vocab_size
        self.device = device
        self.logprobs_mode = logprobs_mode  # EngineConfig.logprobs_mode: what a token's logprobs report
        self.generator = random.Random(seed)  # the seeds of rows whose request has none
        self._prompt_tokens = weakref.WeakKeyDictionary()  # request -> its prompt's distinct tokens, on the device
        self._output_tokens = weakref.WeakKeyDictionary()  # request -> array("i") of its output tokens read back
        self._allowed = weakref.WeakKeyDictionary()  # request -> bool [V] of its allowed_token_ids, on the device
        self._allowed_ids = weakref.WeakKeyDictionary()  # request -> its allowed_token_ids, a host tensor
        tail = vocab_size % 32  # the bits of a grammar mask's last word that are tokens
        self._last_word_tokens = (1 << tail) - 1 if tail else -1

    def __call__(self, logits: torch.Tensor, requests: list[Request]):
        """logits [B, V] fp32 for requests[b]. Returns (token ids, per-row logprob dicts or None)."""
        params = [r.params for r in requests]
        processed = logits[:, : self.vocab_size]
        if any(r.grammar is not None and r.grammar.active for r in requests):
            processed = self._constrained(processed, requests)
        reported = processed  # vLLM's raw logits: the model's, under the grammar's mask, before biases and penalties
        if any(r.adjusts_logits for r in requests):  # vLLM's order: biases and refusals, then the penalties
            processed = self._adjusted(processed, requests)
        if any(_has_penalty(p) for p in params):
            processed = self._penalise(processed, requests)
        tokens = self.sample_on_device(processed, requests, adjusted=True).tolist()
        if not any(p.returns_logprobs for p in params):
            return tokens, None
        if self.logprobs_mode.startswith("processed"):
            reported = self.drawn_from(processed, requests)
        if self.logprobs_mode.endswith("logprobs"):
            reported = torch.log_softmax(reported, dim=-1)
        return tokens, self._logprobs(reported, tokens, requests)

    def drawn_from(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """The logits each row's token is drawn from (vLLM's processed logits): a sampled row's scaled by its
        temperature, -inf where its top-k, top-p and min-p exclude; a greedy row's as they are. `logits` carry
        the rows' biases, refusals and penalties. Computed as the definition in kernels.sampling.reference
        computes them (a mode a request opts into; the sampling kernels never write them out)."""
        params = [r.params for r in requests]
        sampled = [p.temperature > 0 for p in params]
        tensor = lambda values, dtype: to_device(values, self.device, dtype)  # noqa: E731
        temperature = tensor([p.temperature for p in params], torch.float32)
        inverse = torch.where(temperature > 0, 1.0 / temperature, 1.0)[:, None]
        masks = [s and (row_top_k(p, self.vocab_size) or p.top_p < 1 or p.min_p > 0) for p, s in zip(params, sampled)]
        if not any(masks):
            return logits[:, : self.vocab_size] * inverse  # no row masks: no sort of the vocabulary
        top_k = tensor([row_top_k(p, self.vocab_size) if s else 0 for p, s in zip(params, sampled)], torch.int64)
        top_p = tensor([p.top_p if s else 1.0 for p, s in zip(params, sampled)], torch.float32)
        min_p = tensor([p.min_p if s else 0.0 for p, s in zip(params, sampled)], torch.float32)
        return mask_logits(logits[:, : self.vocab_size] * inverse, top_k, top_p, min_p)

    def compile_grammar_mask(self) -> None:
        """Masks one row that a grammar holds to every token, so that the mask's kernel compiles at start-up
        rather than under the first request with a grammar (whose matcher the warm-up does not build)."""
        logits = torch.zeros(1, self.vocab_size, device=self.device)
        everything = torch.full(mask_shape(1, self.vocab_size), -1, dtype=torch.int32, device=self.device)
        kernels.apply_token_bitmask(logits, everything, torch.zeros(1, dtype=torch.int32, device=self.device))

    @staticmethod
    def device_only(params) -> bool:
        """Whether a row's sampling needs nothing but its logits on the device: no logprobs to read
        back, no penalties over its past tokens, and no grammar, bad words or thinking budget, whose refusals
        follow the last token (a step can then start before the last one's tokens are read back)."""
        return not params.returns_logprobs and params.prompt_logprobs is None and not Sampler.follows_past(params)

    @staticmethod
    def follows_past(params) -> bool:
        """Whether what a row may draw depends on the tokens before it: penalties, a grammar, bad words, a
        thinking budget."""
        return (_has_penalty(params) or params.structured_outputs is not None or bool(params.bad_words)
                or params.thinking_token_budget is not None)

    def logprob_entries(self, logits: torch.Tensor, tokens: list[int], requests: list[Request]) -> list:
        """Each row's logprob entry for `tokens`, as __call__ reports them, for rows whose logits the sampler
        changes nothing of (no grammar, biases, refusals or penalties; in a processed mode, logits that carry
        them already, follow_drafts'): the logprobs mode's values of its logits."""
        reported = logits[:, : self.vocab_size]
        if self.logprobs_mode.startswith("processed"):
            reported = self.drawn_from(reported, requests)
        if self.logprobs_mode.endswith("logprobs"):
            reported = torch.log_softmax(reported, dim=-1)
        return self._logprobs(reported, tokens, requests)

    @staticmethod
    def greedy(requests: list[Request]) -> bool:
        """Whether every row takes its logits' argmax as they are (what a decode graph computes itself)."""
        return all(r.params.temperature == 0 and r.params.structured_outputs is None and not r.adjusts_logits
                   for r in requests)

    def sample_on_device(self, logits: torch.Tensor, requests: list[Request], adjusted: bool = False) -> torch.Tensor:
        """The tokens [B] (int64, on the logits' device) of rows without penalties (or, `adjusted`, of logits
        that already carry the rows' biases, refusals and penalties); nothing is read back."""
        logits = logits[:, : self.vocab_size]
        if not adjusted and any(r.adjusts_logits for r in requests):
            logits = self._adjusted(logits, requests)
        if all(r.params.temperature == 0 for r in requests):
            return logits.argmax(-1)  # greedy rows need neither masks nor noise
        params = [r.params for r in requests]
        tensor = lambda values, dtype: to_device(values, self.device, dtype)  # noqa: E731
        temperature = tensor([p.temperature for p in params], torch.float32)
        top_k = tensor([row_top_k(p, self.vocab_size) for p in params], torch.int64)
        top_p = tensor([p.top_p for p in params], torch.float32)
        min_p = tensor([p.min_p for p in params], torch.float32)
        seeds = tensor(self._seeds(requests), torch.int64)
        mask = mask_plan(params, self.vocab_size)
        return kernels.sample_from_logits(logits, temperature, top_k, top_p, min_p, seeds, mask=mask)

    @staticmethod
    def changes_logits(request: Request) -> bool:
        """Whether its biases, refusals, forced tokens or penalties may change a verify row's logits: those that
        do now (a refusal that min_tokens holds ends before later rows, never after), and a thinking budget,
        which may force its end at a later row."""
        return request.adjusts_logits or request.thinking is not None or _has_penalty(request.params)

    def constrained_along_drafts(self, logits: torch.Tensor, requests: list[Request],
                                 drafted: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """The logits of verify rows [B, V] where each row under a grammar keeps what the grammar allows after the
        drafts before it (RequestGrammar.fill_masks_along), as _constrained masks a plain step's row: what the
        raw logprobs modes report and what the rest of the sampling starts from; and the rows where that mask,
        the request's allowed_token_ids and what it refuses there leave no token (follow_drafts' dead rows). A
        sequence's rows follow each other, its first row with no drafts before it and its last with all of them."""
        starts = [i for i, r in enumerate(requests) if r.grammar is not None and not drafted[i]]
        if not starts:
            return logits, []
        rows = len(requests)
        bitmask = torch.empty(mask_shape(rows, self.vocab_size), dtype=torch.int32,
                              pin_memory=self.device.type == "cuda")
        mask_rows, sequences = [-1] * rows, []
        for first in starts:
            last = first
            while last + 1 < rows and requests[last + 1] is requests[first] and drafted[last + 1]:
                last += 1
            sequences.append((requests[first].grammar, first, drafted[last]))
            mask_rows[first : last + 1] = range(first, last + 1)
        fill_masks_along_drafts(sequences, bitmask)
        dead_rows = [i for i, r in enumerate(requests) if mask_rows[i] >= 0 and self._leaves_nothing_along(
            bitmask[i], r, drafted[i])]
        masked = kernels.apply_token_bitmask(logits, bitmask.to(self.device, non_blocking=True),
                                             to_device(mask_rows, self.device, torch.int32))
        return masked, dead_rows

    def _leaves_nothing_along(self, mask_row: torch.Tensor, request: Request, drafted: list[int]) -> bool:
        """_constrained's dead end at a verify row: biases or refusals beside the grammar, no forced token."""
        if not (request.adjusts_logits or request.thinking is not None):
            return False
        if request.thinking is not None and request.thinking.forced_after(drafted) is not None:
            return False
        return self._grammar_leaves_nothing(mask_row, request, request.refused_tokens(drafted))

    def follow_drafts(self, logits: torch.Tensor, requests: list[Request],
                      drafted: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """The logits of verify rows [B, V] with each row's biases, refusals and penalties as its request's
        would be were the drafts before it (`drafted[b]`) its output already (what __call__ samples from, less
        temperature and masks), and the rows whose constraints leave no token: the caller marks the first one
        its sequence reaches (Request.mark_dead_end), not one past a refused draft."""
        dead_rows: list[int] = []
        processed = logits
        if any(r.adjusts_logits or r.thinking is not None for r in requests):
            processed = self._adjusted(processed, requests, drafted, dead_rows)
        if any(_has_penalty(r.params) for r in requests):
            processed = self._penalise(processed, requests, drafted)
        return processed, dead_rows

    def _penalise(self, logits: torch.Tensor, requests: list[Request],
                  drafted: list[list[int]] | None = None) -> torch.Tensor:
        prompt, output = self.penalty_tokens(requests, drafted)
        rows = len(requests)
        penalties = np.zeros((3, -(-rows // 4) * 4), dtype=np.float32)  # each row's start 16-byte aligned
        penalties[:, :rows] = [[r.params.repetition_penalty for r in requests],
                               [r.params.frequency_penalty for r in requests],
                               [r.params.presence_penalty for r in requests]]
        repetition, frequency, presence = to_device(penalties, self.device, torch.float32)[:, :rows]
        return kernels.apply_penalties(logits, prompt, output, repetition, frequency, presence)

    def penalty_tokens(self, requests: list[Request], drafted: list[list[int]] | None = None
                       ) -> tuple[kernels.RowTokens, kernels.RowTokens]:
        """Each row's distinct prompt tokens and its output tokens (followed by `drafted[b]`, where given). A
        request's prompt tokens reach the device once, on its first step with penalties; its output tokens are
        kept on the host, each step adding the new ones, and travel with both lists' offsets in one copy: listing
        every prompt and output token of every row again each step cost the host the most
        (benchmarks/penalties_device.py times the step)."""
        prompts, prompt_lengths = zip(*(self._device_prompt(r) for r in requests))
        outputs = [self._output_array(r) for r in requests]
        if drafted is not None:
            outputs = [a + array("i", d) if d else a for a, d in zip(outputs, drafted)]
        output_lengths = [len(a) for a in outputs]
        rows = len(requests)
        prompt_offsets, output_offsets = _offsets(prompt_lengths), _offsets(output_lengths)
        packed = to_device(np.concatenate([prompt_offsets, output_offsets,
                                           *(np.frombuffer(a, dtype=np.int32) for a in outputs)]),
                           self.device, torch.int32)
        output_at = len(prompt_offsets)
        tokens_at = output_at + len(output_offsets)
        prompt = kernels.RowTokens(torch.cat(prompts), packed[: rows + 1], max(prompt_lengths))
        output = kernels.RowTokens(packed[tokens_at:], packed[output_at : output_at + rows + 1], max(output_lengths))
        return prompt, output

    def _device_prompt(self, request: Request) -> tuple[torch.Tensor, int]:
        """The request's distinct prompt tokens on the device, and how many."""
        entry = self._prompt_tokens.get(request)
        if entry is None:
            distinct = np.unique(np.asarray(request.prompt_token_ids, dtype=np.int32))
            entry = self._prompt_tokens[request] = (to_device(distinct, self.device, torch.int32), len(distinct))
        return entry

    def _output_array(self, request: Request) -> array:
        """The request's output tokens read back so far, the array kept from its last step grown by the new
        ones (made again if the output shrank)."""
        resolved = len(request.output_token_ids) - request.num_pending_tokens
        tokens = self._output_tokens.get(request)
        if tokens is None or len(tokens) > resolved:
            tokens = self._output_tokens[request] = array("i")
        tokens.extend(request.output_token_ids[len(tokens) : resolved])
        return tokens

    def _constrained(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """A copy of the logits where each row with an active grammar keeps only the tokens it allows (-inf
        elsewhere). Logprobs are read from this copy, as vLLM masks the logits before its sampler reads them."""
        rows = [i for i, r in enumerate(requests) if r.grammar is not None and r.grammar.active]
        # filled in pinned memory where it travels to a GPU, so that its copy neither blocks nor copies twice
        bitmask = torch.empty(mask_shape(len(rows), self.vocab_size), dtype=torch.int32,
                              pin_memory=self.device.type == "cuda")
        fill_masks([requests[i].grammar for i in rows], bitmask)
        for row, i in enumerate(rows):
            if (requests[i].adjusts_logits and requests[i].forced_token is None
                    and self._grammar_leaves_nothing(bitmask[row], requests[i])):
                requests[i].mark_dead_end()
        mask_rows = [-1] * len(requests)
        for row, i in enumerate(rows):
            mask_rows[i] = row
        return kernels.apply_token_bitmask(logits, bitmask.to(self.device, non_blocking=True),
                                           to_device(mask_rows, self.device, torch.int32))

    def _grammar_leaves_nothing(self, mask_row: torch.Tensor, request: Request, refused: list[int] | None = None
                                ) -> bool:
        """Whether none of the tokens a grammar's mask row (on the host) allows is among the request's
        allowed_token_ids and outside what it refuses (`refused`, where given; else what it refuses now). Read at
        the bits of those tokens alone, words of 32 tokens: at a 248k vocabulary 0.05 ms a row and step, where the
        whole row unpacked took 0.34."""
        allowed = request.params.allowed_token_ids
        refused = request.refused_tokens() if refused is None else refused
        if allowed is None and not refused:  # its logit bias alone changes no token's place in the mask
            return False
        kept = without_tokens(mask_row, refused)
        kept[-1] &= self._last_word_tokens  # none of the bits past the vocabulary
        if allowed is None:
            return not kept.any()
        ids = self._allowed_ids.get(request)
        if ids is None:
            ids = self._allowed_ids[request] = torch.tensor(allowed)
        return not token_bits(kept, ids).any()

    def _adjusted(self, logits: torch.Tensor, requests: list[Request], drafted: list[list[int]] | None = None,
                  dead_rows: list[int] | None = None) -> torch.Tensor:
        """A copy of the logits (the logits themselves stay the model's: logprobs are read from them) with each
        row's logit_bias added, and -inf outside its allowed_token_ids and over the tokens it refuses now
        (Request.refused_tokens: stop tokens before min_tokens, bad words). A row with a forced token (a think
        block's end) keeps that token alone, whatever the rest allow. drafted: verify rows' drafts before them
        (follow_drafts), whose rows that allow no token go to `dead_rows` rather than mark their request."""
        adjusted = logits.clone()
        rows, tokens, biases = [], [], []
        for i, r in enumerate(requests):
            for token, bias in (r.params.logit_bias or {}).items():
                rows.append(i)
                tokens.append(token)
                biases.append(bias)
        if rows:
            bias = to_device(biases, self.device, torch.float32).to(logits.dtype)
            adjusted[to_device(rows, self.device), to_device(tokens, self.device)] += bias
        allowed = [i for i, r in enumerate(requests) if r.params.allowed_token_ids is not None]
        if allowed:
            index = to_device(allowed, self.device)
            masks = torch.stack([self._allowed_mask(requests[i]) for i in allowed])
            adjusted[index] = adjusted[index].masked_fill(~masks, float("-inf"))
        rows, tokens, forced = [], [], []
        for i, r in enumerate(requests):
            if drafted is None:
                refused, forced_token = r.refused_tokens() if r.adjusts_logits else (), r.forced_token
            else:
                refused = r.refused_tokens(drafted[i])
                forced_token = r.thinking.forced_after(drafted[i]) if r.thinking is not None else None
            if forced_token is None and r.allows_no_token(refused):
                if drafted is not None:
                    dead_rows.append(i)
                else:
                    r.mark_dead_end()  # the row samples a token it refuses, which the engine never takes
            rows += [i] * len(refused)
            tokens += refused
            if forced_token is not None:
                forced.append((i, forced_token))
        if rows:
            adjusted[to_device(rows, self.device), to_device(tokens, self.device)] = float("-inf")
        if forced:
            rows, tokens = (to_device(list(column), self.device) for column in zip(*forced))
            adjusted[rows] = float("-inf")
            adjusted[rows, tokens] = 0.0
        return adjusted

    def _allowed_mask(self, request: Request) -> torch.Tensor:
        """bool [V] of the request's allowed_token_ids on the device, made once; built there from pinned ids (a
        pageable copy would wait for the GPU)."""
        mask = self._allowed.get(request)
        if mask is None:
            mask = self._allowed[request] = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            mask[to_device(request.params.allowed_token_ids, self.device)] = True
        return mask

    def _seeds(self, requests: list[Request]) -> list[int]:
        """Each row's 63-bit noise seed: its request's own (row_seed) or the engine generator's next (0 for
        greedy rows, which draw nothing)."""
        return [0 if r.params.temperature == 0 else self.generator.getrandbits(63) if r.params.seed is None
                else row_seed(r.params.seed + r.sample_index, 0, len(r.output_token_ids)) for r in requests]

    def _logprobs(self, logprobs: torch.Tensor, tokens: list[int], requests: list[Request]):
        """Each row's logprob entry (or None where its request asks for none) from the values its logprobs
        mode reports [B, V]."""
        return [logprob_entry(logprobs[i], tokens[i], r.params.logprobs or 0, r.params.logprob_token_ids or ())
                if r.params.returns_logprobs else None for i, r in enumerate(requests)]


def logprob_entry(row: torch.Tensor, token: int, top: int, named=()) -> dict[int, Logprob]:
    """`token`'s logprob and rank in one row of log-probabilities, then the `top` best tokens (-1: every token)
    or, where asked for, the `named` ones (vLLM's logprob_token_ids) in their stead. As vLLM's: a token's rank
    counts the tokens at least as likely (itself, and any tied with it), and the top tokens are ranked 1, 2, ...
    in their order, the sampled one too where it is among them."""
    chosen = row[token]
    entry = {token: Logprob(chosen.item(), int((row >= chosen).sum().item()))}
    if named:
        ids = torch.tensor(list(named), device=row.device)
        values = row[ids]
        ranks = (row.unsqueeze(0) >= values.unsqueeze(1)).sum(dim=1)  # [named]: one pass over the row each
        for tid, value, rank in zip(ids.tolist(), values.tolist(), ranks.tolist()):
            entry.setdefault(tid, Logprob(value, rank))
    elif top:
        values, ids = row.topk(min(logprobs_count(top, row.numel()), row.numel()))
        for rank, (value, tid) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            entry[tid] = Logprob(value, rank)
    return entry


def prompt_logprob_entries(logits: torch.Tensor, targets: list[int], top: int) -> list[dict[int, Logprob]]:
    """Row i of `logits` predicts prompt token `targets[i]`: one entry per row."""
    logprobs = torch.log_softmax(logits[:, : logits.shape[1]].float(), dim=-1)
    return [logprob_entry(logprobs[i], t, top) for i, t in enumerate(targets)]


def _offsets(lengths: list[int]) -> np.ndarray:
    """[0, l0, l0 + l1, ...] (int32): where each row's list starts in the concatenation, and its end; padded
    to a multiple of four (16 bytes), so that the parts packed after it start aligned whatever the row count
    (Triton compiles a kernel of its own for each alignment of its pointers)."""
    offsets = np.zeros(-(-(len(lengths) + 1) // 4) * 4, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1 : len(lengths) + 1])
    return offsets


def _has_penalty(p) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
