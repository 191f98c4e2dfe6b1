"""Prometheus metrics: request latencies observed by the server, pool and queue sizes read
from the engine's stats at scrape time. Each app has its own registry. The numbers that vLLM also
exports go out under its names too (`vllm:...`, labelled with the served model and engine 0, as vLLM
labels them), so that dashboards and autoscalers written for vLLM read deltaserve as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from deltaserve.engine.async_engine import RequestTiming

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)

# name, help, stats field: gauges read from engine.stats()
_GAUGES = (
    ("deltaserve_requests_running", "Requests the engine is running.", "num_running"),
    ("deltaserve_requests_waiting", "Requests waiting in the engine's queue.", "num_waiting"),
    ("deltaserve_kv_blocks_used", "KV cache blocks in use.", "kv_blocks_used"),
    ("deltaserve_kv_blocks_total", "KV cache blocks in the pool.", "kv_blocks_total"),
    ("deltaserve_state_slots_used", "Recurrent-state slots in use.", "state_slots_used"),
    ("deltaserve_state_slots_total", "Recurrent-state slots in the pool.", "state_slots_total"),
    ("deltaserve_snapshot_slots_used", "Prefix-cache state snapshot slots in use.", "snapshot_slots_used"),
    ("deltaserve_snapshot_slots_total", "Prefix-cache state snapshot slots in the pool.", "snapshot_slots_total"),
    ("deltaserve_prefix_cache_hit_rate", "Share of looked-up prompt tokens found in the prefix cache.",
     "prefix_cache_hit_rate"),
)
_COUNTERS = (
    ("deltaserve_prompt_tokens", "Prompt tokens processed.", "prompt_tokens_total"),
    ("deltaserve_generation_tokens", "Tokens generated.", "generation_tokens_total"),
    ("deltaserve_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
    ("deltaserve_prefix_cache_hits", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
)


_VLLM_LABELS = ["model_name", "engine"]
_VLLM_GAUGES = (
    ("vllm:num_requests_running", "Requests the engine is running (vLLM's name).", "num_running"),
    ("vllm:num_requests_waiting", "Requests waiting in the engine's queue (vLLM's name).", "num_waiting"),
    ("vllm:kv_cache_usage_perc", "Share of the KV pool's blocks in use, 1 when full (vLLM's name).", "kv_cache_usage"),
)
_VLLM_COUNTERS = (
    ("vllm:prompt_tokens", "Prompt tokens processed (vLLM's name).", "prompt_tokens_total"),
    ("vllm:generation_tokens", "Tokens generated (vLLM's name).", "generation_tokens_total"),
    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache (vLLM's name).",
     "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (vLLM's name).", "prefix_cache_hits"),
    ("vllm:num_preemptions", "Requests preempted to free KV blocks (vLLM's name).", "num_preemptions"),
)
_FINISH_REASONS = ("stop", "length", "repetition", "abort", "error")
_COMPLETED = ("stop", "length", "repetition")  # requests that ran to an end of their own


class _EngineStatsCollector:
    def __init__(self, get_stats: Callable[[], Any], fallback: dict[str, float], model_name: str):
        self._get_stats = get_stats
        self._fallback = fallback
        self._vllm_labels = [model_name, "0"]

    def collect(self):
        stats = self._get_stats()
        yield from self._families(stats, _GAUGES, GaugeMetricFamily, [], [])
        yield from self._families(stats, _COUNTERS, CounterMetricFamily, [], [])
        yield from self._families(stats, _VLLM_GAUGES, GaugeMetricFamily, _VLLM_LABELS, self._vllm_labels)
        yield from self._families(stats, _VLLM_COUNTERS, CounterMetricFamily, _VLLM_LABELS, self._vllm_labels)

    def _families(self, stats, table, family_type, labels: list[str], label_values: list[str]):
        for name, doc, field in table:
            value = getattr(stats, field, None)
            if value is None and family_type is CounterMetricFamily:  # the tokens the server counted itself
                value = self._fallback.get(field)
            if value is not None:
                family = family_type(name, doc, labels=labels)
                family.add_metric(label_values, float(value))
                yield family


class ServerMetrics:
    def __init__(self, get_stats: Callable[[], Any], model_name: str = "deltaserve", max_model_len: int = 1 << 20):
        self.registry = CollectorRegistry()
        self._served_tokens = {"prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.registry.register(_EngineStatsCollector(get_stats, self._served_tokens, model_name))
        self.requests_finished = Counter(
            "deltaserve_requests_finished", "Requests finished, by reason.", ["reason"], registry=self.registry
        )
        self.requests_rejected = Counter(
            "deltaserve_requests_rejected", "Requests refused before reaching the engine, by reason.", ["reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "deltaserve_time_to_first_token_seconds", "Time from arrival to the first generated token.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.tpot = Histogram(
            "deltaserve_time_per_output_token_seconds", "Mean time per output token after the first, per request.",
            buckets=_TOKEN_BUCKETS, registry=self.registry,
        )
        self.e2e = Histogram(
            "deltaserve_e2e_request_latency_seconds", "Time from arrival to the last token.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        for reason in _FINISH_REASONS:
            self.requests_finished.labels(reason)
        self.vllm = _VllmRequestMetrics(self.registry, [model_name, "0"], max_model_len)

    def observe(self, timing: RequestTiming) -> None:
        self.requests_finished.labels(timing.finish_reason).inc()
        self._served_tokens["prompt_tokens_total"] += timing.prompt_tokens
        self._served_tokens["generation_tokens_total"] += timing.generation_tokens
        _observe((self.ttft, self.tpot, self.e2e), _latencies(timing))
        self.vllm.observe(timing)

    def count_refusal(self, exc: BaseException) -> None:
        """A request refused before reaching the engine (a full queue, a server stopping)."""
        self.requests_rejected.labels(type(exc).__name__).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _VllmRequestMetrics:
    """vLLM's per-request series: requests by finish reason, their latencies and token counts."""

    def __init__(self, registry: CollectorRegistry, labels: list[str], max_model_len: int):
        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc, _VLLM_LABELS, buckets=buckets, registry=registry).labels(*labels)

        success = Counter("vllm:request_success", "Requests finished, by reason (vLLM's name).",
                          _VLLM_LABELS + ["finished_reason"], registry=registry)
        self.finished = {reason: success.labels(*labels, reason) for reason in _FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Time from arrival to the first generated token (vLLM's name).", _LATENCY_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request (vLLM's name).", _TOKEN_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token (vLLM's name).",
                             _LATENCY_BUCKETS)
        counts = _one_two_five(max_model_len)
        self.prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens per completed request "
                                       "(vLLM's name).", counts)
        self.generation_tokens = histogram("vllm:request_generation_tokens", "Tokens generated per completed "
                                           "request, the longest of its samples (vLLM's name).", counts)

    def observe(self, timing: RequestTiming) -> None:
        self.finished[timing.finish_reason].inc()
        _observe((self.ttft, self.tpot, self.e2e), _latencies(timing))
        if timing.finish_reason in _COMPLETED:
            self.prompt_tokens.observe(timing.prompt_tokens)
            self.generation_tokens.observe(timing.generation_tokens)


def _latencies(timing: RequestTiming) -> tuple[float | None, float | None, float | None]:
    """Time to the first token, mean time per output token after it, and end to end (where the request
    completed); None where a request has none."""
    ttft = tpot = e2e = None
    if timing.first_token is not None:
        ttft = timing.first_token - timing.arrival
        if timing.generation_tokens > 1:
            tpot = (timing.finished - timing.first_token) / (timing.generation_tokens - 1)
    if timing.finish_reason in _COMPLETED:
        e2e = timing.finished - timing.arrival
    return ttft, tpot, e2e


def _observe(histograms, values) -> None:
    for histogram, value in zip(histograms, values):
        if value is not None:
            histogram.observe(value)


def _one_two_five(limit: int) -> list[int]:
    """Token-count buckets 1, 2, 5, 10, 20, 50, ... up to the model's context."""
    buckets, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return buckets
            buckets.append(step * scale)
        scale *= 10
