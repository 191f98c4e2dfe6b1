"""The MTP head's drafting after a graph-replayed verify step, as one CUDA graph a rung (runner/verify_graphs.py).

After such a step every sequence has k + 1 rows, of which it kept the first a + 1. The head runs over all k + 1
(the layout the verify graph's buffers hold, each row's input the token after it: the kept drafts, then the step's
token, which also fills the rows past the kept ones), so its KV at the positions past the kept rows is written
over, as the next step's rows would write it; then each sequence's last kept row gives the first draft, and k - 1
passes of one row a sequence give the others, each at the position after the one before, its KV slot read off
the block table on the device (none where the sequence takes fewer drafts: a draft past its max_tokens would reach
positions it does not hold). So the head's work after a verify step is one replay and one read of the drafts.

Its inputs besides the verify step's buffers, written before each replay: each row's next token, each sequence's
last kept row and how many drafts it takes. Without a captured graph (a CPU) the same passes run eagerly.
"""

from __future__ import annotations

import logging
import time

import torch

from deltaserve.host_to_device import to_device
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
        device = buffers.meta.device
        max_batch = buffers.max_batch
        self.next_tokens = torch.zeros(buffers.max_rows, dtype=torch.int64, device=device)
        self.last_rows = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.draft_limits = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.drafts: dict[int, torch.Tensor] = {}

    def capture(self, pool) -> None:
        started = time.perf_counter()
        for size in reversed(self.verify_graphs.sizes):
            self.graphs[size], self.drafts[size] = capture_graph(lambda: self._forward(size), pool)
        log.info("captured %d MTP drafting graphs in %.1f s", len(self.graphs), time.perf_counter() - started)

    def run(self, size: int, next_tokens: list[int], last_rows: list[int], draft_limits: list[int]) -> list[list[int]]:
        """The drafts [n][k] of the n sequences of the verify step just replayed at rung `size`: next_tokens holds
        its n * (k + 1) rows' next tokens, last_rows each sequence's last kept row, draft_limits the drafts each
        takes (the columns past its limit are not its drafts)."""
        n, rows = len(last_rows), len(next_tokens)
        padded_rows = list(range(n * self.rows_per_seq, size * self.rows_per_seq, self.rows_per_seq))
        inputs = to_device([*next_tokens, *([0] * (size * self.rows_per_seq - rows)), *last_rows, *padded_rows,
                            *draft_limits, *([0] * (size - n))], self.next_tokens.device)
        per = size * self.rows_per_seq
        self.next_tokens[:per].copy_(inputs[:per])
        self.last_rows[:size].copy_(inputs[per : per + size])
        self.draft_limits[:size].copy_(inputs[per + size :])
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
        out = self.model.forward_mtp(self.next_tokens[: size * per], hidden, batch)
        last_rows = self.last_rows[:size]
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
        writes = self.draft_limits[:size] > step
        positions = positions.clamp(max=self.max_position)
        blocks = verify.block_tables.gather(1, (positions // self.block_size).clamp(
            max=verify.block_tables.shape[1] - 1)[:, None])[:, 0]
        slots = torch.where(writes, blocks * self.block_size + positions % self.block_size, -1)
        return ForwardBatch(
            input_ids=tokens, positions=positions, query_start_loc=self.buffers.row_starts[: size + 1],
            seq_lens=positions + 1, block_tables=verify.block_tables, slot_mapping=slots,
            state_slots=verify.state_slots, logits_indices=None, is_decode=True, kv_pool=verify.kv_pool,
            state_pool=verify.state_pool)
