"""The rotary table: cos and sin of every position for the rotated part of a head."""

import math

import torch

from deltaserve.errors import UnsupportedArchitectureError
from deltaserve.models.config import ModelConfig

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.rotary_dim
    # Same fp32 arithmetic as the checkpoints' reference code, so positions match to the last bit.
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitectureError(
            f"rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3's piecewise rescaling: long wavelengths slowed by `factor`, short ones kept, blended between."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    middle = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(middle, blended, out)


def build_cos_sin_cache(config: ModelConfig, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, rotary_dim] fp32: cos of each frequency in the first half, sin in the second."""
    inv_freq = inverse_frequencies(config).to(device)
    freqs = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
