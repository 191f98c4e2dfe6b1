"""/metrics carries vLLM's names for the numbers vLLM also exports, labelled with the served model and engine 0,
with the values of deltaserve's own series: a dashboard or autoscaler written for vLLM reads deltaserve."""

import random

from prometheus_client.parser import text_string_to_metric_families

from deltaserve.engine.async_engine import RequestTiming
from deltaserve.engine.llm_engine import EngineStats
from deltaserve.server.metrics import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict[tuple, float]:
    """(sample name, labels as sorted pairs) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}


def _random_timing(rng: random.Random, i: int) -> RequestTiming:
    arrival = rng.uniform(0, 100)
    first = None if rng.random() < 0.2 else arrival + rng.uniform(0.001, 3)
    finished = (first or arrival) + rng.uniform(0, 30)
    reason = rng.choice(["stop", "length", "abort", "error"])
    generated = 0 if first is None else rng.randint(1, 500)
    return RequestTiming(f"r{i}", reason, arrival=arrival, first_token=first, finished=finished,
                         prompt_tokens=rng.randint(1, 4000), generation_tokens=generated)


def test_vllms_series_carry_the_numbers_of_deltaserves_own():
    rng, model = random.Random(), f"model-{random.randrange(1000)}"
    stats = EngineStats(**{name: rng.randint(0, 10**6) for name in (
        "num_running", "num_waiting", "kv_blocks_used", "prompt_tokens_total", "generation_tokens_total",
        "prefix_cache_queries", "prefix_cache_hits", "num_preemptions")})
    stats.kv_blocks_total = stats.kv_blocks_used + rng.randint(1, 1000)
    metrics = ServerMetrics(lambda: stats, model, max_model_len=4096)
    timings = [_random_timing(rng, i) for i in range(rng.randint(1, 40))]
    for timing in timings:
        metrics.observe(timing)
    got, vllm = _samples(metrics), (("engine", "0"), ("model_name", model))

    def labelled(**more) -> tuple:
        return tuple(sorted(vllm + tuple(more.items())))

    for name, field in (("num_requests_running", "num_running"), ("num_requests_waiting", "num_waiting"),
                        ("prompt_tokens_total", "prompt_tokens_total"), ("num_preemptions_total", "num_preemptions"),
                        ("generation_tokens_total", "generation_tokens_total"),
                        ("prefix_cache_queries_total", "prefix_cache_queries"),
                        ("prefix_cache_hits_total", "prefix_cache_hits")):
        assert got[(f"vllm:{name}", vllm)] == getattr(stats, field), name
    assert got[("vllm:kv_cache_usage_perc", vllm)] == stats.kv_blocks_used / stats.kv_blocks_total
    for reason in ("stop", "length", "abort", "error"):
        assert got[("vllm:request_success_total", labelled(finished_reason=reason))] == \
            got[("deltaserve_requests_finished_total", (("reason", reason),))] == \
            sum(t.finish_reason == reason for t in timings)
    for ours, theirs in (("time_to_first_token_seconds", "time_to_first_token_seconds"),
                         ("time_per_output_token_seconds", "request_time_per_output_token_seconds"),
                         ("e2e_request_latency_seconds", "e2e_request_latency_seconds")):
        for part in ("_count", "_sum"):
            assert got[(f"vllm:{theirs}{part}", vllm)] == got[(f"deltaserve_{ours}{part}", ())], theirs
    completed = [t for t in timings if t.finish_reason in ("stop", "length")]
    assert got[("vllm:e2e_request_latency_seconds_count", vllm)] == len(completed)
    for name, field in (("request_prompt_tokens", "prompt_tokens"), ("request_generation_tokens", "generation_tokens")):
        assert got[(f"vllm:{name}_sum", vllm)] == sum(getattr(t, field) for t in completed)
        for le in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000):
            bucket = got[(f"vllm:{name}_bucket", labelled(le=f"{le:.1f}"))]
            assert bucket == sum(getattr(t, field) <= le for t in completed), (name, le)
        assert (f"vllm:{name}_bucket", labelled(le="5000.0")) not in got  # past the model's context


def test_an_empty_pool_reads_as_no_usage():
    metrics = ServerMetrics(lambda: EngineStats(), "m", max_model_len=16)
    assert _samples(metrics)[("vllm:kv_cache_usage_perc", (("engine", "0"), ("model_name", "m")))] == 0.0
