"""Prefill passes of one sequence as CUDA graphs, captured once per rung of a ladder of row counts
over StepBuffers.

A prefix-cache hit leaves a few dozen tokens to compute (a follow-up turn's new message), and the
pass that computes them runs every layer once: eagerly, the host's launches (about twenty per layer)
take longer than the GPU's work. Replayed as a graph, the pass costs what its kernels cost. The
pass's n rows are padded to the rung with a second, padding sequence (no KV written, the spare state
slot), and its mid-pass snapshot captures to MAX_GRAPH_CAPTURES entries (the unused ones name rows
past the pass, which the kernels skip). The graph ends at the hidden state of row n - 1, the one row its
last layer computes after attention's keys and values (see OutputRows); the LM head runs after the replay,
and only for a pass that samples: every chunk of a long prompt but its last one samples nothing, and the
head reads its whole weight even for one row (0.44 ms a chunk at the Qwen3.5-9B shape's 248320 x 4096,
skinny_gemm.json). A pass that restores its
sequence's state from a snapshot does so inside the graph, from the slots in the buffers: launched
from the host, that copy cost ~0.16 ms before the pass could start. So does a pass that restores
from a cached tail copy the tail's KV block into its own (0.16 ms from the host too). The same pass
replayed again runs the same graph, so exact replay of a prefix-cache hit holds as it does eagerly.
"""

from __future__ import annotations

import logging
import time

import torch

from deltaserve.models.decoder import DecoderLM
from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.cuda_graphs import capture_graph
from deltaserve.runner.step_buffers import MAX_GRAPH_CAPTURES, StepBuffers

log = logging.getLogger(__name__)

# (last rung, rows between rungs) of each stretch of the ladder: every 16 rows (one KV block at the default
# block size) up to 128, then every 32, 64 and 128, so that a pass past 128 rows pads by less than a quarter.
# Eagerly a one-prompt pass is bound by the host's launches up to some hundreds of rows: a 128-token prompt
# of the Qwen3.5-9B shape took 24-44 ms to its first token, where its kernels take 6.3 ms
# (profile_prefill_qwen3.5-9b_1x128_gaps_a23b328.json), and eager passes of 128 to 1024 rows took 20-53 ms
# whatever their length, the host's time varying with the machine and the process
# (engine_qwen3.5-9b_short_prompts_*at_4e717ea.json, engine_qwen3.5-9b_prompts_to_1000_e8e4685_same_machine.json).
# Past 1024 rows too: the Qwen3.5-35B-A3B shape's eager passes of 1024 and 2048 rows took 56-78 ms on two
# hosts, where its 1000-row graph took 30 (engine_qwen3.5-35b-a3b_prompts_to_2048_at_929dea4.json; its host
# launched 562 kernels a pass, eager_host_qwen3.5-35b-a3b_at_929dea4.json), and an eager first prompt of
# 1024 rows or more builds a cuDNN plan for each new length (54-57 ms a length,
# fresh_attention_new_lengths_at_1c13f5a.json).
# At prompt lengths seen for the first time, 1100 to 2000 tokens, the graphs took 28-50 ms (9B) and 31-43
# (35B-A3B) against 95-388 and 122-173 eagerly (engine_new_prompt_lengths_same_machine.json). A graph's
# attention is paged: where the host was fast and the length seen before, a fresh 2048-row prompt cost it
# 1-4 ms more than cuDNN's (engine_prefill_graphs_to_2048_same_machine.json), in the 64 x 32 tiles that paged
# attention then took; its long-chunk tiles since take such a chunk in cuDNN's time (89.3 against 89.2 us a
# layer, paged_attention_prefill.json). The last rung holds a chunk of the server's default step, 2048 tokens.
LADDER = ((128, 16), (256, 32), (1024, 64), (2048, 128))
# Longer passes run eagerly (a graph per rung costs start-up time and memory: 32 graphs to 2048 rows took
# 6.5 s and 30 MiB at the 9B shape). A first chunk longer than the last rung (FRESH_PREFILL_MIN_TOKENS, the
# model runner's) takes the dense attention of fresh prompts.
MAX_ROWS = LADDER[-1][0]


def prefill_graph_rows(max_num_batched_tokens: int) -> int:
    """The last rung the graphs need under a step budget: the first one with room for a pass of the whole
    budget, at most MAX_ROWS."""
    return next((r for r in prefill_ladder(MAX_ROWS) if r >= max_num_batched_tokens), MAX_ROWS)


def prefill_ladder(max_rows: int) -> list[int]:
    """The rungs of at most max_rows rows."""
    rungs, low = [], 0
    for last, step in LADDER:
        rungs += range(low + step, min(last, max_rows) + 1, step)
        low = last
    return rungs


