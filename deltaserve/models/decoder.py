"""The decoder-only language model shared by every supported architecture.

A layer is a token mixer (full attention or Gated DeltaNet) and a feed-forward block (dense SwiGLU
or sparse MoE), each behind a pre-norm with the residual add fused into the norm. Plain attention
models (Llama, Qwen3) are the case with no GDN layers.
"""

import torch
from torch import nn
from torch.nn import functional as F

from deltaserve import kernels

from deltaserve.models.config import FULL_ATTENTION, ModelConfig
from deltaserve.models.layers.attention import Attention
from deltaserve.models.layers.gated_delta_net import GatedDeltaNet
from deltaserve.models.layers.mlp import GatedMLP
from deltaserve.models.layers.moe import SparseMoE
from deltaserve.models.layers.norm import RMSNorm
from deltaserve.models.layers.params import empty_param
from deltaserve.models.layers.rotary import build_cos_sin_cache


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype, device):
        super().__init__()
        norm = lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset, dtype, device)  # noqa: E731
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.is_attention = config.layer_types[layer_idx] == FULL_ATTENTION
        if self.is_attention:
            self.mixer = Attention(config, layer_idx, dtype, device)
        else:
            self.mixer = GatedDeltaNet(config, layer_idx, dtype, device)
        self.is_moe = bool(config.moe_layers and config.moe_layers[layer_idx])
        if self.is_moe:
            self.mlp = SparseMoE(config, dtype, device)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, dtype, device, config.mlp_bias)

    def forward(self, hidden, residual, batch, cos_sin_cache, output_rows=None):
        """output_rows (an OutputRows, or None for every row): the rows this layer returns. The mixer
        still takes every row in, so that the caches and states see the whole chunk."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        if self.is_attention:
            hidden = self.mixer(hidden, batch, cos_sin_cache, output_rows)
        else:
            hidden = self.mixer(hidden, batch, output_rows)
        if output_rows is not None:
            residual = output_rows.select(residual)
            if output_rows.count == 0:  # no row is wanted: nothing after the mixer runs
                return hidden, residual
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        if self.is_moe:
            return self.mlp(hidden, batch.live_rows), residual
        return self.mlp(hidden), residual


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device, max_positions: int):
        super().__init__()
        self.config = config
        self.embed_tokens = empty_param(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(config, i, dtype, device) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head = self.embed_tokens
        else:
            self.lm_head = empty_param(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.register_buffer("cos_sin_cache", build_cos_sin_cache(config, max_positions, device), persistent=False)
        # Multi-token-prediction tensors, kept as loaded for speculative decoding.
        self.mtp_tensors: dict[str, torch.Tensor] = {}

    def forward(self, input_ids: torch.Tensor, batch) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of every row of the flat batch, or [R, hidden] of the rows
        of batch.output_rows where the batch has them (the last layer computes no others)."""
        hidden, residual = F.embedding(input_ids, self.embed_tokens), None
        output_rows = batch.output_rows
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(hidden, residual, batch, self.cos_sin_cache, output_rows if i == last else None)
        if hidden.shape[0] == 0:
            return hidden
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.linear(hidden, self.lm_head, out_dtype=torch.float32)  # the sampler reads fp32
