"""Sparse mixture of experts with an optional sigmoid-gated shared expert (Qwen3-Next / Qwen3.5-MoE).

When the shared expert has the routed experts' size (the real Qwen3-Next and Qwen3.5-MoE checkpoints)
it is stacked as expert E and routed to every token with weight sigmoid(gate): the experts kernels
run it with the routed ones, and a decode step spends no launches on it. Otherwise it runs on its own.
"""

from typing import NamedTuple

import torch
from torch import nn

from deltaserve import kernels
from deltaserve.kernels.partial_sums import first_columns
from deltaserve.models.config import ModelConfig
from deltaserve.models.layers.params import empty_param

# The input GEMM's rows are padded to a multiple of this, so its output rows start 16-byte aligned
# (8 bf16): an unaligned row stride sends cuBLAS to a slow align1 kernel (19 ms of an 8k-token prefill
# of Qwen3.5-35B-A3B with 1281 rows).
ROW_ALIGN = 8


class InputRows(NamedTuple):
    """Where each part sits among the rows of `SparseMoE.in_proj` (None: the layer has no such part)."""
    router: slice
    shared_gate: slice | None  # one row: the shared expert's sigmoid gate
    shared_gate_up: slice | None  # the separate shared expert's gate rows, then up rows
    padding: slice
    total: int


def input_rows(experts: int, shared_size: int, fused: bool) -> InputRows:
    """Fused: [router (E) | shared gate (1) | padding]. Separate: [router (E) | shared gate, up (2 Is) |
    shared gate (1) | padding]: the wide slices start where the GEMM's output starts, aligned."""
    gate_up = None if fused or not shared_size else slice(experts, experts + 2 * shared_size)
    used = gate_up.stop if gate_up else experts
    gate = slice(used, used + 1) if shared_size else None
    used = gate.stop if gate else used
    total = -(-used // ROW_ALIGN) * ROW_ALIGN
    return InputRows(slice(0, experts), gate, gate_up, slice(used, total), total)


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device):
        super().__init__()
        hidden, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
        self.num_experts = experts
        self.top_k = config.num_experts_per_tok
        self.renormalize = config.norm_topk_prob
        self.shared_size = config.shared_expert_intermediate_size
        self.fused_shared = bool(self.shared_size) and self.shared_size == inter
        # The router, the shared expert's sigmoid gate and (when separate) its gate/up projections all
        # read the same input, so one GEMM computes them.
        self.rows = input_rows(experts, self.shared_size, self.fused_shared)
        self.in_proj = empty_param(self.rows.total, hidden, dtype=dtype, device=device)
        # All experts stacked: w13[e] = [gate rows; up rows], w2[e] = down; the fused shared expert is e = E.
        stacked = experts + 1 if self.fused_shared else experts
        self.w13 = empty_param(stacked, 2 * inter, hidden, dtype=dtype, device=device)
        self.w2 = empty_param(stacked, hidden, inter, dtype=dtype, device=device)
        self.shared_down = (empty_param(hidden, self.shared_size, dtype=dtype, device=device)
                            if self.rows.shared_gate_up else None)

    @torch.no_grad()
    def zero_padding(self) -> None:
        """No checkpoint tensor fills the alignment rows; zero keeps them harmless (no NaN, no cost)."""
        self.in_proj[self.rows.padding].zero_()

    def forward(self, x: torch.Tensor, live_rows: torch.Tensor | None = None) -> torch.Tensor | kernels.PartialSums:
        """live_rows: rows at or after it (a graph's padding) are routed to no expert; their output is 0.
        The output feeds the next residual add-norm only, so it may be PartialSums."""
        rows = self.rows
        if self.fused_shared:  # router logits then the shared gate: one more choice per token, expert E
            projected = kernels.linear_partial(x, self.in_proj)  # the router takes PartialSums
            logits = first_columns(projected, rows.shared_gate.stop)
            weights, ids = kernels.moe_route(logits, self.top_k, self.renormalize, shared_gate=True,
                                             live_rows=live_rows)
            return kernels.moe_experts(x, self.w13, self.w2, weights, ids, partial=True)
        projected = kernels.linear(x, self.in_proj)
        weights, ids = kernels.moe_route(projected[:, rows.router], self.top_k, self.renormalize, live_rows=live_rows)
        out = kernels.moe_experts(x, self.w13, self.w2, weights, ids)
        if self.shared_down is None:
            return out
        shared = kernels.linear(kernels.silu_and_mul(projected[:, rows.shared_gate_up]), self.shared_down)
        return torch.addcmul(out, torch.sigmoid(projected[:, rows.shared_gate]), shared)
