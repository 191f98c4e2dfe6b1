"""vLLM's priority field on the OpenAI routes: served by it under --scheduling-policy priority, refused by name
(other than 0) without it. Its own server on a tiny checkpoint, one sequence at a time."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from tests.checkpoints import make_checkpoint
from tests.server.conftest import serving
from tests.server.live_server import LiveServer

MODEL = "prio"
ROUTES = {"/v1/completions": {"prompt": "Hi", "max_tokens": 2},
          "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
          "/v1/responses": {"input": "Hi", "max_output_tokens": 2}}


@pytest.fixture(scope="module")
def priority_server(tmp_path_factory):
    path = make_checkpoint("qwen3.5", str(tmp_path_factory.mktemp("priority")))
    yield from serving(LiveServer(path, "--max-model-len", "512", "--served-model-name", MODEL, "--max-num-seqs", "1",
                                  "--scheduling-policy", "priority"))


@pytest.mark.parametrize("path", list(ROUTES))
def test_priority_is_taken_with_the_flag(priority_server, path):
    r = httpx.post(priority_server.url + path, json={**ROUTES[path], "priority": random.choice([-3, 1, 7])},
                   timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", list(ROUTES))
def test_without_the_flag_priority_is_refused_by_name(server, path):
    body = {**ROUTES[path], "model": "smollm2"}
    r = httpx.post(server.url + path, json={**body, "priority": random.choice([-3, 1, 7])}, headers=server.headers,
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    assert "--scheduling-policy priority" in r.json()["error"]["message"]
    assert httpx.post(server.url + path, json={**body, "priority": 0}, headers=server.headers,
                      timeout=60).status_code == 200


class _Completion(threading.Thread):
    """One completion in the background; `finished` (shared) gets its name when its reply is read whole."""

    def __init__(self, url: str, name: str, priority: int, finished: list[str], max_tokens: int = 4):
        super().__init__(daemon=True)
        self.body = {"prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True, "priority": priority}
        self.url, self.name, self.finished = url, name, finished
        self.status: int | None = None
        self.start()

    def run(self) -> None:
        r = httpx.post(self.url + "/v1/completions", json=self.body, timeout=120)
        self.status = r.status_code
        self.finished.append(self.name)


def _wait_for_load(url: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while httpx.get(url + "/load", timeout=10).json()["server_load"] < count:
        assert time.monotonic() < deadline, f"the engine never held {count} requests"
        time.sleep(0.02)


def test_a_later_request_of_higher_priority_runs_before_an_earlier_one(priority_server):
    """One sequence at a time, busy with a stream of four long prompts: a request of priority 5 comes, then one of
    -5; the stream is closed (its prompts aborted), and the later, higher one runs first."""
    url, finished = priority_server.url, []
    body = {"prompt": ["Once"] * 4, "max_tokens": 480, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as busy:
        lines = busy.iter_lines()  # held: a dropped iterator closes the stream
        next(line for line in lines if line.startswith("data:"))  # the first runs, three wait
        low = _Completion(url, "low", 5, finished)
        _wait_for_load(url, 5)
        high = _Completion(url, "high", -5, finished)
        _wait_for_load(url, 6)
    low.join(120)
    high.join(120)
    assert low.status == high.status == 200
    assert finished == ["high", "low"]
