"""Host lists to device tensors without stalling the host."""

from __future__ import annotations

import functools

import numpy as np
import torch


def to_device(values, device: torch.device, dtype=torch.int64) -> torch.Tensor:
    """A host list as a device tensor. On CUDA it travels from pinned memory without blocking: a copy
    from pageable memory would first wait for all the GPU work queued before it, which would undo
    asynchronous scheduling (and hold the host back mid-step)."""
    return _upload(host_tensor(values, dtype, pin=device.type == "cuda"), device)


def columns_to_device(columns: list, device: torch.device) -> list[torch.Tensor]:
    """Host columns of ints (lists or arrays, 1-D or 2-D) as int64 device tensors of their shapes, through one
    copy: on the H200 a long eager pass made eight copies before its first kernel, 60-130 us of the host
    apart in a profiled 8192-token pass, while the GPU waited."""
    arrays = [np.asarray(column, dtype=np.int64) for column in columns]
    # Each column starts 16 bytes in: Triton compiles a kernel apart for a pointer that is not (as the JIT
    # sees a tensor of its own, which the allocator aligns).
    spans = [a.size + a.size % 2 for a in arrays]
    staging = torch.empty(sum(spans), dtype=torch.int64, pin_memory=device.type == "cuda")
    starts = np.cumsum([0] + spans[:-1])
    flat = staging.numpy()
    for a, at in zip(arrays, starts):
        flat[at : at + a.size] = a.ravel()
    packed = _upload(staging, device)
    return [packed[at : at + a.size].view(a.shape) for a, at in zip(arrays, starts)]


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """host on `device`: without blocking from pinned memory on CUDA, else as it is."""
    return host.to(device, non_blocking=True) if device.type == "cuda" else host.to(device)


def host_tensor(values, dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
    """A (nested) list as a host tensor, through numpy: torch.tensor walks a list of Python ints about
    four times slower, some 1.6 ms for each 16384-row list of a long eager pass."""
    if not pin:  # a copy: the tensor must not share (or be refused) a read-only view such as a prompt's bytes
        return torch.from_numpy(np.array(values, dtype=_numpy_dtype(dtype)))
    array = np.asarray(values, dtype=_numpy_dtype(dtype))  # an array of the dtype already: copied once, below
    tensor = torch.empty(array.shape, dtype=dtype, pin_memory=True)
    tensor.numpy()[...] = array
    return tensor


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """Read once per dtype: every step converts its lists through here."""
    return torch.empty(0, dtype=dtype).numpy().dtype
