"""ModelRunner: executes a StepPlan — builds the flat batch, runs the model, samples."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.snapshot_pool import SnapshotPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.engine.request import PENDING_TOKEN
from deltaserve.engine.step_plan import ScheduledChunk, StepPlan
from deltaserve.kernels.capture_rows import CaptureRows
from deltaserve.models.decoder import DecoderLM
from deltaserve.host_to_device import columns_to_device, to_device
from deltaserve.runner.batch_builder import HostBatch, build_host_batch, pad_block_tables
from deltaserve.runner.cuda_graphs import DecodeGraphs
from deltaserve.runner.forward_batch import ForwardBatch, OutputRows
from deltaserve.runner.launched_step import LaunchedStep
from deltaserve.runner.prefill_graphs import MAX_ROWS, PrefillGraphs
from deltaserve.runner.sampler import Sampler, prompt_logprob_entries
from deltaserve.runner.snapshot_steps import chunk_end_saves, mid_chunk_capture_rows, restore_pairs
from deltaserve.runner.speculative_step import SpeculativeStep

# A first chunk longer than the prefill graphs' last rung attends through cuDNN (attention/fresh_prefill.py):
# up to that rung paged attention's long-chunk tiles take as long (2048 tokens 89.3 against 89.2 us a layer,
# 1024 tokens 42.6 against 29.6; paged_attention_prefill.json), where cuDNN builds a plan for each prompt
# length it has not seen (54-57 ms, fresh_attention_new_lengths_at_1c13f5a.json) and, once started, makes
# the decode steps slower (fresh_prefill's docstring). So under the server's default step of 2048 tokens cuDNN
# never starts.
FRESH_PREFILL_MIN_TOKENS = MAX_ROWS + 1

# A step of decode rows and one prefill chunk of at most this many rows (a request arriving while others
# decode) runs as two graphs, the decode rows' and the chunk's, instead of one eager pass. Eagerly a pass of
# 128 to 1024 rows is bound by the host's launches on most hosts: one prompt of the Qwen3.5-9B shape took
# 20-53 ms whatever its length, where its graph took 7.3-7.9 ms at 128 tokens and 16.8-17.1 at 600
# (prefill_graphs.LADDER's notes), and the decode graph takes 4.5-9.4 ms a step from 1 to 128 rows. On a host
# whose eager passes were fast, 1024 rows took 24.7-25.2 ms eagerly and 25.2-26.5 as a graph: there the
# decode graph would be added for nothing, while at 512 rows the two graphs take about what the host's
# launches do. A longer chunk's kernels outlast the launches, and its decode rows ride along for little.
MIXED_SPLIT_MAX_ROWS = 512
# Beside many decode rows the eager pass also runs their rows' layers eagerly, and the split wins for longer
# chunks: on an H100 at the 9B shape (arrival_step_qwen3.5-9b_h100.json) a 1024-token arrival took 32.7 /
# 38.0 ms split against 34.8 / 48.3 eagerly beside 32 / 128 decoding requests, where beside 1 and 8 the
# split lost (30.5 / 31.2 against 26.4 / 28.2).
MIXED_SPLIT_MAX_ROWS_BESIDE_MANY = 1024
MANY_DECODE_ROWS = 32


def mixed_split_max_rows(decode_rows: int) -> int:
    """The longest prefill chunk that runs as its own graph beside `decode_rows` decode rows."""
    return MIXED_SPLIT_MAX_ROWS_BESIDE_MANY if decode_rows >= MANY_DECODE_ROWS else MIXED_SPLIT_MAX_ROWS


@dataclass
class StepResult:
    sampling: list[ScheduledChunk] = field(default_factory=list)  # chunks whose last row yielded a token
    tokens: list[int] = field(default_factory=list)
    logprobs: list | None = None  # per sampling chunk, when any asked
    # request -> (first prompt position predicted, entries), for requests asking prompt logprobs
    prompt_logprobs: dict = field(default_factory=dict)
    # speculative decoding: verify chunk -> the drafts it accepted, which come before its token in `tokens` (the
    # chunk is cut to its rows up to them, ScheduledChunk.keep_verified); request -> the drafts its next step verifies
    accepted: dict = field(default_factory=dict)
    drafts: dict = field(default_factory=dict)
    draft_logprobs: dict = field(default_factory=dict)  # verify chunk -> its kept drafts' logprob entries, where asked


class ModelRunner:
    def __init__(self, model: DecoderLM, kv_pool: KVPool | None, state_pool: StatePool | None, block_size: int,
                 device: torch.device, sampler: Sampler, graphs: DecodeGraphs | None = None,
                 snapshots: SnapshotPool | None = None, prefill_graphs: PrefillGraphs | None = None,
                 speculative: SpeculativeStep | None = None):
        self.model = model
        self.speculative = speculative  # None: no speculative decoding
        self.snapshots = snapshots  # prefix-cache GDN state snapshots; None without GDN layers or caching
        self.graphs = graphs  # None: every step runs eagerly
        self.prefill_graphs = prefill_graphs  # None: every prefill pass runs eagerly
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.block_size = block_size
        self.device = device
        self.sampler = sampler

    @torch.inference_mode()
    def execute(self, plan: StepPlan):
        """Runs one step: the sampled tokens of the chunks that reach their end, and logprobs asked for."""
        if self.speculative is not None:
            return self.speculative.execute(self, plan)
        return self.execute_plain(plan)

    def execute_plain(self, plan: StepPlan) -> StepResult:
        """A step without drafts to verify: its decode graph, its decode rows' and prefill chunk's graphs, or an
        eager pass."""
        passes = self.graph_passes(plan)
        if passes is not None:
            return self._execute_graphs(plan, *passes)
        sampling = [c for c in plan.chunks if c.samples]
        prompt_logprobs = {}
        decode_graph = self._replayable(plan)
        captures = mid_chunk_capture_rows(plan) if self.snapshots is not None and not decode_graph else []
        self._prepare_states(plan, restore_pairs(plan))
        host = build_host_batch(plan, self.block_size)
        if decode_graph:
            logits, _ = self.graphs.run(host)
        else:
            every_row = any(c.request.params.prompt_logprobs is not None for c in plan.chunks)
            batch = self.to_forward_batch(host, plan.is_decode, output_rows=not every_row)
            if captures:  # the GDN kernels save these states as they pass the rows
                batch.capture_rows, batch.snapshot_pool = CaptureRows(captures), self.snapshots
            hidden = self.model(batch.input_ids, batch)
            if batch.output_rows is None:  # the hidden states of every row
                prompt_logprobs = self._prompt_logprobs(plan, host, hidden)
                hidden = hidden[batch.logits_indices]
            logits = self.model.compute_logits(hidden) if sampling else None
        self._save_snapshots(plan)
        if not sampling:
            return StepResult(prompt_logprobs=prompt_logprobs)
        tokens, logprobs = self.sampler(logits, [c.request for c in sampling])
        return StepResult(sampling, tokens, logprobs, prompt_logprobs)

    def _execute_graphs(self, plan: StepPlan, decode: StepPlan | None, prefill: StepPlan,
                        captures: list[tuple[int, int]]) -> StepResult:
        """Runs `plan` as its decode rows' graph (`decode`, None without them), then its prefill chunk's
        (`prefill`, whose mid-chunk captures are `captures`); see graph_passes. The prefill graph restores its
        sequence's state and copies its KV tail itself (see PrefillGraphs); the LM head runs after it, where
        the chunk samples."""
        self._prepare_states(plan, [], copy_blocks=False)
        logits, sampling = [], []
        if decode is not None:
            logits.append(self.graphs.run(build_host_batch(decode, self.block_size))[0])
            sampling += decode.chunks  # every decode row samples
        hidden = self.run_prefill_graph(prefill, captures)
        chunk = prefill.chunks[0]
        if chunk.samples:
            logits.append(self.model.compute_logits(hidden))
            sampling.append(chunk)
        self._save_snapshots(plan)
        if not sampling:
            return StepResult()
        tokens, logprobs = self.sampler(torch.cat(logits) if len(logits) > 1 else logits[0],
                                        [c.request for c in sampling])
        return StepResult(sampling, tokens, logprobs)

    def run_prefill_graph(self, prefill: StepPlan, captures: list[tuple[int, int]]) -> torch.Tensor:
        """Replays the prefill graph of `prefill`'s one chunk (see graph_passes); its last row's hidden state
        (every row's, where the graphs keep them all: PrefillGraphs.every_row)."""
        restores = restore_pairs(prefill)
        return self.prefill_graphs.run(build_host_batch(prefill, self.block_size), captures,
                                       restores[0] if restores else None,
                                       prefill.block_copies[0].pair if prefill.block_copies else None)

    def graph_passes(self, plan: StepPlan, replayable=None) -> tuple[StepPlan | None, StepPlan, list] | None:
        """A step of one prompt chunk, alone or beside decoding rows, as the plan of those rows (None without them),
        which `replayable` says a graph holds (the decode graphs' by default; a drafting engine's verify graphs),
        and the chunk's plan with its mid-chunk captures (rows counted from its first), which a prefill graph
        replays: None unless both replay. Beside decoding rows the chunk holds at most mixed_split_max_rows rows,
        and a restore or a tail's copy for one of them (a prompt restored to its last token) keeps the step
        eager."""
        if self.prefill_graphs is None or plan.is_decode:
            return None
        chunks = [c for c in plan.chunks if c.num_tokens > 1 and not c.draft_token_ids]
        if len(chunks) != 1:
            return None
        chunk = chunks[0]
        rows = [c for c in plan.chunks if c is not chunk]
        decode = StepPlan(chunks=rows) if rows else None
        if decode is not None and (chunk.num_tokens > mixed_split_max_rows(len(rows))
                                   or not (replayable or self._replayable)(decode)):
            return None
        prefill = StepPlan(chunks=[chunk], restores=plan.restores, block_copies=plan.block_copies,
                           captures=[c for c in plan.captures if c.chunk is chunk])
        captures = mid_chunk_capture_rows(prefill) if self.snapshots is not None else []
        if not self._prefill_replayable(prefill, captures):
            return None
        return decode, prefill, captures

    def can_launch(self, plan: StepPlan) -> bool:
        """Whether the plan can run without its tokens being read back before the next step is
        planned: decode rows whose sampling needs only their logits."""
        return (self.speculative is None and plan.is_decode
                and all(c.samples and Sampler.device_only(c.request.params) for c in plan.chunks))

    @torch.inference_mode()
    def launch(self, plan: StepPlan, previous: LaunchedStep | None) -> LaunchedStep:
        """Queues a decode step (see can_launch) and returns without waiting for it. A row whose input
        token is still pending takes it on the device from `previous`, the step that sampled it."""
        self._prepare_states(plan, restore_pairs(plan))
        host = build_host_batch(plan, self.block_size)
        # Row r's input id, where pending: the token `previous` sampled in its row sources[r] (else -1).
        sources = [previous.rows[c.request] if token == PENDING_TOKEN else -1
                   for c, token in zip(plan.chunks, host.input_ids)]
        requests = [c.request for c in plan.chunks]
        if not self._replayable(plan):
            batch = self.to_forward_batch(host, plan.is_decode)
            _take_pending(batch.input_ids, sources, previous)
            logits = self.model.compute_logits(self.model(batch.input_ids, batch)[batch.logits_indices])
            self._save_snapshots(plan)
            return LaunchedStep(plan, self.sampler.sample_on_device(logits, requests))
        # With graphs every launched step is replayed (it has at most max_num_seqs rows), and each leaves
        # its tokens in the buffers' sampled_tokens: the graph takes the pending ones from there itself.
        logits, greedy = self.graphs.run(host, sources)
        self._save_snapshots(plan)
        if Sampler.greedy(requests):
            return LaunchedStep(plan, greedy)
        tokens = self.sampler.sample_on_device(logits, requests)
        greedy.copy_(tokens)  # rows sampled otherwise: where the next graph reads them
        return LaunchedStep(plan, tokens)

    def _prepare_states(self, plan: StepPlan, restores: list[tuple[int, int]], copy_blocks: bool = True) -> None:
        """Copies the cached tails that hits restore from into the requests' own blocks, zeroes the
        state slots of sequences starting from their first token and copies the restored snapshots
        `restores` (snapshot slot, state slot) into theirs (a one-token prompt, or one restored to its
        last token, makes a plan that looks like decode)."""
        if copy_blocks and plan.block_copies and self.kv_pool is not None:
            self.kv_pool.copy_blocks([c.pair for c in plan.block_copies])
        if self.state_pool is not None:
            self.state_pool.reset(plan.reset_state_slots)
        if self.snapshots is not None:
            self.snapshots.restore(restores, self.state_pool)

    def _prompt_logprobs(self, plan: StepPlan, host: HostBatch, hidden: torch.Tensor) -> dict:
        """For requests that ask: the logprob of each prompt token their rows of this step predict
        (the row at position p predicts the prompt token at p + 1)."""
        found = {}
        for chunk, row0 in zip(plan.chunks, host.query_start_loc):
            request = chunk.request
            top = request.params.prompt_logprobs
            last = min(chunk.end, request.num_prompt_tokens - 1)  # positions whose next token is in the prompt
            if top is None or chunk.start >= last:
                continue
            logits = self.model.compute_logits(hidden[row0 : row0 + last - chunk.start])
            targets = request.prompt_token_ids[chunk.start + 1 : last + 1]
            found[request] = (chunk.start + 1, prompt_logprob_entries(logits, targets, top))
        return found

    @torch.inference_mode()
    def save_states(self, pairs: list[tuple[int, int]]) -> None:
        """(state slot, snapshot slot): saves finished sequences' states, queued behind every step so far."""
        if pairs:
            self.snapshots.save(pairs, self.state_pool)

    def _save_snapshots(self, plan: StepPlan) -> None:
        if self.snapshots is not None:
            self.snapshots.save(chunk_end_saves(plan), self.state_pool)

    def _replayable(self, plan: StepPlan) -> bool:
        return (self.graphs is not None and plan.is_decode and len(plan.chunks) <= self.graphs.max_batch
                and all(c.samples for c in plan.chunks))

    def _prefill_replayable(self, plan: StepPlan, captures: list[tuple[int, int]]) -> bool:
        """One sequence's short prefill pass (a prefix-cache hit's tail, a short prompt)."""
        if self.prefill_graphs is None or len(plan.chunks) != 1 or plan.is_decode:
            return False
        chunk = plan.chunks[0]
        return (chunk.request.params.prompt_logprobs is None
                and all(r.request is chunk.request for r in plan.restores)  # the graph restores its own
                and all(c.request is chunk.request for c in plan.block_copies)  # and copies its own tail
                and self.prefill_graphs.rung(chunk.num_tokens, captures) is not None)

    def to_forward_batch(self, host: HostBatch, is_decode: bool, output_rows: bool = False) -> ForwardBatch:
        """output_rows: the model may return the logits rows' hidden states alone (see OutputRows); it does
        where they are fewer than all the rows."""
        starts = host.query_start_loc
        lengths = [end - start for start, end in zip(starts[:-1], starts[1:])]
        rows = len(host.logits_indices)
        output_rows = output_rows and rows < starts[-1]
        tables = pad_block_tables(host.block_tables)
        columns = [host.input_ids, host.positions, starts, host.seq_lens, tables, host.slot_mapping,
                   host.state_slots, host.logits_indices]
        if output_rows:  # each logits row as a one-row chunk of its sequence
            sampled = host.logits_sequences
            columns += [range(rows + 1), [host.seq_lens[s] for s in sampled], [tables[s] for s in sampled]]
        input_ids, positions, query_start_loc, seq_lens, block_tables, slot_mapping, state_slots, logits_indices, \
            *one_row_chunks = columns_to_device(columns, self.device)
        batch = ForwardBatch(
            input_ids=input_ids,
            positions=positions,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            block_tables=block_tables,
            slot_mapping=slot_mapping,
            state_slots=state_slots,
            logits_indices=logits_indices,
            is_decode=is_decode,
            kv_pool=self.kv_pool,
            state_pool=self.state_pool,
            fresh_query_start_loc=starts if self._fresh_prefill(host, lengths) else None,
            max_query_len=max(lengths, default=0),
        )
        if output_rows:
            batch.output_rows = OutputRows(logits_indices, *one_row_chunks)
        return batch

    def _fresh_prefill(self, host: HostBatch, lengths: list[int]) -> bool:
        """Prompts that all start at position 0, one of FRESH_PREFILL_MIN_TOKENS rows or more: dense attention
        within each chunk. lengths: each sequence's rows in this step."""
        return (self.device.type == "cuda" and max(lengths, default=0) >= FRESH_PREFILL_MIN_TOKENS
                and all(n == seq_len for n, seq_len in zip(lengths, host.seq_lens)))


def _take_pending(input_ids: torch.Tensor, sources: list[int], previous: LaunchedStep | None) -> None:
    """input_ids[row] = the token `previous` sampled in its row sources[row], for each row whose source is >= 0."""
    pending = [(row, source) for row, source in enumerate(sources) if source >= 0]
    if pending:
        rows, taken = to_device(list(zip(*pending)), input_ids.device)  # one copy: [2, len(pending)]
        input_ids.index_copy_(0, rows, previous.tokens.index_select(0, taken))
