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
    labelled, vllm = server.labelled_metrics(), {("model_name", MODEL), ("engine", "0")}  # the first served name
    assert labelled[("vllm:prompt_tokens_total", frozenset(vllm))] == labelled[("deltaserve_prompt_tokens_total",
                                                                                 frozenset())]
    assert labelled[("vllm:request_success_total", frozenset(vllm | {("finished_reason", "length")}))] == \
        labelled[("deltaserve_requests_finished_total", frozenset({("reason", "length")}))]
    assert labelled[("vllm:kv_cache_usage_perc", frozenset(vllm))] == \
        labelled[("deltaserve_kv_blocks_used", frozenset())] / 256
