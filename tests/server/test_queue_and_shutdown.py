"""--max-queue refuses with 503 + Retry-After; SIGTERM ends in-flight streams with an error
event and the process exits cleanly, or with --shutdown-timeout lets them finish for that long first. Servers
of their own (one sequence at a time)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import re
import signal
import threading
import time

import httpx
import pytest

from deltaserve.cli import _build_parser
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

    def __init__(self, url: str, body: dict = LONG):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.events: list[str] = []
        self.status: int | None = None
        self.first_event = threading.Event()
        self.ended: float | None = None  # time.monotonic() at the stream's end
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json=self.body, timeout=120) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data:"):
                    self.events.append(line[5:].strip())
                    self.first_event.set()
        self.ended = time.monotonic()
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


def _refused_while_stopping(url: str) -> httpx.Response:
    """A new request once the server has read the signal (it looks every 0.1 s): 503, shutting down."""
    deadline = time.monotonic() + 10
    while True:
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=30)
        if r.status_code == 503 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_shutdown_timeout_lets_the_requests_in_flight_finish():
    """vLLM's --shutdown-timeout: from SIGTERM on, new requests are refused while those in flight run to their
    end, and the server exits once none is left (long before the timeout)."""
    live = LiveServer("--shutdown-timeout", "120")
    try:
        running = _Reader(live.url, {**LONG, "max_tokens": random.randint(20, 40)})
        # a beam search too, which between two steps has no request in flight (its reply comes whole at the end)
        beams = _Reader(live.url, {**LONG, "max_tokens": random.randint(60, 80), "n": 2, "use_beam_search": True})
        assert running.first_event.wait(120) and running.status == 200
        start = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)
        refused = _refused_while_stopping(live.url)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down", refused.text
        assert httpx.get(live.url + "/health", timeout=30).status_code == 503
        assert live.proc.wait(90) == 0
        assert time.monotonic() - start < 90
        running.join(10)
        assert running.events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in running.events[:-1]]
        assert not [c for c in chunks if "error" in c], chunks[-3:]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        beams.join(30)
        assert beams.status == 200 and beams.events[-1] == "[DONE]", beams.events[-3:]
        beam_chunks = [json.loads(event) for event in beams.events[:-1]]
        assert not [c for c in beam_chunks if "error" in c], beam_chunks[-3:]
        assert {c["choices"][0]["index"] for c in beam_chunks if c["choices"][0]["finish_reason"]} == {0, 1}
        # the first refused request may have come in before the signal was read, and run to its end too
        assert re.search("waiting up to 120 s for [23] requests in flight", live.read_log())  # the search is one
        assert "Traceback" not in live.read_log()
    finally:
        live.cleanup()


def test_shutdown_timeout_ends_what_still_runs_when_it_is_up():
    """A request that cannot finish within the timeout (4000 tokens in 2 s) ends with the shutdown's error event
    once it is up, not at the signal."""
    live = LiveServer("--shutdown-timeout", "2", "--max-model-len", "4096", "--num-kv-blocks", "512")
    try:
        running = _Reader(live.url, {**LONG, "max_tokens": 4000})
        assert running.first_event.wait(120) and running.status == 200
        start = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)
        assert live.proc.wait(60) == 0
        running.join(10)
        assert 2 <= running.ended - start < 15
        assert running.events[-1] == "[DONE]"
        assert json.loads(running.events[-2])["error"]["code"] == "shutting_down"
        assert "Traceback" not in live.read_log()
    finally:
        live.cleanup()


def test_a_second_signal_ends_the_wait():
    """The requests in flight end at a second signal, whatever time the timeout leaves."""
    live = LiveServer("--shutdown-timeout", "120", "--max-model-len", "4096", "--num-kv-blocks", "512")
    try:
        running = _Reader(live.url, {**LONG, "max_tokens": 4000})
        assert running.first_event.wait(120) and running.status == 200
        live.proc.send_signal(signal.SIGTERM)
        assert _refused_while_stopping(live.url).status_code == 503  # the first was read: the wait began
        assert running.is_alive()
        start = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)  # (a second SIGINT is uvicorn's force quit, which skips the wait too)
        assert live.proc.wait(60) == 0
        running.join(10)
        assert running.ended - start < 15
        assert json.loads(running.events[-2])["error"]["code"] == "shutting_down"
    finally:
        live.cleanup()


def test_shutdown_timeout_is_whole_seconds_from_zero():
    parse = _build_parser().parse_args
    assert parse(["serve"]).shutdown_timeout == 0  # vLLM's default: requests in flight end at once
    assert parse(["serve", "--shutdown-timeout", "30"]).shutdown_timeout == 30
    for bad in ("-1", "1.5", "soon"):
        with pytest.raises(SystemExit):
            parse(["serve", "--shutdown-timeout", bad])
