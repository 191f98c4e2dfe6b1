"""Checkpoints whose linear weights are stored in FP8 (config.json's quantization_config with quant_method
"fp8", as Qwen's -FP8 repositories are): each float8 weight is dequantized as it is read, times its scale
(`weight_scale_inv` over blocks of `weight_block_size`, or one `weight_scale` for the tensor or its rows), and
the model runs on those weights in its own dtype. Static activation scales (`input_scale`) are dropped: the
activations stay in the model's dtype. Any other quantization method is refused by name before a weight is read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from deltaserve.errors import WeightLoadError

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
DROPPED_SUFFIXES = (".input_scale",)


def fp8_weight_block(quantization: dict | None) -> tuple[int, int] | None:
    """The (rows, columns) of a scale's block in an FP8 checkpoint; None where one scale covers a tensor or its
    rows. Refuses a quantization_config that is not FP8, naming its method."""
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method != "fp8":
        raise WeightLoadError(f"config.json's quantization_config (quant_method {method!r}) is not supported: "
                              "deltaserve loads unquantized checkpoints and FP8 ones (quant_method 'fp8')")
    block = quantization.get("weight_block_size")
    if block is None:
        return None
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise WeightLoadError(f"quantization_config.weight_block_size={block!r}: must be two positive integers")
    return block[0], block[1]


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None) -> torch.Tensor:
    """float32 values of a float8 weight [..., R, C]: times scale [..., ceil(R / br), ceil(C / bc)] repeated over
    its blocks, or times a scale that broadcasts (one for the tensor, or one a row)."""
    values = weight.to(torch.float32)
    scale = scale.to(torch.float32)
    if block is not None and scale.dim() >= 2:
        rows, cols = values.shape[-2:]
        scale = scale.repeat_interleave(block[0], dim=-2)[..., :rows, :]
        scale = scale.repeat_interleave(block[1], dim=-1)[..., :cols]
    elif scale.dim() == 1 and scale.numel() == values.shape[-2]:  # one a row
        scale = scale[:, None]
    try:
        return values * scale
    except RuntimeError as exc:
        raise WeightLoadError(f"a scale of shape {list(scale.shape)} does not cover a weight of shape "
                              f"{list(values.shape)}: {exc}") from exc


def dequantized(tensors: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int] | None
                ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each float8 weight dequantized, once both it and its scale are read (in
    either order); its scale and activation scales are not passed on. Other tensors pass as they are."""
    weights: dict[str, torch.Tensor] = {}  # module name -> float8 weight waiting for its scale
    scales: dict[str, torch.Tensor] = {}  # module name -> scale waiting for its weight
    for name, tensor in tensors:
        if name.endswith(DROPPED_SUFFIXES):
            continue
        suffix = next((s for s in SCALE_SUFFIXES if name.endswith(s)), None)
        if suffix is not None:
            module = name[: -len(suffix)]
            scales[module] = tensor
        elif name.endswith(".weight") and tensor.dtype in FP8_DTYPES:
            module = name[: -len(".weight")]
            weights[module] = tensor
        else:
            yield name, tensor
            continue
        if module in weights and module in scales:
            yield f"{module}.weight", _named(module, weights.pop(module), scales.pop(module), block)
    unpaired = sorted([f"{m}.weight (no scale)" for m in weights] + [f"{m} scale (no float8 weight)" for m in scales])
    if unpaired:
        raise WeightLoadError(f"FP8 checkpoint: {', '.join(unpaired[:5])}{' ...' if len(unpaired) > 5 else ''}")


def _named(module: str, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None) -> torch.Tensor:
    try:
        return dequantize(weight, scale, block)
    except WeightLoadError as exc:
        raise WeightLoadError(f"{module}: {exc}") from exc
