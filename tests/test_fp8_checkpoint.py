"""FP8 checkpoints (quantization_config quant_method "fp8"): each float8 weight is dequantized as it is read, and
a model so loaded generates what the same model stored with those dequantized weights generates."""

import json
import os
import random
import shutil

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.errors import WeightLoadError
from deltaserve.models.fp8_checkpoint import dequantize, dequantized, fp8_weight_block
from tests.fp8_checkpoints import blockwise, by_blocks, write_fp8_pair


def test_blocks_partial_blocks_and_row_scales_dequantize_as_defined():
    block = (random.randint(2, 8), random.randint(2, 8))
    weight = torch.randn(random.randint(5, 20), random.randint(5, 20))  # rarely a whole number of blocks
    quantized, scale = blockwise(weight, block)
    assert torch.equal(dequantize(quantized, scale, block), by_blocks(quantized, scale, block))
    assert (dequantize(quantized, scale, block) - weight).abs().max() <= weight.abs().max() / 8  # fp8's rounding
    rows = torch.rand(weight.shape[0]) + 0.5
    assert torch.equal(dequantize(quantized, rows, None), quantized.float() * rows[:, None])
    one = torch.tensor(0.37)
    assert torch.equal(dequantize(quantized, one, None), quantized.float() * 0.37)
    with pytest.raises(WeightLoadError, match="does not cover"):
        dequantize(quantized, torch.ones(3, 3), None)
    stacked = [blockwise(torch.randn(*weight.shape), block) for _ in range(3)]  # experts in one tensor
    assert torch.equal(dequantize(torch.stack([q for q, _ in stacked]), torch.stack([s for _, s in stacked]), block),
                       torch.stack([by_blocks(q, s, block) for q, s in stacked]))


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


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3.5-moe", "qwen3-next", "llama"])
def test_an_fp8_checkpoint_generates_what_its_dequantized_weights_generate(checkpoint_factory, tmp_path, arch):
    fp8, plain = write_fp8_pair(checkpoint_factory(arch), tmp_path, (random.randint(3, 16), random.randint(3, 16)))
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
