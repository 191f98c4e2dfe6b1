"""The MTP head's drafting after a graph-replayed verify step, as one CUDA graph a rung (runner/verify_graphs.py).

After such a step every sequence has k + 1 rows, of which it kept the first a + 1. The head runs over all k + 1
(the layout the verify graph's buffers hold, each row's input the token after it: the kept drafts, then the step's
token, which also fills the rows past the kept ones), so its KV at the positions past the kept rows is written
over, as the next step's rows would write it; then each sequence's last kept row gives the first draft, and k - 1
passes of one row a sequence give the others, each at the position after the one before, its KV slot read off
the block table on the device (none where the sequence takes fewer drafts: a draft past its max_tokens would reach
positions it does not hold). So the head's work after a verify step is one replay and one read of the drafts.

Its inputs beside the verify step's are in the step buffers too (StepBuffers.load_drafting): each row's next token,
each sequence's last kept row and how many drafts it takes. Without a captured graph (a CPU) the same passes run
eagerly.
"""

from __future__ import annotations

import logging
import time

import torch

from deltaserve.runner.cuda_graphs import capture_graph
from deltaserve.runner.forward_batch import ForwardBatch
from deltaserve.runner.step_buffers import StepBuffers

log = logging.getLogger(__name__)


class MtpGraphs:
    def __init__(self, model, buffers: StepBuffers, verify_graphs, num_speculative_tokens: int, block_size: int):
        self.model = model
        self.buffers = buffers
        self.verify_graphs = verify_graphs  # its hidden states of a rung are this graph's input
        self.k = num_speculative_tokens
        self.rows_per_seq = num_speculative_tokens + 1
        self.block_size = block_size
        self.max_position = model.cos_sin_cache.shape[0] - 1
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.drafts: dict[int, torch.Tensor] = {}

    def capture(self, pool) -> None:
        started, before = time.perf_counter(), torch.cuda.memory_allocated()
        for size in reversed(self.verify_graphs.sizes):
            self.graphs[size], self.drafts[size] = capture_graph(lambda: self._forward(size), pool)
        log.info("captured %d MTP drafting graphs in %.1f s using %.0f MiB", len(self.graphs),
                 time.perf_counter() - started, (torch.cuda.memory_allocated() - before) / 2**20)

    def run(self, size: int, next_tokens: list[int], last_rows: list[int], draft_limits: list[int]) -> list[list[int]]:
        """The drafts [n][k] of the n sequences of the verify step just replayed at rung `size`: next_tokens holds
        its n * (k + 1) rows' next tokens, last_rows each sequence's last kept row, draft_limits the drafts each
        takes (the columns past its limit are not its drafts)."""
        n = len(last_rows)
        self.buffers.load_drafting(size, self.rows_per_seq, next_tokens, last_rows, draft_limits)
        if size in self.graphs:
            self.graphs[size].replay()
            drafts = self.drafts[size]
        else:
            drafts = self._forward(size)
        return drafts[:n].tolist()

    def _forward(self, size: int) -> torch.Tensor:
        buffers, per = self.buffers, self.rows_per_seq
        hidden = self.verify_graphs.hidden_of(size)
        batch = buffers.verify_view(size, per)  # the verify step's positions, KV slots and tables
        out = self.model.forward_mtp(buffers.next_tokens[: size * per], hidden, batch)
        last_rows = buffers.last_rows[:size]
        last = out.index_select(0, last_rows)
        tokens = self._greedy(last)
        drafts = [tokens]
        positions = batch.positions.index_select(0, last_rows)
        for step in range(1, self.k):
            step_batch = self._next_pass(batch, tokens, positions + step, step)
            last = self.model.forward_mtp(tokens, last, step_batch)
            tokens = self._greedy(last)
            drafts.append(tokens)
        return torch.stack(drafts, dim=1)

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)[:, : self.model.config.vocab_size].argmax(-1)

    def _next_pass(self, verify: ForwardBatch, tokens: torch.Tensor, positions: torch.Tensor,
                   step: int) -> ForwardBatch:
        """One row a sequence (its last draft, `tokens`) at `positions`, its KV slot from the block table (-1, none,
        where the sequence takes fewer than step + 1 drafts); positions past the rotary table's are clamped (their
        rows write nothing)."""
        size = positions.shape[0]
        writes = self.buffers.draft_limits[:size] > step
        positions = positions.clamp(max=self.max_position)
        blocks = verify.block_tables.gather(1, (positions // self.block_size).clamp(
            max=verify.block_tables.shape[1] - 1)[:, None])[:, 0]
        slots = torch.where(writes, blocks * self.block_size + positions % self.block_size, -1)
        return ForwardBatch(
            input_ids=tokens, positions=positions, query_start_loc=self.buffers.row_starts[: size + 1],
            seq_lens=positions + 1, block_tables=verify.block_tables, slot_mapping=slots,
            state_slots=verify.state_slots, logits_indices=None, is_decode=True, kv_pool=verify.kv_pool,
            state_pool=verify.state_pool)
