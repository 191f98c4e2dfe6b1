"""Parameter creation: uninitialised tensors on the target device, filled by the weight loader."""

import torch
from torch import nn


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)
