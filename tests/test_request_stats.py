"""The engine's times for each sampled sequence (RequestStateStats, vLLM's RequestOutput.metrics) and its per-step
report (StepStats): what vLLM's queue, prefill, decode and inter-token series are built from."""

import math
import random
import time

import pytest

from deltaserve import SamplingParams
from deltaserve.engine.llm_engine import LLMEngine


def _random_requests(rng: random.Random) -> list[tuple[list[int], SamplingParams]]:
    return [([rng.randrange(300) for _ in range(rng.randint(1, 40))],
             SamplingParams(max_tokens=rng.randint(1, 12), temperature=rng.choice([0, 1.0]), ignore_eos=True,
                            n=rng.choice([1, 1, 2, 3]), seed=rng.randrange(1000)))
            for _ in range(rng.randint(2, 6))]


def _run(engine: LLMEngine, requests) -> tuple[dict, list]:
    steps = []
    engine.step_listeners.append(steps.append)
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[int(out.request_id)] = out
            else:
                assert out.metrics is None and all(o.metrics is None for o in out.outputs if not o.finished())
    return finished, steps


@pytest.mark.parametrize("overlap", [False, True])
def test_each_sample_has_its_times_and_the_steps_give_its_gaps(overlap, checkpoint_factory):
    engine = LLMEngine.from_args(checkpoint_factory("qwen3.5"), device="cpu", enable_prefix_caching=False,
                                 async_scheduling=overlap)
    requests = _random_requests(random.Random())
    before = time.time()
    finished, steps = _run(engine, requests)
    after = time.time()
    assert sorted(finished) == list(range(len(requests)))
    gaps_expected, decode_time = 0, 0.0
    for i, out in finished.items():
        samples = [o.metrics for o in out.outputs]
        for o, stats in zip(out.outputs, samples):
            assert stats.num_generation_tokens == len(o.token_ids) == requests[i][1].max_tokens
            assert before <= stats.arrival_time <= after
            assert 0 < stats.queued_ts <= stats.scheduled_ts <= stats.first_token_ts <= stats.last_token_ts
            assert math.isclose(stats.queued_time + stats.prefill_time + stats.decode_time,
                                stats.last_token_ts - stats.queued_ts, abs_tol=1e-9)
            gaps_expected += stats.num_generation_tokens - 1
            decode_time += stats.decode_time
        if len(samples) == 1:
            assert out.metrics is samples[0]
        else:  # the request's times span its samples
            assert out.metrics.first_token_ts == min(s.first_token_ts for s in samples)
            assert out.metrics.last_token_ts == max(s.last_token_ts for s in samples)
            assert out.metrics.num_generation_tokens == sum(s.num_generation_tokens for s in samples)
    # every token after a sequence's first is one gap, and a sequence's gaps add up to its decode time
    gaps = [g for step in steps for g in step.inter_token_latencies]
    assert len(gaps) == gaps_expected and all(g >= 0 for g in gaps)
    assert math.isclose(sum(gaps), decode_time, rel_tol=1e-6, abs_tol=1e-6)
    # vLLM's iteration tokens: each token read back, and each sequence's prompt (no prefix cache) with its first
    tokens = sum(step.num_tokens for step in steps if step.num_tokens is not None)
    assert tokens == sum((len(prompt) + params.max_tokens) * params.n for prompt, params in requests)
    assert all(step.num_tokens is None or step.num_tokens > 0 for step in steps)
    assert engine.stats().num_preemptions == 0


def test_a_preempted_request_counts_its_prompt_once(checkpoint_factory):
    rng = random.Random()
    requests = [([rng.randrange(300) for _ in range(rng.randint(40, 70))],
                 SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)) for _ in range(6)]
    # 16 blocks of 16 tokens hold two or three of these sequences at a time
    engine = LLMEngine.from_args(checkpoint_factory(rng.choice(["qwen3.5", "llama"])), device="cpu",
                                 num_kv_blocks=16, max_model_len=256)
    finished, steps = _run(engine, requests)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert stats.prompt_tokens_total == sum(len(prompt) for prompt, _ in requests)  # as each usage counts it
    assert stats.prompt_tokens_total == sum(len(out.prompt_token_ids) for out in finished.values())
    assert stats.prefix_cache_queries == stats.prompt_tokens_total  # lookups of restarts are not new queries
    assert stats.generation_tokens_total == 30 * len(requests)
    tokens = sum(step.num_tokens for step in steps if step.num_tokens is not None)
    assert tokens == stats.prompt_tokens_total - stats.prompt_tokens_cached_total + stats.generation_tokens_total


def test_prompt_tokens_cached_counts_the_prefix_cache_hits_of_started_requests(checkpoint_factory):
    engine = LLMEngine.from_args(checkpoint_factory("llama"), device="cpu", block_size=4)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(9, 40))]
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    first, _ = _run(engine, [(prompt, params)])
    assert first[0].num_cached_tokens == 0 and engine.stats().prompt_tokens_cached_total == 0
    engine.add_request("again", prompt, params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
    cached = outputs[0].num_cached_tokens
    assert cached > 0  # whole blocks of the prompt, found as the first run left them
    assert engine.stats().prompt_tokens_cached_total == cached
    assert engine.stats().prompt_tokens_total == 2 * len(prompt)
