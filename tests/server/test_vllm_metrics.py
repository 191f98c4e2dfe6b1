"""/metrics carries vLLM's names for the numbers vLLM also exports, labelled with the served model and engine 0,
with the values of deltaserve's own series: a dashboard or autoscaler written for vLLM reads deltaserve."""

import math
import random

from prometheus_client.parser import text_string_to_metric_families

from deltaserve.engine.async_engine import RequestTiming
from deltaserve.engine.llm_engine import EngineStats, StepStats
from deltaserve.outputs import RequestStateStats
from deltaserve.server.metrics import ServerMetrics

COMPLETED = ("stop", "length", "repetition")


def _samples(metrics: ServerMetrics) -> dict[tuple, float]:
    """(sample name, labels as sorted pairs) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples}


def _random_timing(rng: random.Random, i: int) -> RequestTiming:
    arrival = rng.uniform(0, 100)
    first = None if rng.random() < 0.2 else arrival + rng.uniform(0.001, 3)
    finished = (first or arrival) + rng.uniform(0, 30)
    reason = rng.choice(["stop", "length", "abort", "error"])
    generated = 0 if first is None else rng.choice([1, rng.randint(2, 500)])
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
        assert got[("deltaserve_requests_finished_total", (("reason", reason),))] == \
            sum(t.finish_reason == reason for t in timings)
        # as vLLM's: a request whose client left ("abort" without the engine's final output) is not a finished one
        assert got[("vllm:request_success_total", labelled(finished_reason=reason))] == \
            (0 if reason == "abort" else sum(t.finish_reason == reason for t in timings))
    for ours, theirs in (("time_to_first_token_seconds", "time_to_first_token_seconds"),
                         ("e2e_request_latency_seconds", "e2e_request_latency_seconds")):
        for part in ("_count", "_sum"):
            assert got[(f"vllm:{theirs}{part}", vllm)] == got[(f"deltaserve_{ours}{part}", ())], theirs
    # the time per output token of a request its client left is deltaserve's alone
    tpots = [(t.finished - t.first_token) / (t.generation_tokens - 1) for t in timings
             if t.first_token is not None and t.generation_tokens > 1]
    # vLLM's observes every completed request, one of a single token as 0.0
    kept = [(t.finished - t.first_token) / (t.generation_tokens - 1) if t.generation_tokens > 1 else 0.0
            for t in timings if t.finish_reason in ("stop", "length")
            or (t.finish_reason == "error" and t.generation_tokens > 1)]
    assert got[("deltaserve_time_per_output_token_seconds_count", ())] == len(tpots)
    assert got[("vllm:request_time_per_output_token_seconds_count", vllm)] == len(kept)
    assert math.isclose(got[("vllm:request_time_per_output_token_seconds_sum", vllm)], sum(kept), abs_tol=1e-9)
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


def _random_sample(rng: random.Random, arrival: float) -> tuple[str, RequestStateStats]:
    queued = arrival + rng.uniform(0, 0.01)
    stats = RequestStateStats(arrival_time=1.7e9, queued_ts=queued, scheduled_ts=queued + rng.uniform(0, 5))
    if rng.random() < 0.9:
        stats.first_token_ts = stats.scheduled_ts + rng.uniform(0.001, 2)
        stats.num_generation_tokens = rng.choice([1, rng.randint(2, 600)])  # one token: TPOT 0.0
        stats.last_token_ts = stats.first_token_ts + (stats.num_generation_tokens - 1) * rng.uniform(0.001, 0.2)
    reason = rng.choice(["stop", "length", "repetition"] if stats.num_generation_tokens else ["abort"])
    return reason, stats


def _finished_timing(rng: random.Random, i: int) -> RequestTiming:
    """A request the engine finished: its samples' own times, as the engine's final output gives them."""
    arrival = rng.uniform(0, 100)
    samples = [_random_sample(rng, arrival) for _ in range(rng.randint(1, 4))]
    reason = "error" if rng.random() < 0.1 else next((r for r in ("length", "repetition") if r in
                                                       [r for r, _ in samples]), "stop")
    last = max(s.last_token_ts for _, s in samples)
    prompt = rng.randint(1, 3000)
    return RequestTiming(f"r{i}", reason, arrival=arrival, first_token=None, finished=max(last, arrival) + 0.001,
                         prompt_tokens=prompt, generation_tokens=max(s.num_generation_tokens for _, s in samples),
                         samples=samples, n=len(samples), max_tokens=rng.choice([None, rng.randint(1, 2000)]),
                         num_cached_tokens=rng.randint(0, prompt))


def test_vllms_request_series_count_each_sample_as_vllm_does():
    rng, model = random.Random(), "m"
    metrics = ServerMetrics(lambda: EngineStats(), model, max_model_len=4096)
    timings = [_finished_timing(rng, i) for i in range(rng.randint(5, 40))]
    for timing in timings:
        metrics.observe(timing)
    got, vllm = _samples(metrics), (("engine", "0"), ("model_name", model))
    samples = [("error" if t.finish_reason == "error" else r, s, t) for t in timings for r, s in t.samples]
    completed = [(s, t) for r, s, t in samples if r in COMPLETED]
    for reason in ("stop", "length", "repetition", "abort", "error"):
        assert got[("vllm:request_success_total", tuple(sorted(vllm + (("finished_reason", reason),))))] == \
            sum(r == reason for r, _, _ in samples), reason
    # deltaserve's own series count the request once
    assert sum(got[("deltaserve_requests_finished_total", (("reason", r),))] for r in ("stop", "length", "repetition",
                                                                                        "error")) == len(timings)

    def assert_observed(name: str, values: list[float]) -> None:
        assert got[(f"vllm:{name}_count", vllm)] == len(values), name
        assert math.isclose(got[(f"vllm:{name}_sum", vllm)], sum(values), rel_tol=1e-9, abs_tol=1e-9), name

    assert_observed("time_to_first_token_seconds", [s.first_token_ts - t.arrival for _, s, t in samples
                                                    if s.first_token_ts])
    assert_observed("e2e_request_latency_seconds", [s.last_token_ts - t.arrival for s, t in completed])
    assert_observed("request_queue_time_seconds", [s.scheduled_ts - s.queued_ts for s, _ in completed])
    assert_observed("request_prefill_time_seconds", [s.first_token_ts - s.scheduled_ts for s, _ in completed])
    assert_observed("request_decode_time_seconds", [s.last_token_ts - s.first_token_ts for s, _ in completed])
    assert_observed("request_inference_time_seconds", [s.last_token_ts - s.scheduled_ts for s, _ in completed])
    assert_observed("request_time_per_output_token_seconds",
                    [(s.last_token_ts - s.first_token_ts) / (s.num_generation_tokens - 1)
                     if s.num_generation_tokens > 1 else 0.0 for s, _ in completed])
    assert_observed("request_generation_tokens", [s.num_generation_tokens for s, _ in completed])
    assert_observed("request_prompt_tokens", [t.prompt_tokens for _, t in completed])
    assert_observed("request_prefill_kv_computed_tokens", [t.prompt_tokens - t.num_cached_tokens for _, t in completed])
    whole = [t for t in timings if t.finish_reason in COMPLETED]
    assert_observed("request_max_num_generation_tokens", [t.generation_tokens for t in whole])
    assert_observed("request_params_n", [t.n for t in whole])
    assert_observed("request_params_max_tokens", [t.max_tokens for _, t in completed if t.max_tokens])


def test_steps_give_vllms_iteration_tokens_and_inter_token_latencies():
    rng = random.Random()
    metrics = ServerMetrics(lambda: EngineStats(), "m", max_model_len=64)
    steps = [StepStats(rng.choice([None, rng.randint(1, 20000)]), [rng.uniform(0, 0.5) for _ in range(rng.randint(0, 9))])
             for _ in range(rng.randint(1, 50))]
    for step in steps:
        metrics.observe_step(step)
    got, vllm = _samples(metrics), (("engine", "0"), ("model_name", "m"))
    tokens = [s.num_tokens for s in steps if s.num_tokens is not None]
    gaps = [g for s in steps for g in s.inter_token_latencies]
    assert got[("vllm:iteration_tokens_total_count", vllm)] == len(tokens)
    assert got[("vllm:iteration_tokens_total_sum", vllm)] == sum(tokens)
    for le in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        assert got[("vllm:iteration_tokens_total_bucket", tuple(sorted(vllm + (("le", f"{le:.1f}"),))))] == \
            sum(t <= le for t in tokens)
    assert got[("vllm:inter_token_latency_seconds_count", vllm)] == len(gaps)
    assert math.isclose(got[("vllm:inter_token_latency_seconds_sum", vllm)], sum(gaps), abs_tol=1e-9)


def test_vllms_labelled_series():
    rng = random.Random()
    cached = rng.randint(0, 10**6)
    stats = EngineStats(num_waiting=rng.randint(0, 100), prompt_tokens_cached_total=cached,
                        prompt_tokens_total=cached + rng.randint(0, 10**6))
    info = {"block_size": str(rng.choice([16, 32])), "num_gpu_blocks": str(rng.randint(1, 10**5))}
    got = _samples(ServerMetrics(lambda: stats, "m", max_model_len=64, cache_info=info))
    vllm = (("engine", "0"), ("model_name", "m"))
    assert got[("vllm:num_requests_waiting_by_reason", vllm + (("reason", "capacity"),))] == stats.num_waiting
    assert got[("vllm:num_requests_waiting_by_reason", vllm + (("reason", "deferred"),))] == 0
    assert got[("vllm:engine_sleep_state", vllm + (("sleep_state", "awake"),))] == 1
    assert got[("vllm:engine_sleep_state", vllm + (("sleep_state", "weights_offloaded"),))] == 0
    assert got[("vllm:cache_config_info", tuple(sorted(info.items())))] == 1
    assert got[("vllm:prompt_tokens_cached_total", vllm)] == stats.prompt_tokens_cached_total
    by_source = {source: got[("vllm:prompt_tokens_by_source_total", vllm + (("source", source),))]
                 for source in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    assert by_source == {"local_compute": stats.prompt_tokens_total - stats.prompt_tokens_cached_total,
                         "local_cache_hit": stats.prompt_tokens_cached_total, "external_kv_transfer": 0}
