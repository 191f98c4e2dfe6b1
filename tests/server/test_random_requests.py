"""Random request bodies (chat, completions, Responses), mostly valid and some not, from many clients at once,
some of them going away mid-stream: every answer is a 200 or a 4xx that names the problem (a stream ends with
[DONE], or with the whole response), and afterwards the server holds nothing (KV blocks, running requests) and
answers as before. Each run draws new bodies."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import MODEL

pytestmark = pytest.mark.timeout(600)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


WRONG = [None, -1, 10**20, "x", [], {}, [1, "a"], 2.5, True]
# None is no wrong length but no limit at all: a reply sampled at temperature 1.5 may then run to the end of the
# context, minutes on a CPU, so the output's length is never left out
WRONG_LENGTHS = [value for value in WRONG if value is not None]


def _maybe_wrong(rng: random.Random, good, wrong=WRONG):
    """Mostly a good value; now and then one of the wrong type or out of range."""
    if rng.random() < 0.08:
        return rng.choice(wrong)
    return good


def _fields(rng: random.Random, chat: bool) -> dict:
    drawers = {
        "temperature": lambda: rng.choice([0.0, 0.7, 1.0, 1.5]),
        "top_p": lambda: rng.choice([0.5, 0.9, 1.0]),
        "top_k": lambda: rng.choice([-1, 1, 5, 40]),
        "min_p": lambda: rng.choice([0.0, 0.05, 0.2]),
        "n": lambda: rng.randint(1, 3),
        "seed": lambda: rng.randrange(1000),
        "stop": lambda: rng.choice(["\n", [".", ","], ["the"]]),
        "stop_token_ids": lambda: rng.sample(range(100, 2000), rng.randint(1, 3)),
        "presence_penalty": lambda: rng.choice([0.0, 0.5]),
        "frequency_penalty": lambda: rng.choice([0.0, 0.5]),
        "repetition_penalty": lambda: rng.choice([1.0, 1.2]),
        "logit_bias": lambda: {str(rng.randrange(2000)): rng.choice([-100, 5, 100])},
        "ignore_eos": lambda: rng.random() < 0.5,
        "min_tokens": lambda: rng.randint(0, 6),
        "allowed_token_ids": lambda: rng.sample(range(2000), rng.randint(1, 30)),
        "bad_words": lambda: rng.sample(["the", "a", "Paris", "is"], rng.randint(1, 2)),
        "structured_outputs": lambda: rng.choice([{"regex": "[a-z]{1,8}"}, {"choice": ["yes", "no"]},
                                                  {"json": SCHEMA}, {"grammar": 'root ::= "a" | "b"'}]),
        "logprobs": (lambda: rng.random() < 0.5) if chat else (lambda: rng.randint(0, 3)),
        "prompt_logprobs": lambda: rng.randint(0, 2),
    }
    if chat:
        formats = [{"type": "json_object"}, {"type": "text"},
                   {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}]
        drawers["response_format"] = lambda: rng.choice(formats)
    body = {name: _maybe_wrong(rng, draw()) for name, draw in drawers.items() if rng.random() < 0.12}
    body["max_tokens"] = _maybe_wrong(rng, rng.randint(1, 32), WRONG_LENGTHS)
    if isinstance(body.get("min_tokens"), int) and isinstance(body["max_tokens"], int):
        body["min_tokens"] = min(body["min_tokens"], max(body["max_tokens"], 0))
    return body


WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}


def _responses_body(rng: random.Random) -> dict:
    """A Responses API body: its own names for what chat's fields ask."""
    drawers = {
        "instructions": lambda: rng.choice(["Be brief.", "Answer in French."]),
        "temperature": lambda: rng.choice([0.0, 0.7, 1.0]),
        "top_p": lambda: rng.choice([0.5, 1.0]),
        "tools": lambda: [WEATHER],
        "tool_choice": lambda: rng.choice(["auto", "none", "required", {"type": "function", "name": "get_weather"}]),
        "text": lambda: rng.choice([{"format": {"type": "json_object"}}, {"format": {"type": "text"}}, {
            "format": {"type": "json_schema", "name": "s", "schema": SCHEMA}}]),
        "reasoning": lambda: {"effort": rng.choice(["low", "high"])},
    }
    body = {name: _maybe_wrong(rng, draw()) for name, draw in drawers.items() if rng.random() < 0.15}
    body["max_output_tokens"] = _maybe_wrong(rng, rng.randint(1, 32), WRONG_LENGTHS)
    body["input"] = rng.choice(["Hi", "Count to five.", [
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}]])
    return body


def _request(server, seed: int) -> tuple[int, str]:
    rng = random.Random(seed)
    route = rng.choices(["chat", "completions", "responses"], [0.5, 0.3, 0.2])[0]
    if route == "responses":
        body = {"model": MODEL, **_responses_body(rng), "stream": rng.random() < 0.5}
    else:
        body = {"model": MODEL, **_fields(rng, route == "chat"), "stream": rng.random() < 0.5}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": rng.choice(["Hi", "Count to five.", "Name a colour."])}]
    elif route == "completions":
        body["prompt"] = rng.choice(["Once upon a time", "1, 2, 3,", "The capital of France is"])
    url = server.url + {"chat": "/v1/chat/completions", "completions": "/v1/completions",
                        "responses": "/v1/responses"}[route]
    leaves_early = rng.random() < 0.3
    if not body["stream"]:
        r = httpx.post(url, json=body, timeout=120, headers=server.headers)
        return r.status_code, r.text
    with httpx.stream("POST", url, json=body, timeout=120, headers=server.headers) as r:
        lines = []
        for line in r.iter_lines():
            lines.append(line)
            if leaves_early and len(lines) > rng.randint(1, 8):
                return -1, ""  # the client went away mid-stream
        return r.status_code, "\n".join(lines)


def _gauges(server) -> dict:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("deltaserve_kv_blocks_used ", "deltaserve_requests_running "))}


def test_random_requests_are_answered_or_refused_by_name_and_leave_nothing_held(server):
    seeds = [random.randrange(2**32) for _ in range(48)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda seed: _request(server, seed), seeds))
    for seed, (status, text) in zip(seeds, answers):
        if status == -1:
            continue
        assert status in (200, 400), (seed, status, text[:500])
        if status == 400:
            error = json.loads(text)["error"]
            assert error["message"] and error["type"] == "invalid_request_error", (seed, text[:500])
        elif text.startswith("data:"):
            assert text.rstrip().endswith("data: [DONE]"), (seed, text[-500:])
        elif text.startswith("event:"):  # a Responses stream ends with the response, whole
            assert text.splitlines()[-1].startswith('data: {"type":"response.'), (seed, text[-500:])
            assert json.loads(text.splitlines()[-1][6:])["type"] in ("response.completed", "response.incomplete")
    assert sum(status == 200 for status, _ in answers) >= 12  # the draws are mostly valid
    for _ in range(50):  # a stream its client left may still be finishing its step
        if not any(_gauges(server).values()):
            break
        time.sleep(0.2)
    assert _gauges(server) == {"deltaserve_kv_blocks_used": 0.0, "deltaserve_requests_running": 0.0}
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                   timeout=60, headers=server.headers)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
