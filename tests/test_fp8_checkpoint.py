"""FP8 checkpoints (quantization_config quant_method "fp8"): each float8 weight is dequantized as it is read, and
a model so loaded generates what the same model stored with those dequantized weights generates."""

import json
import os
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from deltaserve import LLM, SamplingParams
from deltaserve.errors import WeightLoadError
from deltaserve.models.fp8_checkpoint import dequantize, dequantized, fp8_weight_block

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def _blockwise(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
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


def _by_blocks(quantized: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The definition, element by element: each value times the scale of the block it lies in."""
    out = torch.empty(quantized.shape)
    for r in range(quantized.shape[0]):
        for c in range(quantized.shape[1]):
            out[r, c] = quantized[r, c].float() * scale[r // block[0], c // block[1]]
    return out


def test_blocks_partial_blocks_and_row_scales_dequantize_as_defined():
    block = (random.randint(2, 8), random.randint(2, 8))
    weight = torch.randn(random.randint(5, 20), random.randint(5, 20))  # rarely a whole number of blocks
    quantized, scale = _blockwise(weight, block)
    assert torch.equal(dequantize(quantized, scale, block), _by_blocks(quantized, scale, block))
    assert (dequantize(quantized, scale, block) - weight).abs().max() <= weight.abs().max() / 8  # fp8's rounding
    rows = torch.rand(weight.shape[0]) + 0.5
    assert torch.equal(dequantize(quantized, rows, None), quantized.float() * rows[:, None])
    one = torch.tensor(0.37)
    assert torch.equal(dequantize(quantized, one, None), quantized.float() * 0.37)
    with pytest.raises(WeightLoadError, match="does not cover"):
        dequantize(quantized, torch.ones(3, 3), None)
    stacked = [_blockwise(torch.randn(*weight.shape), block) for _ in range(3)]  # experts in one tensor
    assert torch.equal(dequantize(torch.stack([q for q, _ in stacked]), torch.stack([s for _, s in stacked]), block),
                       torch.stack([_by_blocks(q, s, block) for q, s in stacked]))


def test_weights_pair_with_their_scales_in_either_order():
    w = torch.randn(6, 4).to(torch.float8_e4m3fn)
    s = torch.rand(1, 1) + 0.5
    norm = torch.randn(4)
    stream = [("a.weight_scale_inv", s), ("a.input_scale", torch.ones(())), ("n.weight", norm), ("a.weight", w),
              ("b.weight", w), ("b.weight_scale_inv", s)]
    out = dict(dequantized(stream, (8, 8)))
    assert sorted(out) == ["a.weight", "b.weight", "n.weight"]
    assert torch.equal(out["a.weight"], w.float() * s) and torch.equal(out["b.weight"], out["a.weight"])
    assert out["n.weight"] is norm  # not float8: as it was
    with pytest.raises(WeightLoadError, match=r"c\.weight \(no scale\)"):
        dict(dequantized([("c.weight", w)], (8, 8)))
    with pytest.raises(WeightLoadError, match="d scale"):
        dict(dequantized([("d.weight_scale_inv", s)], (8, 8)))


def test_other_quantization_methods_are_refused_by_name():
    assert fp8_weight_block({"quant_method": "fp8", "weight_block_size": [128, 128]}) == (128, 128)
    assert fp8_weight_block({"quant_method": "fp8", "activation_scheme": "static"}) is None
    for method in ("awq", "gptq", "compressed-tensors", "bitsandbytes"):
        with pytest.raises(WeightLoadError, match=f"quant_method '{method}'"):
            fp8_weight_block({"quant_method": method})
    with pytest.raises(WeightLoadError, match="weight_block_size"):
        fp8_weight_block({"quant_method": "fp8", "weight_block_size": [128]})


def _fp8_pair(path: str, tmp_path, block: tuple[int, int]) -> tuple[str, str]:
    """The checkpoint with its layers' projections stored as float8 and scales, and the same checkpoint with
    those weights as the float8 values times their scales."""
    tensors = load_file(os.path.join(path, "model.safetensors"))
    quantized, plain = {}, {}
    for name, tensor in tensors.items():
        if ".layers." in name and name.endswith("proj.weight") and tensor.dim() == 2:
            q, scale = _blockwise(tensor.float(), block)
            quantized[name], quantized[name[: -len("weight")] + "weight_scale_inv"] = q, scale
            plain[name] = _by_blocks(q, scale, block)
        else:
            quantized[name] = plain[name] = tensor
    assert len(quantized) > len(plain)  # some weights were quantized
    dirs = []
    for label, weights in (("fp8", quantized), ("plain", plain)):
        target = str(tmp_path / label)
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


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3.5-moe", "qwen3-next", "llama"])
def test_an_fp8_checkpoint_generates_what_its_dequantized_weights_generate(checkpoint_factory, tmp_path, arch):
    fp8, plain = _fp8_pair(checkpoint_factory(arch), tmp_path, (random.randint(3, 16), random.randint(3, 16)))
    prompts = [[random.randrange(3, 300) for _ in range(random.randint(1, 30))] for _ in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    got, want = (LLM(p, device="cpu", dtype="float32").generate(prompts, params, use_tqdm=False) for p in (fp8, plain))
    for a, b in zip(got, want):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == b.outputs[0].cumulative_logprob


def test_a_quantized_checkpoint_of_another_method_is_refused_before_loading(checkpoint_factory, tmp_path):
    target = str(tmp_path / "awq")
    shutil.copytree(checkpoint_factory("llama"), target)
    with open(os.path.join(target, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(WeightLoadError, match="quant_method 'awq'"):
        LLM(target, device="cpu")
