"""Host lists to device tensors without stalling the host."""

from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype=torch.int64) -> torch.Tensor:
    """A host list as a device tensor. On CUDA it travels from pinned memory without blocking: a copy
    from pageable memory would first wait for all the GPU work queued before it, which would undo
    asynchronous scheduling (and hold the host back mid-step)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
