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
from deltaserve.outputs import RequestStateStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets for the series of its names
_VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                      40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)
_VLLM_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                         240.0, 480.0, 960.0, 1920.0, 7680.0)
_VLLM_STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_VLLM_N_BUCKETS = (1, 2, 5, 10, 20)
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
_VLLM_SLEEP_STATES = (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0))  # this engine never sleeps
_VLLM_COUNTERS = (
    ("vllm:prompt_tokens", "Prompt tokens processed (vLLM's name).", "prompt_tokens_total"),
    ("vllm:prompt_tokens_cached", "Prompt tokens found in the prefix cache as their request started (vLLM's name).",
     "prompt_tokens_cached_total"),
    ("vllm:generation_tokens", "Tokens generated (vLLM's name).", "generation_tokens_total"),
    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache (vLLM's name).",
     "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (vLLM's name).", "prefix_cache_hits"),
    ("vllm:num_preemptions", "Requests preempted to free KV blocks (vLLM's name).", "num_preemptions"),
    ("vllm:spec_decode_num_drafts", "Verify chunks of speculative decoding (vLLM's name).", "spec_decode_num_drafts"),
    ("vllm:spec_decode_num_draft_tokens", "Draft tokens verified (vLLM's name).", "spec_decode_num_draft_tokens"),
    ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted (vLLM's name).",
     "spec_decode_num_accepted_tokens"),
)
_FINISH_REASONS = ("stop", "length", "repetition", "abort", "error")
_COMPLETED = ("stop", "length", "repetition")  # requests that ran to an end of their own


