"""vLLM's /start_profile and /stop_profile: where --profiler-config names a profiler, they trace the engine's steps
between them; without it they are not there."""

from __future__ import annotations

import glob

import httpx
import pytest

from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(300)


def test_the_profile_routes_trace_the_steps_between_them(tmp_path):
    folder = tmp_path / "server_traces"
    live = LiveServer("--profiler-config.profiler", "torch", "--profiler-config.torch_profiler_dir", str(folder))
    try:
        assert httpx.post(live.url + "/start_profile", timeout=60).status_code == 200
        r = httpx.post(live.base_url + "/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200
        assert httpx.post(live.url + "/stop_profile", timeout=120).status_code == 200
        assert len(glob.glob(str(folder / "deltaserve_*.pt.trace.json.gz"))) == 1
        assert live.stop() == 0
    finally:
        live.cleanup()


def test_without_a_profiler_there_are_no_profile_routes(server):
    for route in ("/start_profile", "/stop_profile"):
        assert httpx.post(server.url + route, headers=server.headers, timeout=60).status_code == 404
