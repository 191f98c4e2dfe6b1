"""A checkpoint's generation_config.json sets what a request leaves unset, as in vLLM; "vllm" keeps the API's."""

import json
import os
import random
import shutil

import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.cli import _build_parser
from deltaserve.engine.sampling_defaults import load_sampling_defaults, max_tokens_cap
from deltaserve.errors import DeltaServeError
from deltaserve.server.launcher import engine_kwargs
from deltaserve.server.errors import APIError
from deltaserve.server.protocol import ChatCompletionRequest
from deltaserve.server.sampling import build_sampling_params, resolve_max_tokens


def _with_generation_config(path: str, tmp_path, values: dict) -> str:
    copy = str(tmp_path / "checkpoint")
    shutil.copytree(path, copy)
    with open(os.path.join(copy, "generation_config.json"), "w") as f:
        json.dump(values, f)
    return copy


def test_the_file_gives_the_fields_vllm_reads(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_k": 0, "top_p": 0.95, "max_new_tokens": 30,
         "repetition_penalty": None, "eos_token_id": [1, 2], "bos_token_id": 0}))
    want = {"temperature": 0.6, "top_k": -1, "top_p": 0.95, "max_tokens": 30}  # top_k 0 is transformers' "off"
    assert load_sampling_defaults("auto", str(tmp_path), is_gguf=False) == want
    assert load_sampling_defaults(str(tmp_path), "/elsewhere", is_gguf=True) == want
    assert load_sampling_defaults("vllm", str(tmp_path), is_gguf=False) == {}
    assert load_sampling_defaults("auto", str(tmp_path / "none"), is_gguf=False) == {}


def test_an_override_sets_its_values_over_the_files_or_the_apis(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    temperature = round(random.uniform(0.1, 1.5), 3)
    override = {"temperature": temperature, "max_new_tokens": random.randint(1, 99), "top_k": 0}
    want = {"temperature": temperature, "top_k": -1, "top_p": 0.95, "max_tokens": override["max_new_tokens"]}
    assert load_sampling_defaults("auto", str(tmp_path), False, override) == want
    assert load_sampling_defaults("vllm", str(tmp_path), False, override) == {
        "temperature": temperature, "top_k": -1, "max_tokens": override["max_new_tokens"]}
    assert load_sampling_defaults("auto", str(tmp_path), False, {}) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    with pytest.raises(DeltaServeError, match="override_generation_config: presence_penalty is not read"):
        load_sampling_defaults("auto", str(tmp_path), False, {"presence_penalty": 1.0, "top_p": 0.5})
    with pytest.raises(DeltaServeError, match="override_generation_config: top_p=3"):
        load_sampling_defaults("auto", str(tmp_path), False, {"top_p": 3})
    with pytest.raises(DeltaServeError, match="must be a JSON object"):
        load_sampling_defaults("auto", str(tmp_path), False, [("top_p", 0.5)])


def test_the_override_reaches_the_engine_from_the_command_line_and_llm(checkpoint_factory):
    args = _build_parser().parse_args(["serve", "--override-generation-config", '{"temperature": 0.25}'])
    assert engine_kwargs(args)["override_generation_config"] == {"temperature": 0.25}
    for bad in ("{", "[1]"):
        with pytest.raises(SystemExit):
            _build_parser().parse_args(["serve", "--override-generation-config", bad])
    llm = LLM(checkpoint_factory("llama"), device="cpu", generation_config="vllm",
              override_generation_config={"top_p": 0.5, "repetition_penalty": 1.1})
    assert llm.get_default_sampling_params() == SamplingParams(top_p=0.5, repetition_penalty=1.1)


def test_a_file_that_is_missing_or_out_of_range_is_named(tmp_path):
    with pytest.raises(DeltaServeError, match="generation_config="):
        load_sampling_defaults(str(tmp_path), "/elsewhere", is_gguf=False)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 2.0}))
    with pytest.raises(DeltaServeError, match="generation_config.json: top_p=2.0"):
        load_sampling_defaults("auto", str(tmp_path), is_gguf=False)
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(DeltaServeError, match="could not be read"):
        load_sampling_defaults("auto", str(tmp_path), is_gguf=False)


