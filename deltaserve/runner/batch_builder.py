"""Turns a StepPlan into the host-side columns of a flat ragged batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deltaserve.engine.request import Request
from deltaserve.engine.step_plan import StepPlan


@dataclass
class HostBatch:
    # Per row: lists while every chunk is one decode row, else int64 arrays (see RowColumn).
    input_ids: list[int] | np.ndarray
    positions: list[int] | np.ndarray
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int] | np.ndarray
    state_slots: list[int]
    logits_indices: list[int]
    logits_sequences: list[int] = field(default_factory=list)  # the sequence of each logits row


class RowColumn:
    """One per-row column of a batch. Decode rows come one value at a time and stay in a list (a decode
    step's few rows are cheapest so); a longer chunk comes as one numpy run. Built value by value in
    Python, one 32768-token prompt's three columns took about 2 ms of the host before its pass could
    start, and as long again to turn into arrays for the device."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []
        self._values: list[int] = []  # the rows since the last run

    def append(self, value: int) -> None:
        self._values.append(value)

    def extend(self, run: np.ndarray) -> None:
        self._flush()
        self._runs.append(run)

    def values(self) -> list[int] | np.ndarray:
        """The list of values while no run came, else one int64 array of them all."""
        if not self._runs:
            return self._values
        self._flush()
        return self._runs[0] if len(self._runs) == 1 else np.concatenate(self._runs)

    def _flush(self) -> None:
        if self._values:
            self._runs.append(np.array(self._values, dtype=np.int64))
            self._values = []


def build_host_batch(plan: StepPlan, block_size: int) -> HostBatch:
    batch = HostBatch([], [], [0], [], [], [], [], [])
    input_ids, positions, slot_mapping = RowColumn(), RowColumn(), RowColumn()
    rows = 0
    for chunk in plan.chunks:
        request, start, end = chunk.request, chunk.start, chunk.end
        blocks = request.block_ids
        if end - start == 1:  # a decode row: the common case, kept free of numpy's per-call cost
            input_ids.append(request.token_at(start))
            positions.append(start)
            slot_mapping.append(blocks[start // block_size] * block_size + start % block_size)
        else:
            if chunk.draft_token_ids:  # a verify chunk: the last token, then the drafts after it
                input_ids.extend(np.array([request.token_at(start), *chunk.draft_token_ids], dtype=np.int64))
            else:
                input_ids.extend(_token_ids(request, start, end))
            positions.extend(np.arange(start, end, dtype=np.int64))
            slot_mapping.extend(kv_slots(blocks, start, end, block_size))
        rows += end - start
        batch.query_start_loc.append(rows)
        batch.seq_lens.append(end)
        batch.block_tables.append(blocks)
        batch.state_slots.append(request.state_slot if request.state_slot is not None else 0)
        if chunk.samples:
            sampled = range(rows - 1 - len(chunk.draft_token_ids), rows)  # every row of a verify chunk samples
            batch.logits_indices += sampled
            batch.logits_sequences += [len(batch.seq_lens) - 1] * len(sampled)
    batch.input_ids, batch.positions, batch.slot_mapping = input_ids.values(), positions.values(), slot_mapping.values()
    return batch


def _token_ids(request: Request, start: int, end: int) -> np.ndarray:
    """Token ids [start, end) as int64: a view of the prompt's bytes where the chunk lies in them."""
    if request.prompt_bytes and end <= request.num_prompt_tokens:
        return np.frombuffer(request.prompt_bytes, dtype=np.int64, count=end - start, offset=start * 8)
    return np.array(request.token_ids_slice(start, end), dtype=np.int64)


def kv_slots(blocks: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """The KV slots of positions start..end-1 (end > start): every slot of the blocks they cross, cut to them."""
    first = start // block_size
    table = np.array(blocks[first : (end - 1) // block_size + 1], dtype=np.int64)
    slots = (table[:, None] * block_size + np.arange(block_size, dtype=np.int64)).ravel()
    offset = start - first * block_size
    return slots[offset : offset + end - start]


# An eager pass's block tables are as wide as a multiple of this: Triton compiles the attention kernels apart for
# a row stride that is 1, a multiple of 16 or neither, and the last layer's rows (OutputRows) met widths
# the start-up warm-up had not (on the H200 one kernel compiled while serving 128 requests of 128 tokens).
BLOCK_TABLE_WIDTH_MULTIPLE = 16


def pad_block_tables(tables: list[list[int]], width: int | None = None) -> list[list[int]]:
    """The tables as rows of one width: `width`, else the longest rounded up to BLOCK_TABLE_WIDTH_MULTIPLE."""
    if width is None:
        longest = max((len(t) for t in tables), default=1) or 1
        width = -(-longest // BLOCK_TABLE_WIDTH_MULTIPLE) * BLOCK_TABLE_WIDTH_MULTIPLE
    return [t + [0] * (width - len(t)) for t in tables]