class PrefillGraphs:
    def __init__(self, model: DecoderLM, buffers: StepBuffers, snapshots=None, max_rows: int | None = None,
                 every_row: bool = False):
        self.model = model
        self.buffers = buffers
        self.snapshots = snapshots  # SnapshotPool: captures on; None: the model or the engine keeps none
        # the buffers' rows by default (a drafting engine's hold its verify steps' rows too)
        self.sizes = prefill_ladder(min(MAX_ROWS, max_rows or buffers.max_prefill_rows))
        # every row's hidden state, not the last row's alone: the MTP head reads them all (its engine's eager
        # passes compute every row in the last layer too)
        self.every_row = every_row
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # per rung: the last row's hidden state [1, H] a replay writes, or every row's [rung, H]: views of one
        # buffer the rungs share (a rung's own output would hold its rows of the graphs' pool for good)
        self.hidden: dict[int, torch.Tensor] = {}
        self._rows: torch.Tensor | None = None

    def capture(self, pool) -> None:
        if not self.sizes:  # buffers of fewer rows than the first rung: every prefill pass runs eagerly
            return
        started, before = time.perf_counter(), torch.cuda.memory_allocated()
        for size in reversed(self.sizes):
            batch = self.capture_batch(size)
            self.graphs[size], self.hidden[size] = capture_graph(lambda: self._forward(batch), pool)
        log.info("captured %d prefill graphs (%d..%d rows) in %.1f s using %.0f MiB", len(self.sizes), self.sizes[0],
                 self.sizes[-1], time.perf_counter() - started, (torch.cuda.memory_allocated() - before) / 2**20)

    def capture_batch(self, size: int):
        """The layout a rung is captured over: a one-row pass (no KV written), the rest padding."""
        self.buffers.load_prefill(HostBatch([0], [0], [0, 1], [1], [[]], [-1], [self.buffers.padding_slot], [0]),
                                  size, [], self._padding_snapshot_slot)
        return self.buffers.prefill_view(size, self.snapshots, every_row=self.every_row)

    @property
    def _padding_snapshot_slot(self) -> int:
        return self.snapshots.padding_slot if self.snapshots is not None else 0

    def _forward(self, batch) -> torch.Tensor:
        if self.snapshots is not None:
            self.snapshots.restore_at(self.buffers.restore, self.buffers.state_pool)
        if self.buffers.kv_pool is not None:
            self.buffers.kv_pool.copy_block_at(self.buffers.kv_copy)
        hidden = self.model(batch.input_ids, batch)  # the hidden state of the last row, or of every row
        if not self.every_row:
            return hidden
        if self._rows is None or self._rows.shape[0] < hidden.shape[0]:  # the largest rung first, uncaptured
            self._rows = torch.empty_like(hidden)
        rows = self._rows[: hidden.shape[0]]
        rows.copy_(hidden)
        return rows

    def rung(self, num_rows: int, captures: list[tuple[int, int]]) -> int | None:
        """The smallest rung with room for the pass (the padding sequence may be empty: a full step's chunk
        of 2048 rows takes rung 2048, where padded to 2176 rows the Qwen3.5-9B pass's GEMMs took 39.1 ms
        against 34.2, profile_prefill_qwen3.5-9b_2048_rows_same_machine.json); None when the pass does not
        fit or its captures do not (too many, or a row captured twice)."""
        if len(captures) > MAX_GRAPH_CAPTURES or len({row for row, _ in captures}) < len(captures):
            return None
        return next((s for s in self.sizes if s >= num_rows), None)

    def run(self, host: HostBatch, captures: list[tuple[int, int]], restore: tuple[int, int] | None = None,
            kv_copy: tuple[int, int] | None = None) -> torch.Tensor:
        """Runs the pass of host's one sequence (see rung), first restoring its state when `restore`
        (snapshot slot, state slot) and copying a KV block when `kv_copy` (source, destination); returns
        the hidden state of its last row [1, H], for the LM head where the pass samples (with `every_row`, those
        of its n rows [n, H]). Without a captured graph (CPU) the same padded batch runs eagerly."""
        n = len(host.input_ids)
        size = self.rung(n, captures)
        pairs = self.buffers.load_prefill(host, size, captures, self._padding_snapshot_slot, restore, kv_copy)
        if size in self.graphs:
            self.graphs[size].replay()
            hidden = self.hidden[size]
        else:
            hidden = self._forward(self.buffers.prefill_view(size, self.snapshots, pairs, self.every_row))
        return hidden[:n] if self.every_row else hidden