def test_generate_without_params_samples_as_the_file_asks(checkpoint_factory, tmp_path):
    """Two engines of one seed: the file's values taken by default draw what the same values given draw."""
    values = {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "max_new_tokens": 9}
    path = _with_generation_config(checkpoint_factory("qwen3.5"), tmp_path, values)
    prompt = [random.randrange(300) for _ in range(12)]
    by_default = LLM(path, device="cpu")
    assert by_default.get_default_sampling_params() == SamplingParams(temperature=0.7, top_k=5, top_p=0.9,
                                                                      max_tokens=9)
    given = LLM(path, device="cpu", generation_config="vllm")
    assert given.get_default_sampling_params() == SamplingParams()
    explicit = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=9)
    assert (by_default.generate([prompt])[0].outputs[0].token_ids
            == given.generate([prompt], explicit)[0].outputs[0].token_ids)


def test_a_request_takes_the_defaults_only_for_what_it_leaves_unset():
    defaults = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 30}
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "top_p": 0.5})
    params = build_sampling_params(req, max_tokens=10, logprobs=None, defaults=defaults)
    assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (0.6, 20, 0.5, 10)
    plain = build_sampling_params(req, max_tokens=10, logprobs=None)
    assert (plain.temperature, plain.top_k) == (1.0, -1)
    assert resolve_max_tokens(None, 100, 1024, "messages", defaults["max_tokens"]) == 30
    assert resolve_max_tokens(None, 1000, 1024, "messages", defaults["max_tokens"]) == 24  # the context's rest
    assert resolve_max_tokens(50, 100, 1024, "messages", defaults["max_tokens"]) == 50  # asked for: honoured
    cap = random.randint(1, 60)  # the server's cap stands over what is asked, and over the default
    assert resolve_max_tokens(50, 100, 1024, "messages", defaults["max_tokens"], cap) == min(50, cap)
    assert resolve_max_tokens(None, 100, 1024, "messages", defaults["max_tokens"], cap) == min(30, cap)
    with pytest.raises(APIError, match="context"):  # the context is checked against what is asked, as vLLM's
        resolve_max_tokens(1000, 100, 1024, "messages", None, cap)


def test_the_cap_is_an_override_or_a_named_files_max_new_tokens():
    """vLLM's override_max_tokens: the checkpoint's own file ("auto") only fills in a request without a limit."""
    n = random.randint(1, 99)
    assert max_tokens_cap("auto", {"max_tokens": n}, None) is None
    assert max_tokens_cap("vllm", {}, {"max_new_tokens": n}) == n
    assert max_tokens_cap("auto", {"max_tokens": n + 1}, {"max_new_tokens": n}) == n
    assert max_tokens_cap("/a/directory", {"max_tokens": n}, None) == n


@pytest.mark.timeout(300)
def test_the_server_samples_unset_fields_as_the_file_asks(checkpoint_factory, tmp_path):
    """The file asks for greedy decoding: a request without a temperature decodes greedily, where the API's
    temperature 1 would sample; the start-up says which values it took. An override's max_new_tokens caps every
    request, whatever it asks (vLLM's override_max_tokens)."""
    import httpx

    from tests.server.live_server import LiveServer

    path = _with_generation_config(checkpoint_factory("qwen3.5"), tmp_path, {"temperature": 0.0, "top_p": 0.9})
    prompt = [random.randrange(300) for _ in range(8)]
    cap = random.randint(2, 8)
    live = LiveServer(path, "--max-model-len", "512",  # the tiny checkpoint's own context
                      "--override-generation-config", json.dumps({"max_new_tokens": cap}))
    try:
        def tokens(**fields):
            body = {"prompt": prompt, "max_tokens": 12, "ignore_eos": True, "logprobs": 0, **fields}
            r = httpx.post(live.url + "/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["logprobs"]["tokens"]

        unset = tokens()
        assert len(unset) == cap and unset == tokens(temperature=0)
        assert any(tokens(temperature=1.0, seed=seed) != unset for seed in range(3))
        assert "temperature=0.0, top_p=0.9" in live.read_log() and f"more than {cap} tokens" in live.read_log()
    finally:
        assert live.stop() == 0, live.read_log()
        live.cleanup()
