"""Full attention over the paged KV cache: GQA, optional per-head q/k RMSNorm (Qwen3 family), partial
rotary, and the sigmoid output gate that Qwen3-Next / Qwen3.5 emit from q_proj."""

import torch
from torch import nn

from deltaserve import kernels
from deltaserve.models.config import ModelConfig
from deltaserve.models.layers.params import empty_param


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype, device):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.gated = config.attn_output_gate
        self.q_size = self.num_heads * self.head_dim * (2 if self.gated else 1)
        self.kv_size = self.num_kv_heads * self.head_dim
        rows = self.q_size + 2 * self.kv_size
        # q, k and v projections fused into one GEMM; q rows hold [query | gate] per head when gated.
        self.qkv_proj = empty_param(rows, config.hidden_size, dtype=dtype, device=device)
        self.qkv_bias = empty_param(rows, dtype=dtype, device=device) if config.attention_bias else None
        self.o_proj = empty_param(config.hidden_size, self.num_heads * self.head_dim, dtype=dtype, device=device)
        self.o_bias = empty_param(config.hidden_size, dtype=dtype, device=device) if config.attention_bias else None
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = empty_param(self.head_dim, dtype=dtype, device=device)
            self.k_norm = empty_param(self.head_dim, dtype=dtype, device=device)
        self.norm_eps, self.norm_offset = config.rms_norm_eps, config.norm_offset
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, batch, cos_sin_cache: torch.Tensor,
                output_rows=None) -> torch.Tensor | kernels.PartialSums:
        """The output feeds the residual add-norm only, so it may be PartialSums. output_rows: the rows to
        return (None: all); every row's key and value is still stored."""
        if output_rows is not None:
            return self._attend_output_rows(x, batch, cos_sin_cache, output_rows)
        tokens = x.shape[0]
        q, k, v = kernels.linear(x, self.qkv_proj, self.qkv_bias).split([self.q_size, self.kv_size, self.kv_size], -1)
        q, gate = self._query_and_gate(q)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = batch.kv_cache(self.layer_idx)
        if batch.fresh_query_start_loc is not None:  # long fresh prompts: attend within the chunk
            q, k = kernels.rotary_store_kv(q, k, v, batch.positions, cos_sin_cache, k_cache, v_cache,
                                           batch.slot_mapping, self.q_norm, self.k_norm, self.norm_eps,
                                           self.norm_offset, k_out=True)
            out = kernels.causal_attention_fresh(q, k, v, batch.fresh_query_start_loc, self.scale)
            if gate is not None:
                out = kernels.output_gate(out, gate)
        else:
            q = kernels.rotary_store_kv(q, k, v, batch.positions, cos_sin_cache, k_cache, v_cache,
                                        batch.slot_mapping, self.q_norm, self.k_norm, self.norm_eps, self.norm_offset)
            out = kernels.paged_attention(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens,
                                          batch.block_tables, self.scale, gate,  # the gate in its last store
                                          max_query_len=batch.max_query_len)
        return kernels.linear_to_residual(out.reshape(tokens, -1), self.o_proj, self.o_bias)

    def _query_and_gate(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q [T, Hq, D] and the gate (None when ungated) out of q_proj's rows."""
        tokens = q.shape[0]
        gate = None
        if self.gated:
            q, gate = q.view(tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        return q.reshape(tokens, self.num_heads, self.head_dim), gate

    def _attend_output_rows(self, x, batch, cos_sin_cache, output_rows) -> torch.Tensor | kernels.PartialSums:
        """Every row's key and value go to the cache; the queries, the attention and the output projection
        are computed for output_rows only, each attending as a one-row chunk over its sequence's paged keys
        (all of them, once this chunk's are stored)."""
        tokens, count, q_size = x.shape[0], output_rows.count, self.q_size
        weight, bias = self.qkv_proj, self.qkv_bias
        k, v = kernels.linear(x, weight[q_size:], bias[q_size:] if bias is not None else None).split(
            [self.kv_size, self.kv_size], -1)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if count:
            q = kernels.linear(output_rows.select(x), weight[:q_size], bias[:q_size] if bias is not None else None)
        else:
            q = x.new_empty((0, q_size))
        q, gate = self._query_and_gate(q)
        k_cache, v_cache = batch.kv_cache(self.layer_idx)
        q = kernels.rotary_store_kv(q, k, v, batch.positions, cos_sin_cache, k_cache, v_cache, batch.slot_mapping,
                                    self.q_norm, self.k_norm, self.norm_eps, self.norm_offset, q_rows=output_rows.rows)
        if count == 0:
            return x.new_empty((0, self.o_proj.shape[0]))
        out = kernels.paged_attention(q, k_cache, v_cache, output_rows.query_start_loc, output_rows.seq_lens,
                                      output_rows.block_tables, self.scale, gate, max_query_len=1)
        return kernels.linear_to_residual(out.reshape(count, -1), self.o_proj, self.o_bias)
