"""The multi-token-prediction (MTP) head of Qwen3.5 and Qwen3-Next checkpoints (their `mtp.*` tensors).

From the target model's final-norm hidden state at row i and the token at row i + 1 it predicts the token
after that, so that a draft of the next tokens costs one small layer rather than the whole model:

    x = fc([pre_fc_norm_embedding(embed(token)) | pre_fc_norm_hidden(hidden)])
    out = norm(decoder_layer(x))            # logits: the target model's lm_head on out

as vLLM's Qwen3_5MultiTokenPredictor computes it. The embedding, the rotary table and the lm_head are the
target model's (the checkpoints hold none under mtp.). The decoder layer is a full-attention layer of the
model's kind (gated attention, q/k norm, partial rotary; MoE where the model has MoE layers), whose keys and
values live in the KV pool as layer `config.mtp_layer_idx`.
"""

import logging

import torch
from torch import nn
from torch.nn import functional as F

from deltaserve import kernels
from deltaserve.errors import DeltaServeError
from deltaserve.models.config import ModelConfig
from deltaserve.models.decoder_layer import DecoderLayer
from deltaserve.models.layers.norm import RMSNorm
from deltaserve.models.layers.params import empty_param

log = logging.getLogger(__name__)


class MultiTokenPredictor(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device):
        super().__init__()
        hidden = config.hidden_size
        norm = lambda: RMSNorm(hidden, config.rms_norm_eps, config.norm_offset, dtype, device)  # noqa: E731
        self.pre_fc_norm_embedding = norm()
        self.pre_fc_norm_hidden = norm()
        self.fc = empty_param(hidden, 2 * hidden, dtype=dtype, device=device)  # [embedding | hidden] -> hidden
        # One layer, in a list so that its parameters are named as the checkpoint's mtp.layers.0.* are.
        self.layers = nn.ModuleList([DecoderLayer(config, config.mtp_layer_idx, dtype, device,
                                                  full_attention=True, moe=config.has_moe)])
        self.norm = norm()

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, batch, embed_tokens: torch.Tensor,
                cos_sin_cache: torch.Tensor) -> torch.Tensor:
        """input_ids [T]: the tokens that follow the rows of `hidden` [T, H], the target model's final-norm
        hidden states (those its logits are computed from). Returns the final-norm output [T, H] of every
        row; every row's key and value go to the KV pool's layer config.mtp_layer_idx."""
        embedded = self.pre_fc_norm_embedding(F.embedding(input_ids, embed_tokens))
        x = kernels.linear(torch.cat([embedded, self.pre_fc_norm_hidden(hidden)], dim=-1), self.fc)
        x, residual = self.layers[0](x, None, batch, cos_sin_cache)
        out, _ = self.norm(x, residual)
        return out


def build_mtp(config: ModelConfig, dtype: torch.dtype, device) -> MultiTokenPredictor:
    """The head of a config that has one; of several MTP layers the first (Qwen's checkpoints have one)."""
    if config.num_mtp_layers == 0:
        raise DeltaServeError(f"the {config.architecture} config has no multi-token-prediction layers "
                              "(mtp_num_hidden_layers is 0 or unset), so no MTP head can be built")
    if config.num_mtp_layers > 1:
        log.info("the checkpoint has %d multi-token-prediction layers; only the first is used (vLLM cycles "
                 "through them, one a draft step)", config.num_mtp_layers)
    return MultiTokenPredictor(config, dtype, device)
