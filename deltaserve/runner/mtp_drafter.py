"""MtpDrafter: the model's multi-token-prediction (MTP) head after each step of the target model.

The MTP head at position p reads the target's final hidden state at p and the token at p + 1, and predicts the
token at p + 2; its one attention layer keeps KV of its own (the KV pool's layer `config.mtp_layer_idx`). So after every
step it runs over every row the step kept (a prompt's chunk, a decode row, a verify chunk's accepted rows), with
the tokens shifted by one: the last row's next token is the one the step sampled (or, for a chunk that samples
nothing, the prompt's next). Its output at a sequence's last row gives the first draft, greedily; each further
draft runs the head one position on, from its own output there and the draft before (vLLM's MTP proposer). Those
later passes write the head's KV past the sequence's end, into the slots the scheduler holds for them
(Scheduler.lookahead); the next step's rows write over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deltaserve.engine.step_plan import ScheduledChunk
from deltaserve.host_to_device import to_device
from deltaserve.runner.batch_builder import HostBatch, kv_slots


@dataclass
class DraftRequest:
    """One chunk as the MTP head reads it: its kept rows [start, end) of the step's rows from `first_row` (None
    where the step kept no hidden states: prompt lookup reads none), and the token after its last one
    (`next_token`); `drafts` whether its sequence drafts."""

    chunk: ScheduledChunk
    first_row: int | None
    next_token: int
    drafts: bool


class MtpDrafter:
    reads_hidden = True  # the target's final hidden state of every row a step keeps

    def __init__(self, model, num_speculative_tokens: int, block_size: int, to_forward_batch):
        self.model = model
        self.num_speculative_tokens = num_speculative_tokens
        self.block_size = block_size
        self._to_forward_batch = to_forward_batch  # ModelRunner.to_forward_batch
        self.graphs = None  # MtpGraphs: the drafting after a graph-replayed verify step

    def propose(self, hidden: torch.Tensor, rows: list[DraftRequest], verify_rung: int | None = None) -> dict:
        """Runs the head over the chunks' kept rows (hidden: the target's final hidden states of the step's rows)
        and returns {request: drafts} for those that draft. verify_rung: the step replayed that verify graph, whose
        drafting graph then runs (mtp_graphs.py)."""
        if verify_rung is not None and self.graphs is not None:
            return self._propose_by_graph(verify_rung, rows)
        rows = [r for r in rows if r.chunk.num_tokens]
        if not rows:
            return {}
        host, gather = self._first_pass(rows)
        index = to_device(gather, hidden.device)
        batch = self._to_forward_batch(host, False)
        out = self.model.forward_mtp(batch.input_ids, hidden.index_select(0, index), batch)
        wanted = {id(r): self._useful_drafts(r) for r in rows}
        drafting = [r for r in rows if wanted[id(r)]]
        if not drafting:
            return {}
        ends = [host.query_start_loc[rows.index(r) + 1] - 1 for r in drafting]
        last = out.index_select(0, to_device(ends, out.device))
        drafts = [[t] for t in self._greedy(last).tolist()]
        going = list(range(len(drafting)))  # the sequences still drafting; `last` holds their rows
        for step in range(1, self.num_speculative_tokens):
            kept = [j for j, i in enumerate(going) if wanted[id(drafting[i])] > step]
            if not kept:
                break
            if len(kept) < len(going):
                going = [going[j] for j in kept]
                last = last.index_select(0, to_device(kept, last.device))
            rows_now = [drafting[i] for i in going]
            positions = [r.chunk.end + step - 1 for r in rows_now]
            batch = self._to_forward_batch(self._next_pass(rows_now, positions, [drafts[i][-1] for i in going]), False)
            last = self.model.forward_mtp(batch.input_ids, last, batch)
            for i, token in zip(going, self._greedy(last).tolist()):
                drafts[i].append(token)
        return {r.chunk.request: d for r, d in zip(drafting, drafts)}

    def _propose_by_graph(self, rung: int, rows: list[DraftRequest]) -> dict:
        """After a verify graph: every row's next token (a kept draft, else the step's token), each sequence's last
        kept row and the drafts it takes, then one replay."""
        per = self.num_speculative_tokens + 1
        next_tokens, last_rows, limits = [], [], []
        for b, row in enumerate(rows):
            kept = row.chunk.draft_token_ids
            next_tokens += kept + [row.next_token] * (per - len(kept))
            last_rows.append(b * per + len(kept))
            limits.append(self._useful_drafts(row))
        drafts = self.graphs.run(rung, next_tokens, last_rows, limits)
        return {r.chunk.request: d[:limit] for r, d, limit in zip(rows, drafts, limits) if limit}

    def _useful_drafts(self, row: DraftRequest) -> int:
        return useful_drafts(row, self.num_speculative_tokens)

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)[:, : self.model.config.vocab_size].argmax(-1)

    def _first_pass(self, rows: list[DraftRequest]) -> tuple[HostBatch, list[int]]:
        """The head's batch over the chunks' kept rows, and where each of its rows is among the step's rows."""
        host = HostBatch([], [], [0], [], [], [], [], [])
        gather = []
        for r in rows:
            chunk, request = r.chunk, r.chunk.request
            start, end = chunk.start, chunk.end
            following = [_token_after(chunk, p) for p in range(start, end - 1)] + [r.next_token]
            host.input_ids += following
            host.positions += range(start, end)
            host.slot_mapping += kv_slots(request.block_ids, start, end, self.block_size).tolist()
            host.query_start_loc.append(host.query_start_loc[-1] + end - start)
            host.seq_lens.append(end)
            host.block_tables.append(request.block_ids)
            host.state_slots.append(0)
            gather += range(r.first_row, r.first_row + end - start)
        host.logits_indices = [q - 1 for q in host.query_start_loc[1:]]
        return host, gather

    def _next_pass(self, rows: list[DraftRequest], positions: list[int], tokens: list[int]) -> HostBatch:
        """One row a sequence: the draft before, at the position after the last."""
        blocks = [r.chunk.request.block_ids for r in rows]
        slots = [b[p // self.block_size] * self.block_size + p % self.block_size for b, p in zip(blocks, positions)]
        return HostBatch(list(tokens), list(positions), list(range(len(rows) + 1)), [p + 1 for p in positions],
                         blocks, slots, [0] * len(rows), list(range(len(rows))))


def useful_drafts(row: DraftRequest, k: int) -> int:
    """How many drafts the sequence's next step could verify: none where it does not draft, else up to k, as many
    as its max_tokens leaves after this step's token and the one the next step adds (no draft pass then reaches
    past the positions its request may fill)."""
    if not row.drafts:
        return 0
    request = row.chunk.request
    outputs_after = row.chunk.end + 1 - request.num_prompt_tokens
    return max(0, min(k, request.max_tokens - outputs_after - 1))


def _token_after(chunk: ScheduledChunk, position: int) -> int:
    """The token at position + 1 inside the chunk's kept rows: a verified draft, or the request's own."""
    offset = position + 1 - chunk.start
    if chunk.draft_token_ids:
        return chunk.draft_token_ids[offset - 1]
    return chunk.request.token_at(position + 1)
