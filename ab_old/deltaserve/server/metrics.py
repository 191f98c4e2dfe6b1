"""Prometheus metrics: request latencies observed by the server, pool and queue sizes read
from the engine's stats at scrape time. Each app has its own registry."""

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


class _EngineStatsCollector:
    def __init__(self, get_stats: Callable[[], Any], fallback: dict[str, float]):
        self._get_stats = get_stats
        self._fallback = fallback

    def collect(self):
        stats = self._get_stats()
        for name, doc, field in _GAUGES:
            value = getattr(stats, field, None)
            if value is not None:
                family = GaugeMetricFamily(name, doc)
                family.add_metric([], float(value))
                yield family
        for name, doc, field in _COUNTERS:
            value = getattr(stats, field, None)
            if value is None:
                value = self._fallback.get(field)
            if value is not None:
                family = CounterMetricFamily(name, doc)
                family.add_metric([], float(value))
                yield family


class ServerMetrics:
    def __init__(self, get_stats: Callable[[], Any]):
        self.registry = CollectorRegistry()
        self._served_tokens = {"prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.registry.register(_EngineStatsCollector(get_stats, self._served_tokens))
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
        for reason in ("stop", "length", "abort", "error"):
            self.requests_finished.labels(reason)

    def observe(self, timing: RequestTiming) -> None:
        self.requests_finished.labels(timing.finish_reason).inc()
        self._served_tokens["prompt_tokens_total"] += timing.prompt_tokens
        self._served_tokens["generation_tokens_total"] += timing.generation_tokens
        if timing.first_token is not None:
            self.ttft.observe(timing.first_token - timing.arrival)
            if timing.generation_tokens > 1:
                self.tpot.observe((timing.finished - timing.first_token) / (timing.generation_tokens - 1))
        if timing.finish_reason in ("stop", "length"):
            self.e2e.observe(timing.finished - timing.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)
