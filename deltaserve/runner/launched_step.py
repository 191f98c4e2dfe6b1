"""LaunchedStep: a step whose sampled tokens are still on their way to the host.

The tokens are copied into pinned host memory behind an event recorded right after the step's own
work, so waiting for them does not wait for whatever was queued on the GPU later (the next step)."""

from __future__ import annotations

import torch

from deltaserve.engine.step_plan import StepPlan


class LaunchedStep:
    def __init__(self, plan: StepPlan, tokens: torch.Tensor):
        self.plan = plan  # a decode plan: every chunk samples, row i is chunk i
        # [rows] int64 on the device: the next eager step's input ids come from here (a decode graph's
        # from the same tokens in StepBuffers.sampled_tokens; for a greedy graph step, this is that buffer)
        self.tokens = tokens
        self.rows = {chunk.request: row for row, chunk in enumerate(plan.chunks)}
        on_gpu = tokens.is_cuda
        self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=on_gpu)
        self._host.copy_(tokens, non_blocking=on_gpu)
        self._ready = None
        if on_gpu:
            self._ready = torch.cuda.Event()
            self._ready.record()

    def token_ids(self) -> list[int]:
        """Waits for this step's tokens (only for them) and returns them, one per chunk."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()
