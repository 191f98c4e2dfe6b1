"""What a StepPlan's snapshot restores and captures mean for the batch: which state slots to fill
from snapshots before the forward, which rows the GDN kernels save mid-chunk, and which state slots
to copy out after it (captures at a chunk's end, decode ones included)."""

from __future__ import annotations

from deltaserve.engine.step_plan import StepPlan


def restore_pairs(plan: StepPlan) -> list[tuple[int, int]]:
    """(snapshot slot, state slot) for every sequence that restarts from a snapshot this step."""
    return [(r.snapshot_slot, r.request.state_slot) for r in plan.restores]


def mid_chunk_capture_rows(plan: StepPlan) -> list[tuple[int, int]]:
    """(global row, snapshot slot): the state after that row of the flat batch is saved by the kernels."""
    first_row, row = {}, 0
    for chunk in plan.chunks:
        first_row[id(chunk)] = row
        row += chunk.num_tokens
    return [(first_row[id(c.chunk)] + c.position - c.chunk.start - 1, c.snapshot_slot)
            for c in plan.captures if not c.at_chunk_end]


def chunk_end_saves(plan: StepPlan) -> list[tuple[int, int]]:
    """(state slot, snapshot slot): the sequence's state after the step is the snapshot."""
    return [(c.chunk.request.state_slot, c.snapshot_slot) for c in plan.captures if c.at_chunk_end]