class _EngineStatsCollector:
    def __init__(self, get_stats: Callable[[], Any], fallback: dict[str, float], model_name: str,
                 cache_info: dict[str, str]):
        self._get_stats = get_stats
        self._fallback = fallback
        self._vllm_labels = [model_name, "0"]
        self._cache_info = cache_info

    def collect(self):
        stats = self._get_stats()
        yield from self._families(stats, _GAUGES, GaugeMetricFamily, [], [])
        yield from self._families(stats, _COUNTERS, CounterMetricFamily, [], [])
        yield from self._families(stats, _VLLM_GAUGES, GaugeMetricFamily, _VLLM_LABELS, self._vllm_labels)
        yield from self._families(stats, _VLLM_COUNTERS, CounterMetricFamily, _VLLM_LABELS, self._vllm_labels)
        yield from self._vllm_labelled_families(stats)

    def _vllm_labelled_families(self, stats):
        total, cached = (getattr(stats, f, None) for f in ("prompt_tokens_total", "prompt_tokens_cached_total"))
        if total is not None and cached is not None:
            family = CounterMetricFamily("vllm:prompt_tokens_by_source", "Prompt tokens by where they came from: "
                                         "computed, or found in the prefix cache (vLLM's name).",
                                         labels=_VLLM_LABELS + ["source"])
            for source, value in (("local_compute", total - cached), ("local_cache_hit", cached),
                                  ("external_kv_transfer", 0)):
                family.add_metric(self._vllm_labels + [source], float(value))
            yield family
        waiting = getattr(stats, "num_waiting", None)
        if waiting is not None:
            family = GaugeMetricFamily("vllm:num_requests_waiting_by_reason", "Waiting requests by why they wait: "
                                       "capacity, or deferred (vLLM's name).", labels=_VLLM_LABELS + ["reason"])
            for reason, value in (("capacity", waiting), ("deferred", 0)):  # nothing here defers a request
                family.add_metric(self._vllm_labels + [reason], float(value))
            yield family
        per_position = getattr(stats, "spec_decode_accepted_per_position", None)
        if per_position:
            family = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at "
                                         "each draft position (vLLM's name).", labels=_VLLM_LABELS + ["position"])
            for position, value in enumerate(per_position):
                family.add_metric(self._vllm_labels + [str(position)], float(value))
            yield family
        family = GaugeMetricFamily("vllm:engine_sleep_state", "1 for the engine's sleep state, awake here "
                                   "(vLLM's name).", labels=_VLLM_LABELS + ["sleep_state"])
        for state, value in _VLLM_SLEEP_STATES:
            family.add_metric(self._vllm_labels + [state], float(value))
        yield family
        if self._cache_info:
            family = GaugeMetricFamily("vllm:cache_config_info", "The KV cache's configuration, in its labels "
                                       "(vLLM's name).", labels=list(self._cache_info))
            family.add_metric(list(self._cache_info.values()), 1.0)
            yield family

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
    def __init__(self, get_stats: Callable[[], Any], model_name: str = "deltaserve", max_model_len: int = 1 << 20,
                 cache_info: dict[str, str] | None = None):
        """cache_info: the labels of vllm:cache_config_info (the engine's cache_config_info())."""
        self.registry = CollectorRegistry()
        self._served_tokens = {"prompt_tokens_total": 0, "generation_tokens_total": 0}
        self.registry.register(_EngineStatsCollector(get_stats, self._served_tokens, model_name, cache_info or {}))
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

    def observe_step(self, step) -> None:
        """An engine step's StepStats (llm_engine.StepStats), on the engine's thread."""
        self.vllm.observe_step(step)

    def count_refusal(self, exc: BaseException) -> None:
        """A request refused before reaching the engine (a full queue, a server stopping)."""
        self.requests_rejected.labels(type(exc).__name__).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _VllmRequestMetrics:
    """vLLM's per-request series. As vLLM's, each of a request's n samples counts as a finished request of its own
    (its finish reason, latencies, token counts), and the request as a whole gives the n and max_tokens it asked
    for and its longest sample. A request the engine did not finish is seen from its stream: one that failed counts
    once, and one its client left counts nowhere but in the time to its first token, as vLLM counts neither the
    request nor its latencies where the client aborts."""

    def __init__(self, registry: CollectorRegistry, labels: list[str], max_model_len: int):
        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(name, doc + " (vLLM's name).", _VLLM_LABELS, buckets=buckets,
                             registry=registry).labels(*labels)

        success = Counter("vllm:request_success", "Requests finished, by reason (vLLM's name).",
                          _VLLM_LABELS + ["finished_reason"], registry=registry)
        self.finished = {reason: success.labels(*labels, reason) for reason in _FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first generated token",
                              _VLLM_TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a sequence",
                             _VLLM_TOKEN_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request", _VLLM_TOKEN_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last token",
                             _VLLM_REQUEST_BUCKETS)
        self.phases = (  # (histogram, the RequestStateStats property it observes)
            (histogram("vllm:request_queue_time_seconds", "Time waiting for the first step", _VLLM_REQUEST_BUCKETS),
             "queued_time"),
            (histogram("vllm:request_inference_time_seconds", "Time from the first step to the last token",
                       _VLLM_REQUEST_BUCKETS), "inference_time"),
            (histogram("vllm:request_prefill_time_seconds", "Time from the first step to the first token",
                       _VLLM_REQUEST_BUCKETS), "prefill_time"),
            (histogram("vllm:request_decode_time_seconds", "Time from the first token to the last",
                       _VLLM_REQUEST_BUCKETS), "decode_time"),
        )
        counts = _one_two_five(max_model_len)
        self.prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens per completed request", counts)
        self.prefill_computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                          "Prompt tokens computed per completed request, those not found in the "
                                          "prefix cache", counts)
        self.generation_tokens = histogram("vllm:request_generation_tokens", "Tokens generated per completed "
                                           "request", counts)
        self.max_generation_tokens = histogram("vllm:request_max_num_generation_tokens", "Tokens of the longest "
                                               "sample per completed request", counts)
        self.params_n = histogram("vllm:request_params_n", "The n of each completed request", _VLLM_N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens", "The max_tokens of each completed "
                                           "request that gave one", counts)
        self.step_tokens = histogram("vllm:iteration_tokens_total", "Tokens per engine step",
                                     _VLLM_STEP_TOKEN_BUCKETS)

    def observe(self, timing: RequestTiming) -> None:
        if not timing.samples:
            self._observe_from_stream(timing)
            return
        for reason, stats in timing.samples:
            self._observe_sample(timing, "error" if timing.finish_reason == "error" else reason, stats)
        if timing.finish_reason in _COMPLETED:  # the parent's own figures, once (vLLM's parallel sampling)
            self.max_generation_tokens.observe(timing.generation_tokens)
            self.params_n.observe(timing.n)

    def _observe_sample(self, timing: RequestTiming, reason: str, stats: RequestStateStats) -> None:
        self.finished[reason].inc()
        if stats.first_token_ts:
            self.ttft.observe(stats.first_token_ts - timing.arrival)
        if reason not in _COMPLETED:
            return
        self.e2e.observe((stats.last_token_ts or timing.finished) - timing.arrival)
        self.tpot.observe(stats.mean_time_per_output_token)  # 0.0 for a single token, as vLLM observes it
        for histogram, phase in self.phases:
            histogram.observe(getattr(stats, phase))
        self.prompt_tokens.observe(timing.prompt_tokens)
        self.prefill_computed.observe(timing.prompt_tokens - timing.num_cached_tokens)
        self.generation_tokens.observe(stats.num_generation_tokens)
        if timing.max_tokens:  # each sample is one of vLLM's finished requests, with the parent's max_tokens
            self.params_max_tokens.observe(timing.max_tokens)

    def _observe_from_stream(self, timing: RequestTiming) -> None:
        """A request that the engine gave no sample times for (its stream closed before its final output)."""
        ttft, tpot, e2e = _latencies(timing)
        if timing.finish_reason == "abort":  # its client left
            _observe((self.ttft,), (ttft,))
            return
        self.finished[timing.finish_reason].inc()
        if tpot is None and e2e is not None:  # completed on a single token: vLLM observes 0.0
            tpot = 0.0
        _observe((self.ttft, self.tpot, self.e2e), (ttft, tpot, e2e))
        if timing.finish_reason in _COMPLETED:
            self.prompt_tokens.observe(timing.prompt_tokens)
            self.generation_tokens.observe(timing.generation_tokens)

    def observe_step(self, step) -> None:
        if step.num_tokens is not None:
            self.step_tokens.observe(step.num_tokens)
        for latency in step.inter_token_latencies:
            self.itl.observe(latency)


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
