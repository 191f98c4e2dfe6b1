"""vLLM's development routes, on a server started with VLLM_SERVER_DEV_MODE=1 (or DELTASERVE_SERVER_DEV_MODE)."""

import os
import random

import httpx
import pytest

from tests.checkpoints import make_checkpoint
from tests.server.conftest import API_KEY, serving
from tests.server.live_server import LiveServer


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory):
    path = make_checkpoint("qwen3.5", str(tmp_path_factory.mktemp("dev")))
    name = random.choice(["VLLM_SERVER_DEV_MODE", "DELTASERVE_SERVER_DEV_MODE"])
    os.environ[name] = "1"
    try:
        live = LiveServer(path, "--max-model-len", "512", "--served-model-name", "dev")
    finally:
        del os.environ[name]
    yield from serving(live)


def cached_tokens(live, prompt: list[int]) -> int:
    body = {"model": "dev", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    r = httpx.post(live.base_url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_reset_prefix_cache_forgets_what_was_cached(dev_server):
    prompt = [random.randrange(300) for _ in range(random.randint(40, 120))]
    assert cached_tokens(dev_server, prompt) == 0
    assert cached_tokens(dev_server, prompt) > 0
    r = httpx.post(dev_server.url + "/reset_prefix_cache", timeout=60)
    assert r.status_code == 200 and r.content == b""
    assert cached_tokens(dev_server, prompt) == 0
    for flag in ("reset_running_requests", "reset_external"):
        r = httpx.post(dev_server.url + f"/reset_prefix_cache?{flag}=true", timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == flag, r.text


def test_without_dev_mode_there_is_no_reset_route(server):
    r = httpx.post(server.url + "/reset_prefix_cache", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 404, r.text
