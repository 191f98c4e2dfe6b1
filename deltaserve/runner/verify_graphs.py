"""Speculative verify steps as CUDA graphs: a step of decoding sequences, each its last token and up to k drafts,
is n sequences of k + 1 rows each, padded to a rung of the decode ladder, over StepBuffers (load_verify). A
sequence with fewer drafts (none found, or cut short by max_tokens) fills its k + 1 rows with its last token
(pad_rows): those rows write no KV, and no verdict or state is taken from them (the sequence's state is set back
past them, runner/speculative_step.py), so they cost the graph's rows and change nothing.

The graph runs the target model over all the rows as one chunked pass (paged attention over each sequence's keys,
the GDN token loop) and turns every row into logits. Its GDN layers leave the recurrent states as they were and
keep the rows' inputs in a GdnStash: once the verdicts are in, GdnStash.commit advances each sequence's state
through the rows it kept, in one launch (gdn_stash.py). The conv states, a few rows each, are updated in place and
captured after each sequence's rows but the last into its k conv-only verify slots, a table fixed for each rung
(sequence b's row j into verify slot b * k + j), so a sequence whose drafts are refuted takes its conv state back
from there. It returns the logits and the final hidden states of every row, which the sampler and the MTP head
read (runner/speculative_step.py)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from deltaserve.cache.snapshot_pool import SnapshotPool
from deltaserve.engine.step_plan import ScheduledChunk, StepPlan
from deltaserve.kernels.capture_rows import CaptureRows, GraphCaptureRows
from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.cuda_graphs import batch_size_ladder, capture_graph
from deltaserve.runner.gdn_stash import GdnStash
from deltaserve.runner.step_buffers import StepBuffers

log = logging.getLogger(__name__)


class VerifyGraphs:
    def __init__(self, model, buffers: StepBuffers, num_speculative_tokens: int, max_num_seqs: int,
                 verify_states: SnapshotPool | None, block_size: int, stash: GdnStash | None = None):
        """verify_states, stash: the conv-only verify slots and the GDN inputs' stash (None without GDN layers)."""
        self.model = model
        self.buffers = buffers
        self.num_speculative_tokens = num_speculative_tokens
        self.rows_per_seq = num_speculative_tokens + 1
        # a sequence's k + 1 rows attend over the keys its block table holds up to the last of them, so they must
        # lie within the table's width (only a sequence at the end of max_model_len with fewer drafts reaches past)
        self.max_positions = buffers.max_blocks * block_size
        self.verify_states = verify_states  # None without GDN layers
        self.sizes = [s for s in batch_size_ladder(max_num_seqs) if s * self.rows_per_seq <= buffers.max_rows]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # (logits, hidden) a captured rung writes
        self._captures: dict[int, CaptureRows] = {}
        self.last_size: int | None = None  # the rung of the step last run
        self._uncaptured_hidden: dict[int, torch.Tensor] = {}  # a rung's hidden states, run without a graph
        self.stash = stash

    def capture(self, pool) -> None:
        started, before = time.perf_counter(), torch.cuda.memory_allocated()
        empty = HostBatch([], [], [0], [], [], [], [], [])
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory
            self.buffers.load_verify(empty, size, self.rows_per_seq)
            self.graphs[size], self.outputs[size] = capture_graph(lambda: self._forward(size), pool)
        stash = self.stash.nbytes if self.stash is not None else 0
        log.info("captured %d speculative verify graphs (%d..%d sequences of %d rows) in %.1f s using %.0f MiB "
                 "(beside the %.0f MiB stash of GDN inputs kept for the commit)", len(self.sizes), self.sizes[0],
                 self.sizes[-1], self.rows_per_seq, time.perf_counter() - started,
                 (torch.cuda.memory_allocated() - before) / 2**20, stash / 2**20)

    def replayable(self, plan: StepPlan) -> bool:
        """A step of decoding sequences alone (each its last token and up to k drafts). Its restores, block
        copies and state resets run before the graph and its snapshots after (SpeculativeStep), as a decode
        graph's do: a decoding sequence's captures are its state after the step (a verify chunk has none)."""
        return (bool(plan.chunks) and all(self._decodes(c) for c in plan.chunks)
                and all(c.at_chunk_end for c in plan.captures) and self.rung(len(plan.chunks)) is not None)

    def _decodes(self, chunk: ScheduledChunk) -> bool:
        return (chunk.samples and chunk.num_tokens == len(chunk.draft_token_ids) + 1
                and chunk.start + self.rows_per_seq <= self.max_positions)

    def rung(self, num_seqs: int) -> int | None:
        return next((s for s in self.sizes if s >= num_seqs), None)

    def run(self, host: HostBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Replays the smallest rung that holds the step (without a captured graph, as on the CPU, the same padded
        step runs eagerly); returns the logits and the hidden states of its real rows."""
        n = len(host.seq_lens)
        size = self.rung(n)
        self.buffers.load_verify(pad_rows(host, self.rows_per_seq), size, self.rows_per_seq)
        if size in self.graphs:
            self.graphs[size].replay()
            logits, hidden = self.outputs[size]
        else:
            logits, hidden = self._forward(size)
            self._uncaptured_hidden[size] = hidden
        self.last_size = size
        rows = n * self.rows_per_seq
        return logits[:rows], hidden[:rows]

    def hidden_of(self, size: int) -> torch.Tensor:
        """The hidden states of every row (padding ones too) of rung `size`'s last step: where its graph writes
        them, or what its last uncaptured run gave."""
        return self.outputs[size][1] if size in self.outputs else self._uncaptured_hidden[size]

    def _forward(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.buffers.unpack_decode(size)  # the block tables (every input id is the host's)
        batch = self.buffers.verify_view(size, self.rows_per_seq, self._capture_rows(size), self.verify_states)
        batch.gdn_stash, batch.store_state = self.stash, False
        hidden = self.model(batch.input_ids, batch)
        return self.model.compute_logits(hidden), hidden

    def _capture_rows(self, size: int) -> CaptureRows | None:
        """Sequence b's row j (j < k) into verify slot b * k + j, padding sequences too (their slots are free
        scratch for the step): one device table a rung, made once (on a CPU, where nothing is captured, the
        pairs as the reference kernels read them)."""
        if self.verify_states is None:
            return None
        if size not in self._captures:
            k, per, first = self.num_speculative_tokens, self.rows_per_seq, self.verify_states.first_verify_slot
            pairs = [(b * per + j, first + b * k + j) for b in range(size) for j in range(k)]
            device = self.buffers.meta.device
            self._captures[size] = GraphCaptureRows.of(pairs, device) if device.type == "cuda" else CaptureRows(pairs)
        return self._captures[size]


def pad_rows(host: HostBatch, per: int) -> HostBatch:
    """The step's sequences (each its last token and up to per - 1 drafts) at `per` rows each: a sequence's rows
    past its own repeat its last row's token and position and write no KV (slot -1), and its length counts them,
    so that its own rows attend as they would unpadded."""
    n = len(host.seq_lens)
    if host.query_start_loc[-1] == n * per:
        return host
    starts = np.asarray(host.query_start_loc, dtype=np.int64)
    lengths = np.diff(starts)
    column = np.arange(per)
    source = starts[:-1, None] + np.minimum(column[None, :], lengths[:, None] - 1)  # [n, per] rows of `host`
    own = column[None, :] < lengths[:, None]
    input_ids, positions, slots = (np.asarray(v, dtype=np.int64) for v in
                                   (host.input_ids, host.positions, host.slot_mapping))
    return HostBatch(input_ids[source].ravel(), positions[source].ravel(), list(range(0, n * per + 1, per)),
                     (np.asarray(host.seq_lens) - lengths + per).tolist(), host.block_tables,
                     np.where(own, slots[source], -1).ravel(), host.state_slots, list(range(n * per)))
