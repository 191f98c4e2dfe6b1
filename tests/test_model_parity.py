"""Parity with transformers on tiny random checkpoints it writes itself, every architecture, fp32."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from tests.checkpoints import ARCHITECTURES
from tests.reference import LogitsRecorder, hf_greedy, load_reference

NEW_TOKENS = 24
# fp32 against float64, on logits about 5 in size. Over 120 drawn prompts each, the farthest step lay
# 4.7e-5 away on qwen3.5 and qwen3-next; on qwen3.5-moe two prompts in some 250 reached 1.1e-4 and
# 1.2e-4. That is rounding, not a worse order of sums: transformers' own fp32 lay 1.5e-5 away on the
# first of them and 2.6e-5 on another prompt where deltaserve lay 1.2e-5, and the MoE layers fed the same
# input keep transformers' fp32 error. One bf16 rounding anywhere (8 bits) would be some 1e-2.
LOGITS_ATOL = 5e-4


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_tokens_and_logits_match_transformers(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (1, rng.randint(5, 20), rng.randint(40, 90))]
    # Without the prefix cache every prompt prefills in one pass (the cache splits a prefill at its
    # replay point), so each step samples one row per prompt; the cache has its own tests.
    llm = LLM(path, device="cpu", enable_prefix_caching=False)
    recorder = LogitsRecorder(llm.engine.runner.model)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    # Rows of each step come in request order; only finished prefills sample, so regroup per prompt.
    per_prompt = _logits_per_prompt(recorder.rows, len(prompts))

    reference = load_reference(path)
    for prompt, output, logits in zip(prompts, outputs, per_prompt):
        tokens, ref_logits = hf_greedy(reference, prompt, NEW_TOKENS)
        assert output.outputs[0].token_ids == tokens
        assert torch.stack(logits).shape == ref_logits.shape
        torch.testing.assert_close(torch.stack(logits), ref_logits, atol=LOGITS_ATOL, rtol=0)


def _logits_per_prompt(rows, count):
    """All prompts prefill in the first step and then decode together, so each step has one row per prompt."""
    assert all(r.shape[0] == count for r in rows)
    return [[step[i] for step in rows] for i in range(count)]


def test_sharded_checkpoint_with_index_loads_the_same_model(tmp_path):
    """Shards listed by model.safetensors.index.json give the same greedy tokens as one file."""
    from tests.checkpoints import build_model, randomize, write_tokenizer

    model = build_model("qwen3.5").float().eval()
    randomize(model, seed=3)
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    model.save_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="100KB")
    for path in (single, sharded):
        write_tokenizer(str(path))
    assert (sharded / "model.safetensors.index.json").exists() and not (sharded / "model.safetensors").exists()
    prompts = [[random.randrange(300) for _ in range(12)]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
    one = LLM(str(single), device="cpu").generate(prompts, params)[0].outputs[0]
    many = LLM(str(sharded), device="cpu").generate(prompts, params)[0].outputs[0]
    assert one.token_ids == many.token_ids
    assert [next(iter(e.values())).logprob for e in one.logprobs] == [next(iter(e.values())).logprob for e in many.logprobs]
