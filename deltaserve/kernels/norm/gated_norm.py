"""The gated RMSNorm that follows an op, handed to the op so that it may apply the norm in its own last store
(the GDN prefill's output kernel holds each head's whole row): `w * x_hat * silu(gate)` per row of x."""

from typing import NamedTuple

import torch


class GatedNorm(NamedTuple):
    gate: torch.Tensor  # [T, H, D], the op's output's shape
    weight: torch.Tensor  # [D]
    eps: float
