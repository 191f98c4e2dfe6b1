"""Gated DeltaNet token mixer (Qwen3-Next / Qwen3.5): a recurrent linear attention whose state per
sequence lives in a StatePool slot.

One fused input projection yields [q | k | v | z | b | a]; q, k, v pass through a causal depthwise
conv (state: the last kernel-1 inputs) and SiLU; the gated delta rule mixes them with the recurrent
state; a gated RMSNorm with z and the output projection follow.
"""

import torch
from torch import nn

from deltaserve import kernels
from deltaserve.models.config import ModelConfig
from deltaserve.models.layers.params import empty_param


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype, device):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_size = self.num_k_heads * self.k_dim
        self.value_size = self.num_v_heads * self.v_dim
        self.conv_dim = config.gdn_conv_dim
        rows = self.conv_dim + self.value_size + 2 * self.num_v_heads
        self.in_proj = empty_param(rows, config.hidden_size, dtype=dtype, device=device)
        self.conv_weight = empty_param(self.conv_dim, config.linear_conv_kernel_dim, dtype=dtype, device=device)
        self.A_log = empty_param(self.num_v_heads, dtype=torch.float32, device=device)
        self.dt_bias = empty_param(self.num_v_heads, dtype=torch.float32, device=device)
        self.norm_weight = empty_param(self.v_dim, dtype=dtype, device=device)
        self.out_proj = empty_param(config.hidden_size, self.value_size, dtype=dtype, device=device)
        self.norm_eps = config.rms_norm_eps

    def forward(self, x: torch.Tensor, batch, output_rows=None) -> torch.Tensor | kernels.PartialSums:
        """The output feeds the residual add-norm only, so it may be PartialSums. output_rows: the rows
        to return (None: all); every row still updates the state."""
        tokens = x.shape[0]
        projected = kernels.linear(x, self.in_proj)
        mixed, z, b, a = projected.split([self.conv_dim, self.value_size, self.num_v_heads, self.num_v_heads], -1)
        norm = kernels.GatedNorm(z.reshape(tokens, self.num_v_heads, self.v_dim), self.norm_weight, self.norm_eps)
        conv_state, h_state = batch.gdn_state(self.layer_idx)
        # Decode keeps three launches (conv update, delta rule, gated norm): kernels.gdn_decode_fused does
        # them in one, but its one program per key head measured slower from batch 16 up on the H200.
        conv_snap, h_snap = batch.gdn_snapshots(self.layer_idx)
        mixed = kernels.causal_conv1d(
            mixed, self.conv_weight, conv_state, batch.state_slots, batch.query_start_loc,
            batch.conv_captures, conv_snap,
        )
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], -1)
        q = q.reshape(tokens, self.num_k_heads, self.k_dim)
        k = k.reshape(tokens, self.num_k_heads, self.k_dim)
        v = v.reshape(tokens, self.num_v_heads, self.v_dim)
        # A prefill pass hands the norm to the rule (its long passes' output kernel may apply it), unless only some
        # rows go on: those are selected first and normed alone, as a decode step's are after its rule.
        normed_by_rule = not batch.is_decode and output_rows is None
        if batch.is_decode:
            out = kernels.recurrent_gated_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, h_state, batch.state_slots
            )
        else:
            if batch.gdn_stash is not None:  # a verify step: its verify chunks' states advance after the verdicts
                ba = projected[:, self.conv_dim + self.value_size :]
                batch.gdn_stash.keep(self.layer_idx, mixed[:, self.key_size :], ba, batch.stash_rows)
            out = kernels.chunk_gated_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, h_state, batch.state_slots, batch.query_start_loc,
                batch.capture_rows, h_snap, longest_chunk=batch.max_query_len, store_state=batch.store_state,
                output_norm=norm if normed_by_rule else None,
            )
        if output_rows is not None:
            if output_rows.count == 0:
                return x.new_empty((0, self.out_proj.shape[0]))
            out, tokens = output_rows.select(out), output_rows.count
            norm = norm._replace(gate=output_rows.select(norm.gate))
        if not normed_by_rule:
            out = kernels.gated_rms_norm(out, *norm)
        return kernels.linear_to_residual(out.reshape(tokens, self.value_size), self.out_proj)
