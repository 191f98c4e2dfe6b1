"""One decoder layer: a token mixer (full attention or Gated DeltaNet) and a feed-forward block (dense
SwiGLU or sparse MoE), each behind a pre-norm with the residual add fused into the norm."""

import torch
from torch import nn

from deltaserve.models.config import FULL_ATTENTION, ModelConfig
from deltaserve.models.layers.attention import Attention
from deltaserve.models.layers.gated_delta_net import GatedDeltaNet
from deltaserve.models.layers.mlp import GatedMLP
from deltaserve.models.layers.moe import SparseMoE
from deltaserve.models.layers.norm import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, dtype: torch.dtype, device, *,
                 full_attention: bool | None = None, moe: bool | None = None):
        """layer_idx: the layer's id in the KV or state pool. full_attention and moe: the layer's kind where
        the config's per-layer lists have no entry for it (the multi-token-prediction layer, past the model's
        own layers); None reads them from config.layer_types and config.moe_layers."""
        super().__init__()
        norm = lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset, dtype, device)  # noqa: E731
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        if full_attention is None:
            full_attention = config.layer_types[layer_idx] == FULL_ATTENTION
        self.is_attention = full_attention
        if self.is_attention:
            self.mixer = Attention(config, layer_idx, dtype, device)
        else:
            self.mixer = GatedDeltaNet(config, layer_idx, dtype, device)
        if moe is None:
            moe = bool(config.moe_layers and config.moe_layers[layer_idx])
        self.is_moe = moe
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
