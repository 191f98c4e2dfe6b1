"""--max-queue refuses with 503 + Retry-After; SIGTERM ends in-flight streams with an error
event and the process exits cleanly. One server of its own (one sequence at a time)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import signal
import threading
import time

import httpx
import pytest

from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(400)

LONG = {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def small_server():
    live = LiveServer("--max-num-seqs", "1", "--max-queue", "1")
    try:
        yield live
    finally:
        live.cleanup()


class _Reader(threading.Thread):
    """Reads one SSE stream in the background, keeping its data events."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.events: list[str] = []
        self.status: int | None = None
        self.first_event = threading.Event()
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json=LONG, timeout=120) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data:"):
                    self.events.append(line[5:].strip())
                    self.first_event.set()
        self.first_event.set()


def test_the_prompts_and_choices_of_one_request_do_not_refuse_each_other(small_server):
    """--max-queue 1 on an idle server: a request of several prompts (each choice n of them) is admitted once,
    and queued whole."""
    prompts = ["Hi"] * random.randint(3, 5)
    done = httpx.post(small_server.url + "/v1/completions", json={"prompt": prompts, "max_tokens": 2, "n": 2},
                      timeout=120)
    assert done.status_code == 200, done.text
    assert len(done.json()["choices"]) == 2 * len(prompts)
    chat = httpx.post(small_server.url + "/v1/chat/completions", timeout=120,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 3})
    assert chat.status_code == 200, chat.text
    assert small_server.metrics().get('deltaserve_requests_rejected_total{reason="QueueFullError"}', 0) == 0


def test_requests_that_come_at_once_count_as_running_up_to_max_num_seqs(small_server):
    """--max-num-seqs 1 --max-queue 1 on an idle server: two requests sent at once are one running and one
    waiting, though the engine's stats, from its last step, still say none runs."""
    def post(_):
        return httpx.post(small_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        statuses = [r.status_code for r in pool.map(post, range(2))]
    assert statuses == [200, 200]


def test_queue_limit_then_clean_shutdown(small_server):
    running = _Reader(small_server.url)
    assert running.first_event.wait(120) and running.status == 200
    queued = _Reader(small_server.url)  # waits for the one sequence slot
    deadline = time.monotonic() + 30
    while small_server.metrics()["deltaserve_requests_waiting"] < 1:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.1)

    refused = httpx.post(small_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "queue_full"
    assert running.is_alive() and queued.is_alive()
    rejected = small_server.metrics()['deltaserve_requests_rejected_total{reason="QueueFullError"}']
    assert rejected == 1  # counted once

    start = time.monotonic()
    assert small_server.stop(signal.SIGTERM, timeout=30) == 0
    assert time.monotonic() - start < 20
    for reader in (running, queued):
        reader.join(10)
        assert not reader.is_alive()
        assert reader.events[-1] == "[DONE]"
        error = json.loads(reader.events[-2])["error"]
        assert error["code"] == "shutting_down"
    assert len(running.events) > 3  # it had been streaming text before the shutdown
    log = small_server.read_log()
    assert "Traceback" not in log, log
