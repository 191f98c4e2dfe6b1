"""vLLM's tokens in, tokens out (/inference/v1/generate) and the render routes that write its requests: a
chat or completion rendered and then generated gives the tokens and logprobs the route itself gives."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.server.conftest import MODEL

pytestmark = pytest.mark.timeout(300)


def _post(server, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers, timeout=timeout)


def _question() -> list[dict]:
    return [{"role": "user", "content": random.choice(["What is the capital of France?", "Name a red fruit.",
                                                        "Count to five.", "Say hello in Spanish."])}]


def test_a_rendered_chat_generates_the_chats_own_tokens(server):
    chat = {"model": MODEL, "messages": _question(), "max_tokens": 12, "temperature": 0.8,
            "seed": random.randrange(10**6), "logprobs": True, "top_logprobs": 2}
    rendered = _post(server, "/v1/chat/completions/render", chat)
    assert rendered.status_code == 200, rendered.text
    body = rendered.json()
    tokenized = _post(server, "/tokenize", {"model": MODEL, "messages": chat["messages"]}).json()["tokens"]
    assert body["token_ids"] == tokenized
    assert body["sampling_params"]["max_tokens"] == 12 and body["sampling_params"]["logprobs"] == 2
    generated = _post(server, "/inference/v1/generate", body)
    assert generated.status_code == 200, generated.text
    choice = generated.json()["choices"][0]
    direct = _post(server, "/v1/chat/completions", {**chat, "return_token_ids": True}).json()["choices"][0]
    assert choice["token_ids"] == direct["token_ids"]  # the same seed draws the same tokens
    assert choice["finish_reason"] == direct["finish_reason"]
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    for mine, theirs in zip(content, direct["logprobs"]["content"]):
        assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=1e-4)
        # vLLM's shape: the first two entries, the chosen token's first
        assert len(mine["top_logprobs"]) == 2 and mine["top_logprobs"][0]["token"] == mine["token"]


def test_generate_streams_the_whole_replys_tokens(server):
    body = {"token_ids": [random.randrange(100, 5000) for _ in range(random.randint(3, 12))],
            "sampling_params": {"max_tokens": 9, "temperature": 0, "ignore_eos": True, "n": 2}}
    whole = _post(server, "/inference/v1/generate", {**body, "stream_options": {"include_usage": True}}).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    streamed: dict[int, list[int]] = {0: [], 1: []}
    reasons, usage = {}, None
    with httpx.stream("POST", server.url + "/inference/v1/generate", headers=server.headers, timeout=120,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for c in chunk["choices"]:
                    streamed[c["index"]] += c["token_ids"]
                    reasons[c["index"]] = c["finish_reason"] or reasons.get(c["index"])
    assert streamed == {c["index"]: c["token_ids"] for c in whole["choices"]}
    assert all(len(ids) == 9 for ids in streamed.values()) and reasons == {0: "length", 1: "length"}
    assert usage["prompt_tokens"] == len(body["token_ids"]) and usage["completion_tokens"] == 18


def test_a_rendered_completion_is_one_request_a_prompt(server):
    prompts = [f"Tell me about {random.choice(['cats', 'rivers', 'stars'])}", "Once upon a time"]
    rendered = _post(server, "/v1/completions/render", {"model": MODEL, "prompt": prompts, "max_tokens": 4,
                                                        "temperature": 0, "stop": ["."], "top_k": 5})
    assert rendered.status_code == 200, rendered.text
    bodies = rendered.json()
    assert [b["token_ids"] for b in bodies] == [
        _post(server, "/tokenize", {"model": MODEL, "prompt": p}).json()["tokens"] for p in prompts]
    assert len({b["request_id"] for b in bodies}) == 2
    for body, prompt in zip(bodies, prompts):
        assert body["sampling_params"]["stop"] == ["."] and body["sampling_params"]["top_k"] == 5
        out = _post(server, "/inference/v1/generate", body).json()["choices"][0]
        direct = _post(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4,
                                                   "temperature": 0, "stop": ["."], "return_token_ids": True})
        assert out["token_ids"] == direct.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("body, param", [
    ({"token_ids": [5], "sampling_params": {"max_tokens": 2, "best_of_all": 3}}, "sampling_params.best_of_all"),
    ({"token_ids": [5], "sampling_params": {"temperature": -1}}, "temperature"),
    ({"token_ids": [5, 10**8], "sampling_params": {}}, "token_ids"),
    ({"token_ids": [], "sampling_params": {}}, "token_ids"),
    ({"token_ids": [5], "sampling_params": {"max_tokens": 10**8}}, "token_ids"),
    ({"token_ids": [5], "features": {"mm_hashes": {}}, "sampling_params": {}}, "features"),
    ({"token_ids": [5], "sampling_params": {"n": 10**6}}, "sampling_params.n"),
    ({"token_ids": [5]}, "sampling_params"),  # required, as vLLM's
])
def test_what_generate_cannot_take_is_named(server, body, param):
    r = _post(server, "/inference/v1/generate", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_request_id_in_flight_is_refused_and_the_first_runs_on(server):
    own = f"mine-{random.randrange(10**9)}"
    body = {"request_id": own, "token_ids": [5, 6, 7], "stream": True,
            "sampling_params": {"max_tokens": 200, "ignore_eos": True, "temperature": 0}}
    with httpx.stream("POST", server.url + "/inference/v1/generate", json=body, headers=server.headers,
                      timeout=120) as first:
        lines = first.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        again = _post(server, "/inference/v1/generate", {**body, "stream": False})
        assert again.status_code == 400 and again.json()["error"]["code"] == "duplicate_request_id", again.text
        tokens = sum(len(json.loads(line[6:])["choices"][0]["token_ids"]) for line in lines
                     if line.startswith("data: {"))
    assert tokens == 199


def test_render_refuses_a_beam_search(server):
    r = _post(server, "/v1/chat/completions/render", {"model": MODEL, "messages": _question(), "n": 2,
                                                      "use_beam_search": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search", r.text
