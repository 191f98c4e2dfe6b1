"""Sparse mixture of experts with an optional sigmoid-gated shared expert (Qwen3-Next / Qwen3.5-MoE)."""

import torch
from torch import nn
from torch.nn import functional as F

from deltaserve import kernels
from deltaserve.models.config import ModelConfig
from deltaserve.models.layers.mlp import GatedMLP
from deltaserve.models.layers.params import empty_param


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device):
        super().__init__()
        hidden, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.router = empty_param(experts, hidden, dtype=dtype, device=device)
        # All experts stacked: w13[e] = [gate rows; up rows], w2[e] = down.
        self.w13 = empty_param(experts, 2 * inter, hidden, dtype=dtype, device=device)
        self.w2 = empty_param(experts, hidden, inter, dtype=dtype, device=device)
        self.shared_expert = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(hidden, config.shared_expert_intermediate_size, dtype, device)
            self.shared_expert_gate = empty_param(1, hidden, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = kernels.moe_route(F.linear(x, self.router), self.top_k, self.renormalize)
        out = kernels.moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(F.linear(x, self.shared_expert_gate)) * self.shared_expert(x)
        return out
