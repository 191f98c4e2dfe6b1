"""Sparse mixture of experts with an optional sigmoid-gated shared expert (Qwen3-Next / Qwen3.5-MoE)."""

import torch
from torch import nn
from torch.nn import functional as F

from deltaserve import kernels
from deltaserve.models.config import ModelConfig
from deltaserve.models.layers.params import empty_param


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device):
        super().__init__()
        hidden, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.num_experts = experts
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.shared_size = config.shared_expert_intermediate_size
        # The router, the shared expert's sigmoid gate and its gate/up projections all read the same
        # input, so one GEMM computes them: rows [router (E) | shared gate (1) | shared gate, up (2 Is)].
        rows = experts + (1 + 2 * self.shared_size if self.shared_size else 0)
        self.in_proj = empty_param(rows, hidden, dtype=dtype, device=device)
        # All experts stacked: w13[e] = [gate rows; up rows], w2[e] = down.
        self.w13 = empty_param(experts, 2 * inter, hidden, dtype=dtype, device=device)
        self.w2 = empty_param(experts, hidden, inter, dtype=dtype, device=device)
        self.shared_down = empty_param(hidden, self.shared_size, dtype=dtype, device=device) if self.shared_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = F.linear(x, self.in_proj)
        experts = self.num_experts
        weights, ids = kernels.moe_route(projected[:, :experts], self.top_k, self.renormalize)
        out = kernels.moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_down is None:
            return out
        gate, gate_up = projected[:, experts : experts + 1], projected[:, experts + 1 :]
        shared = F.linear(kernels.silu_and_mul(gate_up), self.shared_down)
        return torch.addcmul(out, torch.sigmoid(gate), shared)
