"""Random weights in a checkpoint's real shapes: the same work as real weights for benchmarks, which
time a fixed number of generated tokens."""

import math

import torch

from deltaserve.models.decoder import DecoderLM
from deltaserve.models.layers.moe import SparseMoE


@torch.no_grad()
def init_random_weights(model: DecoderLM, seed: int = 0, std: float = 0.02) -> None:
    generator = torch.Generator(device=model.embed_tokens.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("A_log"):
            param.uniform_(math.log(1.0), math.log(16.0), generator=generator)
        elif name.endswith("dt_bias"):
            param.fill_(1.0)
        elif name.endswith("mixer.norm_weight"):  # the GDN output norm scales by plain w
            param.fill_(1.0)
        elif param.dim() == 1:  # norm weights: 1 for w-norms, 0 for the zero-centred (1 + w) ones
            param.fill_(0.0 if model.config.norm_offset else 1.0)
        else:
            param.normal_(0.0, std, generator=generator)
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.zero_padding()  # alignment rows: zero, as a loaded checkpoint has them
