"""The decoder-only language model shared by every supported architecture.

A layer is a token mixer (full attention or Gated DeltaNet) and a feed-forward block (dense SwiGLU
or sparse MoE), each behind a pre-norm with the residual add fused into the norm. Plain attention
models (Llama, Qwen3) are the case with no GDN layers.
"""

import torch
from torch import nn
from torch.nn import functional as F

from deltaserve import kernels
from deltaserve.models.config import ModelConfig
from deltaserve.models.decoder_layer import DecoderLayer
from deltaserve.models.layers.norm import RMSNorm
from deltaserve.models.layers.params import empty_param
from deltaserve.models.layers.rotary import build_cos_sin_cache
from deltaserve.models.mtp import build_mtp


class DecoderLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device, max_positions: int, with_mtp: bool = False):
        """with_mtp: also build the checkpoint's multi-token-prediction head (`self.mtp`, else None), which
        reads this model's embedding, rotary table and lm_head."""
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
        self.mtp = build_mtp(config, dtype, device) if with_mtp else None

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

    def forward_mtp(self, input_ids: torch.Tensor, hidden: torch.Tensor, batch) -> torch.Tensor:
        """The multi-token-prediction head's final-norm hidden states [T, hidden] (see MultiTokenPredictor);
        compute_logits turns them into its logits."""
        return self.mtp(input_ids, hidden, batch, self.embed_tokens, self.cos_sin_cache)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.linear(hidden, self.lm_head, out_dtype=torch.float32)  # the sampler reads fp32
