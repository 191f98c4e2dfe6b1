"""vLLM's /v1/chat/completions/batch: choice i answers conversation i as the chat route answers it alone, the
usage is their sum, and what the route does not take is refused by name."""

from __future__ import annotations

import random

import httpx
import pytest

from tests.server.conftest import MODEL

pytestmark = pytest.mark.timeout(300)

ASKS = ["What is the capital of France?", "Name a red fruit.", "Count to three.", "Say hello in Spanish.",
        "What colour is the sky?"]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": MODEL, **body}, headers=server.headers, timeout=120)


def test_each_conversation_is_answered_as_alone(server):
    conversations = [[{"role": "user", "content": ask}] for ask in random.sample(ASKS, 3)]
    conversations[1] = [{"role": "system", "content": "Answer in one word."}, *conversations[1]]
    fields = {"max_tokens": random.randint(4, 10), "temperature": 0, "logprobs": True, "top_logprobs": 1,
              "return_token_ids": True}
    r = _post(server, "/chat/completions/batch", {"messages": conversations, **fields})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["object"] == "chat.completion" and [c["index"] for c in reply["choices"]] == [0, 1, 2]
    alone = [_post(server, "/chat/completions", {"messages": c, **fields}).json() for c in conversations]
    for choice, single in zip(reply["choices"], alone):
        assert choice["message"] == single["choices"][0]["message"]
        assert choice["token_ids"] == single["choices"][0]["token_ids"]
        assert choice["prompt_token_ids"] == single["prompt_token_ids"]
        assert choice["finish_reason"] == single["choices"][0]["finish_reason"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert reply["usage"][key] == sum(single["usage"][key] for single in alone)


def test_unset_sampling_fields_take_vllms_batch_defaults(server):
    """vLLM's batch request stands its own defaults (temperature 0.7, the others neutral) over the generation
    config's: the same seed draws what a chat at those values draws."""
    conversation = [{"role": "user", "content": random.choice(ASKS)}]
    seed = random.randrange(10**6)
    batch = _post(server, "/chat/completions/batch", {"messages": [conversation], "max_tokens": 12, "seed": seed,
                                                       "return_token_ids": True}).json()
    chat = _post(server, "/chat/completions", {"messages": conversation, "max_tokens": 12, "seed": seed,
                                               "temperature": 0.7, "top_p": 1.0, "return_token_ids": True}).json()
    assert batch["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]


@pytest.mark.parametrize("body, param", [
    ({"messages": [[{"role": "user", "content": "hi"}]], "stream": True}, "stream"),
    ({"messages": [[{"role": "user", "content": "hi"}]], "n": 2}, "n"),
    ({"messages": [[{"role": "user", "content": "hi"}]], "use_beam_search": True}, "use_beam_search"),
    ({"messages": [[{"role": "user", "content": "hi"}]],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [[{"role": "user", "content": "hi"}]], "max_tokens": 10**8}, "messages"),
])
def test_what_the_batch_route_does_not_take_is_named(server, body, param):
    r = _post(server, "/chat/completions/batch", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
