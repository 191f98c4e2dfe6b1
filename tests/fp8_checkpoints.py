"""FP8 checkpoints for tests and GPU checks: a checkpoint's projections stored block by block as float8 with their
scales (quantization_config quant_method "fp8", as Qwen's -FP8 repositories), beside the same checkpoint holding
those float8 values times their scales."""

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def blockwise(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [R, C] as float8 and its scale [ceil(R / br), ceil(C / bc)], block by block."""
    rows, cols = weight.shape
    scale = torch.empty(-(-rows // block[0]), -(-cols // block[1]))
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            part = weight[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            scale[i, j] = part.abs().max().clamp(min=1e-12) / FP8_MAX
            quantized[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = \
                (part / scale[i, j]).to(torch.float8_e4m3fn)
    return quantized, scale


def by_blocks(quantized: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The definition, element by element: each value times the scale of the block it lies in."""
    out = torch.empty(quantized.shape)
    for r in range(quantized.shape[0]):
        for c in range(quantized.shape[1]):
            out[r, c] = quantized[r, c].float() * scale[r // block[0], c // block[1]]
    return out


def write_fp8_pair(path: str, target_dir, block: tuple[int, int]) -> tuple[str, str]:
    """The checkpoint with its layers' projections stored as float8 and scales, and the same checkpoint with
    those weights as the float8 values times their scales."""
    tensors = load_file(os.path.join(path, "model.safetensors"))
    quantized, plain = {}, {}
    for name, tensor in tensors.items():
        if ".layers." in name and name.endswith("proj.weight") and tensor.dim() == 2:
            q, scale = blockwise(tensor.float(), block)
            quantized[name], quantized[name[: -len("weight")] + "weight_scale_inv"] = q, scale
            plain[name] = by_blocks(q, scale, block)
        else:
            quantized[name] = plain[name] = tensor
    assert len(quantized) > len(plain)  # some weights were quantized
    dirs = []
    for label, weights in (("fp8", quantized), ("plain", plain)):
        target = os.path.join(str(target_dir), label)
        shutil.copytree(path, target)
        save_file(weights, os.path.join(target, "model.safetensors"))
        dirs.append(target)
    with open(os.path.join(dirs[0], "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block)}
    with open(os.path.join(dirs[0], "config.json"), "w") as f:
        json.dump(config, f)
    return dirs[0], dirs[1]
