"""The one place that decides which implementation of an op runs.

Triton kernels run on CUDA tensors when Triton imports; the torch reference runs everywhere else, and
everywhere when DELTASERVE_KERNELS=reference (used to compare the two on the GPU).
"""

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    if os.environ.get("DELTASERVE_KERNELS", "") == "reference":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(tensor: torch.Tensor) -> bool:
    """tensor: anything with is_cuda (a tensor, or kernels.PartialSums)."""
    return tensor.is_cuda and triton_available()
