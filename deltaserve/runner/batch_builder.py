"""Turns a StepPlan into the host-side lists of a flat ragged batch."""

from __future__ import annotations

from dataclasses import dataclass

from deltaserve.engine.step_plan import StepPlan


@dataclass
class HostBatch:
    input_ids: list[int]
    positions: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: list[int]
    state_slots: list[int]
    logits_indices: list[int]


def build_host_batch(plan: StepPlan, block_size: int) -> HostBatch:
    batch = HostBatch([], [], [0], [], [], [], [], [])
    rows = 0
    for chunk in plan.chunks:
        request, start, end = chunk.request, chunk.start, chunk.end
        blocks = request.block_ids
        if end - start == 1:  # a decode row: the common case, kept free of per-position loops
            batch.input_ids.append(request.token_at(start))
            batch.positions.append(start)
            batch.slot_mapping.append(blocks[start // block_size] * block_size + start % block_size)
        else:
            batch.input_ids += request.token_ids_slice(start, end)
            batch.positions += range(start, end)
            _extend_slots(batch.slot_mapping, blocks, start, end, block_size)
        rows += end - start
        batch.query_start_loc.append(rows)
        batch.seq_lens.append(end)
        batch.block_tables.append(blocks)
        batch.state_slots.append(request.state_slot if request.state_slot is not None else 0)
        if chunk.samples:
            batch.logits_indices.append(rows - 1)
    return batch


def _extend_slots(slots: list[int], blocks: list[int], start: int, end: int, block_size: int) -> None:
    """The KV slots of positions start..end-1: one range per block they cross, not one Python step per
    position (128 prompts of 128 tokens took about 1.6 ms position by position on the host)."""
    position = start
    while position < end:
        block, offset = divmod(position, block_size)
        run = min(block_size - offset, end - position)
        first = blocks[block] * block_size + offset
        slots += range(first, first + run)
        position += run


def pad_block_tables(tables: list[list[int]], width: int | None = None) -> list[list[int]]:
    width = width or max((len(t) for t in tables), default=1) or 1
    return [t + [0] * (width - len(t)) for t in tables]
