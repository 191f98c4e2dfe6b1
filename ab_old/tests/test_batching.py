"""Continuous batching, chunked prefill and preemption give the same tokens as a request run alone."""

import random

import pytest

from deltaserve import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


def _prompts(rng: random.Random, count: int) -> list[list[int]]:
    return [[rng.randrange(300) for _ in range(rng.randint(1, 70))] for _ in range(count)]


@pytest.fixture(params=["qwen3.5", "llama"])
def model_path(request, checkpoint_factory):
    return checkpoint_factory(request.param)


def test_prompt_alone_equals_prompt_in_batch_of_eight(model_path):
    rng = random.Random()
    prompts = _prompts(rng, 8)
    llm = LLM(model_path, device="cpu")
    batched = llm.generate(prompts, GREEDY)
    target = rng.randrange(8)
    alone = llm.generate([prompts[target]], GREEDY)[0]
    assert len({len(p) for p in prompts}) > 1
    assert batched[target].outputs[0].token_ids == alone.outputs[0].token_ids


def test_chunked_prefill_of_seven_tokens_equals_unchunked(model_path):
    prompts = _prompts(random.Random(), 3)
    unchunked = LLM(model_path, device="cpu").generate(prompts, GREEDY)
    chunked_llm = LLM(model_path, device="cpu", max_num_batched_tokens=7)
    chunked = chunked_llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in chunked] == [o.outputs[0].token_ids for o in unchunked]


def test_kv_pool_too_small_for_all_requests_preempts_and_completes(model_path):
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(rng.randint(40, 70))] for _ in range(6)]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    roomy = LLM(model_path, device="cpu").generate(prompts, params)
    # 16 blocks of 16 tokens hold ~2-3 of these sequences at a time, not all six.
    small = LLM(model_path, device="cpu", num_kv_blocks=16, max_model_len=256)
    tight = small.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]
    assert small.engine.stats().num_preemptions > 0
    assert small.engine.stats().kv_blocks_used == 0
