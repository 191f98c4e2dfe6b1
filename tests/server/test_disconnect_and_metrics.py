"""A client that goes away aborts its request: blocks and slots return to the pools (/metrics)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import MODEL

pytestmark = pytest.mark.timeout(300)

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


def _wait_for_idle_pools(server, timeout=20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m["deltaserve_kv_blocks_used"] == 0 and m["deltaserve_requests_running"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"pools not released: {m}")
        time.sleep(0.2)


def test_disconnect_mid_stream_frees_blocks_and_slots(server):
    before = _wait_for_idle_pools(server)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", server.base_url + "/completions", json={**LONG, "stream": True},
                           headers=server.headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept open: leaving a loop over it would close the connection
            chunks = 0
            while chunks < 3:
                chunks += next(lines).startswith("data:")
            busy = server.metrics()
            assert busy["deltaserve_kv_blocks_used"] > 0
            assert busy["deltaserve_requests_running"] == 1
        # leaving the block closes the connection mid-stream
    after = _wait_for_idle_pools(server)
    assert after["deltaserve_state_slots_used"] == 0
    assert after['deltaserve_requests_finished_total{reason="abort"}'] == \
        before['deltaserve_requests_finished_total{reason="abort"}'] + 1
    assert after["deltaserve_generation_tokens_total"] - before["deltaserve_generation_tokens_total"] < 400


def test_disconnect_while_waiting_for_a_whole_response(server):
    before = _wait_for_idle_pools(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/completions", json=LONG, headers=server.headers, timeout=2.0)
    after = _wait_for_idle_pools(server)
    assert after['deltaserve_requests_finished_total{reason="abort"}'] == \
        before['deltaserve_requests_finished_total{reason="abort"}'] + 1
    assert after["deltaserve_generation_tokens_total"] - before["deltaserve_generation_tokens_total"] < 400


def test_metrics_after_traffic(server):
    """The series after a request (the vLLM series that count each of n samples compared by what this request
    added, since earlier tests may have sent n > 1)."""
    vllm = {("model_name", MODEL), ("engine", "0")}  # the first served name
    successes = ("vllm:request_success_total", frozenset(vllm | {("finished_reason", "length")}))
    finished = ("deltaserve_requests_finished_total", frozenset({("reason", "length")}))
    before = server.labelled_metrics()
    r = httpx.post(server.base_url + "/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200
    m = server.metrics()
    assert m["deltaserve_kv_blocks_total"] == 256
    assert m["deltaserve_prompt_tokens_total"] > 0 and m["deltaserve_generation_tokens_total"] >= 4
    assert m['deltaserve_requests_finished_total{reason="length"}'] >= 1
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert m[f"deltaserve_{histogram}_count"] >= 1
        assert m[f'deltaserve_{histogram}_bucket{{le="+Inf"}}'] == m[f"deltaserve_{histogram}_count"]
    assert "deltaserve_requests_waiting" in m and "deltaserve_state_slots_total" in m
    labelled = server.labelled_metrics()
    assert labelled[("vllm:prompt_tokens_total", frozenset(vllm))] == labelled[("deltaserve_prompt_tokens_total",
                                                                                 frozenset())]
    assert labelled[successes] - before.get(successes, 0) == labelled[finished] - before.get(finished, 0) == 1
    assert labelled[("vllm:kv_cache_usage_perc", frozenset(vllm))] == \
        labelled[("deltaserve_kv_blocks_used", frozenset())] / 256
    # vLLM's HTTP series: the completion above among them, the probes that read /metrics left out
    assert labelled[("http_requests_total", frozenset({("handler", "/v1/completions"), ("method", "POST"),
                                                       ("status", "2xx")}))] >= 1
    handlers = {dict(labels).get("handler") for name, labels in labelled if name == "http_requests_total"}
    assert not handlers & {"/metrics", "/health"}


def test_vllms_series_count_each_of_n_samples(server):
    # as vLLM's: a request of n samples is n finished requests in its request series, one request in its n series,
    # and every token after a sample's first is one inter-token gap
    vllm = {("model_name", MODEL), ("engine", "0")}

    def read() -> dict:
        return server.labelled_metrics()

    def value(got: dict, name: str, **labels) -> float:
        return got.get((name, frozenset(vllm | set(labels.items()))), 0.0)

    before = read()
    r = httpx.post(server.base_url + "/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL, "prompt": "Hello there", "max_tokens": 5, "n": 3, "ignore_eos": True})
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    after = read()
    assert value(after, "vllm:request_success_total", finished_reason="length") - \
        value(before, "vllm:request_success_total", finished_reason="length") == 3
    assert after[("deltaserve_requests_finished_total", frozenset({("reason", "length")}))] - \
        before[("deltaserve_requests_finished_total", frozenset({("reason", "length")}))] == 1
    for name, added in (("vllm:request_generation_tokens_count", 3), ("vllm:request_generation_tokens_sum", 15),
                        ("vllm:request_params_n_count", 1), ("vllm:request_params_n_sum", 3),
                        ("vllm:request_max_num_generation_tokens_sum", 5), ("vllm:request_params_max_tokens_sum", 3 * 5),
                        ("vllm:inter_token_latency_seconds_count", 3 * 4), ("vllm:request_decode_time_seconds_count", 3),
                        ("vllm:request_queue_time_seconds_count", 3)):
        assert value(after, name) - value(before, name) == added, name
    assert value(after, "vllm:iteration_tokens_total_count") - value(before, "vllm:iteration_tokens_total_count") >= 5
    # vLLM's iteration tokens: each token generated, and each sample's prompt tokens computed with its first
    assert value(after, "vllm:iteration_tokens_total_sum") - value(before, "vllm:iteration_tokens_total_sum") == \
        value(after, "vllm:request_prefill_kv_computed_tokens_sum") - \
        value(before, "vllm:request_prefill_kv_computed_tokens_sum") + 3 * 5
    info = [labels for name, labels in after if name == "vllm:cache_config_info"]
    assert len(info) == 1 and ("num_gpu_blocks", "256") in info[0] and ("block_size", "16") in info[0]
