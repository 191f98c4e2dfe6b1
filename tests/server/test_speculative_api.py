"""A server started with vLLM's --speculative-config drafts with the checkpoint's MTP head: its greedy completions,
streamed or whole, penalised or under a grammar, are the offline engine's plain greedy ones, and /metrics counts
the drafts it verified."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from deltaserve import LLM, SamplingParams
from tests.checkpoints import VOCAB, add_mtp_weights, make_checkpoint
from tests.server.conftest import serving
from tests.server.live_server import LiveServer

MODEL = "drafting"


@pytest.fixture(scope="module")
def mtp_path(tmp_path_factory):
    path = make_checkpoint("qwen3.5", str(tmp_path_factory.mktemp("speculative")), seed=7)
    add_mtp_weights(path, seed=7)
    return path


@pytest.fixture(scope="module")
def drafting_server(mtp_path):
    yield from serving(LiveServer(mtp_path, "--max-model-len", "256", "--served-model-name", MODEL,
                                  "--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": 2})))


def _streamed_tokens(url: str, body: dict) -> str:
    text = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(text)


def test_greedy_completions_are_plain_greedy_decodings(mtp_path, drafting_server):
    prompts = [[random.randrange(3, VOCAB) for _ in range(random.randint(2, 30))] for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].text for o in LLM(mtp_path, device="cpu").generate(prompts, params, use_tqdm=False)]
    bodies = [{"model": MODEL, "prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True} for p in prompts]
    whole = [httpx.post(drafting_server.url + "/v1/completions", json=b, timeout=60).json()["choices"][0]["text"]
             for b in bodies]
    assert whole == expected
    assert [_streamed_tokens(drafting_server.url, b) for b in bodies] == expected
    metrics = drafting_server.metrics()
    drafted = next(v for k, v in metrics.items() if k.startswith("vllm:spec_decode_num_draft_tokens_total"))
    kept = next(v for k, v in metrics.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    assert drafted > 0 and 0 <= kept <= drafted


def _drafted(server) -> float:
    return next(v for k, v in server.metrics().items() if k.startswith("vllm:spec_decode_num_draft_tokens_total"))


def test_penalised_and_structured_completions_draft_and_are_plain_decodings(mtp_path, drafting_server):
    """Requests whose sampling reads their past draft too: over the server, a penalty's and a regex's greedy
    completions are the offline engine's plain ones, and drafts were verified for them."""
    from deltaserve.sampling_params import StructuredOutputsParams

    prompts = [[random.randrange(3, VOCAB) for _ in range(random.randint(2, 30))] for _ in range(2)]
    cases = [({"repetition_penalty": 1.4, "frequency_penalty": 0.5, "ignore_eos": True},
              SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.4,
                             frequency_penalty=0.5)),
             ({"structured_outputs": {"regex": "[ab]{3,12}"}},
              SamplingParams(temperature=0, max_tokens=16,
                             structured_outputs=StructuredOutputsParams(regex="[ab]{3,12}")))]
    offline = LLM(mtp_path, device="cpu")
    for fields, params in cases:
        before = _drafted(drafting_server)
        expected = [o.outputs[0].text for o in offline.generate(prompts, params, use_tqdm=False)]
        got = [httpx.post(drafting_server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": p, "max_tokens": 16, "temperature": 0, **fields}).json()["choices"][0]["text"]
            for p in prompts]
        assert got == expected, fields
        assert _drafted(drafting_server) > before, fields
