"""A `vllm serve` command line starts deltaserve as it is: vLLM's flags are taken where deltaserve does what
they ask, and a reasoning parser named there splits `<think>` blocks from the answer even where the chat
template never thinks (the demo model's does not)."""

from __future__ import annotations

import json
import random
import string

import httpx
import pytest

from deltaserve.cli import _build_parser, _parse
from deltaserve.errors import DeltaServeError
from deltaserve.server.launcher import engine_kwargs
from deltaserve.server.vllm_flags import DROPPED, REFUSED, check_vllm_flags
from tests.server.conftest import MODEL, serving
from tests.server.live_server import LiveServer

pytestmark = pytest.mark.timeout(400)

VLLM_LINE = ["--trust-remote-code", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
             "--reasoning-parser", "qwen3", "-tp", "1", "--enable-chunked-prefill", "--enable-reasoning",
             "--language-model-only", "-pp", "1", "--data-parallel-size", "1", "--kv-cache-dtype", "auto",
             "--disable-log-stats", "--disable-log-requests", "--tokenizer-mode", "auto",
             "--limit-mm-per-prompt", '{"image": 0, "video": 0}', "--mm-encoder-tp-mode", "data",
             "--mm-processor-cache-type", "shm", "--enable-expert-parallel", "--disable-custom-all-reduce",
             "--distributed-executor-backend", "mp", "--cpu-offload-gb", "0"]


@pytest.fixture(scope="module")
def vllm_style_server():
    yield from serving(LiveServer("--served-model-name", MODEL, *VLLM_LINE, "--enable-log-requests",
                                  "--max-logprobs", str(RAISED_CAP), "--enable-force-include-usage",
                                  "--enable-prompt-tokens-details", "--max-log-len", "100",
                                  "--return-tokens-as-token-ids", "--response-role", RESPONSE_ROLE))


RAISED_CAP = 50
RESPONSE_ROLE = random.choice(["narrator", "bot", "model"])


def test_vllm_flags_parse_and_leave_the_engine_as_it_was():
    args = _build_parser().parse_args(["serve", *VLLM_LINE])
    assert check_vllm_flags(args) is True  # the reasoning parser turns the split on
    assert engine_kwargs(args) == engine_kwargs(_build_parser().parse_args(["serve"]))
    assert check_vllm_flags(_build_parser().parse_args(["serve", "--tool-call-parser", "hermes"])) is None


@pytest.mark.parametrize("line, named", [(["--tool-call-parser", "mistral"], "--tool-call-parser mistral"),
                                         (["--reasoning-parser", "granite"], "--reasoning-parser granite"),
                                         (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2"),
                                         (["-tp", "4"], "--tensor-parallel-size 4"),
                                         (["-pp", "2"], "--pipeline-parallel-size 2: .*one GPU"),
                                         (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8: .*model's dtype"),
                                         (["--enable-lora"], "--enable-lora: .*LoRA"),
                                         (["--no-enable-chunked-prefill"], "--no-enable-chunked-prefill: .*in chunks"),
                                         (["--tokenizer-mode", "mistral"], "--tokenizer-mode mistral: .*fast"),
                                         (["m", "--tokenizer", "other/tok"], "--tokenizer other/tok: .*checkpoint"),
                                         (["--hf-overrides", '{"max_position_embeddings": 1}'],
                                          "--hf-overrides .*config.json as it is"),
                                         (["--enable-sleep-mode"], "--enable-sleep-mode: .*on the GPU"),
                                         (["--cpu-offload-gb", "8"], "--cpu-offload-gb 8.0: .*every weight")])
def test_what_deltaserve_cannot_do_is_refused_by_name(line, named):
    with pytest.raises(DeltaServeError, match=named):
        check_vllm_flags(_build_parser().parse_args(["serve", *line]))


def test_vllms_spellings_and_tuning_flags_parse_and_leave_the_engine_as_it_was(capsys):
    """vLLM's parser reads `--max_model_len`, `-O3` and a dict flag key by key; its graph, kernel, scheduler and
    vision tuning flags are taken and dropped (they were unrecognized arguments), an empty parser name is none."""
    budget = random.randint(2, 9)
    line = ["--max_num_seqs", str(budget), "-O3", "--default-chat-template-kwargs.enable_thinking", "false",
            "--override-generation-config.temperature=0.5", "--override-generation-config.top_k", "20",
            "--reasoning-parser", "", "--tool-call-parser", "None"]
    args = _parse(["serve", *line])
    assert check_vllm_flags(args) is None and args.tool_call_parser is None
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    assert engine_kwargs(args) == {"max_num_seqs": budget, "override_generation_config": {"temperature": 0.5,
                                                                                           "top_k": 20}}
    plain = engine_kwargs(_parse(["serve"]))
    for names, value, _ in DROPPED:
        flag = random.choice(names)
        given = _parse(["serve", flag] + ([] if value is False else ["1", "2"] if value == "+" else ["x"]))
        assert check_vllm_flags(given) is None and engine_kwargs(given) == plain, flag
    with pytest.raises(SystemExit):
        _parse(["serve", "--help"])
    assert "accepted: deltaserve captures its own CUDA graphs" in " ".join(capsys.readouterr().out.split())


def test_vllms_switches_take_their_no_twins():
    """vLLM declares its switches --X / --no-X: a line that turns one off (or a config file's false) parsed as an
    unrecognized argument."""
    switches = ["--enforce-eager", "--trust-remote-code", "--enable-auto-tool-choice", "--disable-log-stats",
                "--enable-lora", "--enable-sleep-mode", "--enable-force-include-usage", "--enable-expert-parallel",
                "--return-tokens-as-token-ids", "--enable-request-id-headers", "--disable-fastapi-docs"]
    off = _parse(["serve", *("--no-" + s[2:] for s in switches)])
    assert check_vllm_flags(off) is None
    assert engine_kwargs(off) == {"enforce_eager": False}
    assert (off.enable_lora, off.trust_remote_code, off.return_tokens_as_token_ids) == (False, False, False)
    assert _parse(["serve", "-ep"]).enable_expert_parallel is True


@pytest.mark.parametrize("names, value, why", REFUSED)
def test_vllms_flags_of_what_deltaserve_cannot_do_are_refused_by_name(names, value, why):
    line = [random.choice(names)] + ([] if value is False else ["x"])
    with pytest.raises(DeltaServeError, match=f"^{max(names, key=len)}: {why}"):
        check_vllm_flags(_parse(["serve", *line]))


def test_the_model_itself_as_its_tokenizer_is_taken():
    model = f"org/model-{random.randrange(1000)}"
    assert check_vllm_flags(_build_parser().parse_args(["serve", model, "--tokenizer", model])) is None


def _forced_think_reply(live: LiveServer, thought: str, stream: bool = False) -> dict:
    """A chat reply held by a regex to `<think>THOUGHT</think>Paris`; a stream's deltas joined field by field."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 40, "temperature": 0, "stream": stream,
            "structured_outputs": {"regex": f"<think>{thought}</think>Paris"}}
    r = httpx.post(live.base_url + "/chat/completions", json=body, headers=live.headers, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["message"]
    joined: dict[str, str] = {}
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                for name, value in choice["delta"].items():
                    if isinstance(value, str) and name != "role":
                        joined[name] = joined.get(name, "") + value
    return joined


def test_a_named_reasoning_parser_splits_the_reply(vllm_style_server, server):
    thought = "".join(random.choices(string.ascii_lowercase, k=random.randint(3, 8)))
    split = _forced_think_reply(vllm_style_server, thought)
    # under vLLM's name and DeepSeek's
    assert (split.get("reasoning"), split.get("reasoning_content"), split["content"]) == (thought, thought, "Paris")
    whole = _forced_think_reply(server, thought)  # the same model without the flag: its template never thinks
    assert whole["content"] == f"<think>{thought}</think>Paris"
    assert "reasoning" not in whole and "reasoning_content" not in whole
    streamed = _forced_think_reply(vllm_style_server, thought, stream=True)
    assert streamed == {"reasoning": thought, "reasoning_content": thought, "content": "Paris"}
    # --enable-log-requests: each request's sampling parameters at INFO, its grammar among them; not by default
    accepted = [line for line in vllm_style_server.read_log().splitlines() if " accepted: SamplingParams(" in line]
    assert len([line for line in accepted if thought in line]) == 2, accepted
    assert " accepted: " not in server.read_log()


def test_max_logprobs_raises_the_cap_on_every_route(vllm_style_server, server):
    """Under --max-logprobs 50 a chat reply carries the top logprobs a token asked (the default server's 20
    best among them, the same values) and legacy completions up to 50; past the cap each route's field is
    named; the default cap stays 20."""
    count = random.randint(30, RAISED_CAP)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4,
            "temperature": 0, "logprobs": True, "top_logprobs": count, "return_tokens_as_token_ids": False}
    # each request under a salt of its own runs cold, so that both take the same path to the same bytes
    r = httpx.post(vllm_style_server.base_url + "/chat/completions", json={**chat, "cache_salt": _fresh()},
                   headers=vllm_style_server.headers, timeout=120)
    assert r.status_code == 200, r.text
    raised = r.json()["choices"][0]["logprobs"]["content"]
    r = httpx.post(server.base_url + "/chat/completions", json={**chat, "top_logprobs": 20, "cache_salt": _fresh()},
                   headers=server.headers, timeout=120)
    assert r.status_code == 200, r.text
    capped = r.json()["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in raised] == [t["token"] for t in capped]
    for many, few in zip(raised, capped):
        assert len(many["top_logprobs"]) == count
        values = [t["logprob"] for t in many["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert values[:20] == [t["logprob"] for t in few["top_logprobs"]]
    body = {"model": MODEL, "prompt": "The sky is", "max_tokens": 2, "temperature": 0, "logprobs": count}
    r = httpx.post(vllm_style_server.base_url + "/completions", json=body, headers=vllm_style_server.headers,
                   timeout=120)
    assert r.status_code == 200, r.text
    # keyed by text, where two tokens may read the same: more than the default cap's 20, at most the count asked
    assert all(20 < len(top) <= count for top in r.json()["choices"][0]["logprobs"]["top_logprobs"])
    for live, field, value, route, extra in [
            (vllm_style_server, "top_logprobs", RAISED_CAP + 1, "/chat/completions", {"logprobs": True}),
            (vllm_style_server, "logprobs", RAISED_CAP + 1, "/completions", {}),
            (vllm_style_server, "prompt_logprobs", -1, "/completions", {}),
            (server, "top_logprobs", 21, "/chat/completions", {"logprobs": True})]:
        request = dict(chat if route == "/chat/completions" else body)
        request.pop("top_logprobs", None), request.pop("logprobs", None)
        r = httpx.post(live.base_url + route, json={**request, **extra, field: value}, headers=live.headers,
                       timeout=120)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and "max_logprobs" in error["message"], error


def _streamed_usage(live: LiveServer, route: str, body: dict) -> list[dict | None]:
    """Each chunk's usage, in order, of a stream sent without stream_options."""
    r = httpx.post(live.base_url + route, json={**body, "stream": True}, headers=live.headers, timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]).get("usage") for line in r.text.splitlines() if line.startswith("data: {")]


def test_force_include_usage_ends_every_stream_with_its_usage(vllm_style_server, server):
    tokens = random.randint(2, 6)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True}
    completion = {"model": MODEL, "prompt": "One, two,", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    for route, body in (("/chat/completions", chat), ("/completions", completion)):
        forced = _streamed_usage(vllm_style_server, route, body)
        assert all(u is None for u in forced[:-1]) and forced[-1]["completion_tokens"] == tokens
        assert forced[-1]["total_tokens"] == forced[-1]["prompt_tokens"] + tokens
        assert "cached_tokens" in forced[-1]["prompt_tokens_details"]
        assert all(u is None for u in _streamed_usage(server, route, body))  # not forced: none unless asked


def test_response_role_names_the_reply_that_opens_a_turn(vllm_style_server, server):
    """--response-role names a reply to a prompt that opens a new turn, whole and streamed; a reply that goes on
    writing the last message takes that message's role, as vLLM's does."""
    question = [{"role": "user", "content": "Name a colour."}]
    for live, role in ((vllm_style_server, RESPONSE_ROLE), (server, "assistant")):
        body = {"model": MODEL, "messages": question, "max_tokens": 2, "temperature": 0}
        r = httpx.post(live.base_url + "/chat/completions", json=body, headers=live.headers, timeout=120)
        assert r.json()["choices"][0]["message"]["role"] == role, r.text
        first = _streamed_chunks(live, body)[0]
        assert first["choices"][0]["delta"]["role"] == role
        going_on = {**body, "messages": question + [{"role": "assistant", "content": "Blue"}],
                    "add_generation_prompt": False, "continue_final_message": True}
        r = httpx.post(live.base_url + "/chat/completions", json=going_on, headers=live.headers, timeout=120)
        assert r.json()["choices"][0]["message"]["role"] == "assistant", r.text
    # a reply in the server's role can be sent back (and gone on with); as vLLM's, any server takes any role
    replied = {"model": MODEL, "max_tokens": 2, "temperature": 0, "add_generation_prompt": False,
               "continue_final_message": True, "messages": question + [{"role": RESPONSE_ROLE, "content": "Blue"}]}
    for live in (vllm_style_server, server):
        r = httpx.post(live.base_url + "/chat/completions", json=replied, headers=live.headers, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == RESPONSE_ROLE, r.text


def _streamed_chunks(live: LiveServer, body: dict) -> list[dict]:
    r = httpx.post(live.base_url + "/chat/completions", json={**body, "stream": True}, headers=live.headers,
                   timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def _fresh() -> str:
    """A cache salt no request has had: its request runs cold, as every other such request (a hit restored at a
    point other requests left, such as the chat template's opening, agrees with a miss only to rounding)."""
    return f"salt-{random.randrange(10**12)}"


def _chat_logprobs(live: LiveServer, **fields) -> list[dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 5,
            "temperature": 0, "logprobs": True, "top_logprobs": 3, "cache_salt": _fresh(), **fields}
    r = httpx.post(live.base_url + "/chat/completions", json=body, headers=live.headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["content"]


def test_return_tokens_as_token_ids_names_each_token_by_its_id(vllm_style_server, server):
    """Under --return-tokens-as-token-ids logprobs name tokens "token_id:ID" (their bytes still the text's),
    unless a request says false; a request may ask it of any server. Each id decodes to the text named, where it
    decodes whole (a token that holds part of a character is named by what it adds to the tokens before it)."""
    as_ids, as_text = _chat_logprobs(vllm_style_server), _chat_logprobs(server)
    assert as_ids == _chat_logprobs(server, return_tokens_as_token_ids=True)
    assert as_text == _chat_logprobs(vllm_style_server, return_tokens_as_token_ids=False)
    for named, plain in zip(as_ids, as_text):
        for a, b in zip([named] + named["top_logprobs"], [plain] + plain["top_logprobs"]):
            assert a["token"].startswith("token_id:") and a["bytes"] == b["bytes"] and a["logprob"] == b["logprob"]
            r = httpx.post(server.url + "/detokenize", json={"model": MODEL, "tokens": [int(a["token"][9:])]},
                           headers=server.headers, timeout=30)
            own = r.json()["prompt"]
            assert own == b["token"] or "\ufffd" in own, (own, b["token"])
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": True}
    r = httpx.post(vllm_style_server.base_url + "/completions", json=body, headers=vllm_style_server.headers,
                   timeout=120)
    legacy = r.json()["choices"][0]["logprobs"]
    assert all(t.startswith("token_id:") for t in legacy["tokens"])
    assert all(k.startswith("token_id:") for top in legacy["top_logprobs"] if top for k in top)



def test_the_speculative_config_reaches_the_engine_whole_or_key_by_key():
    whole = _parse(["serve", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'])
    by_key = _parse(["serve", "--spec-method", "mtp", "--spec-tokens", "2"])
    dotted = _parse(["serve", "--speculative-config.method", "mtp", "--speculative-config.num_speculative_tokens", "2"])
    for args in (whole, by_key, dotted):
        assert engine_kwargs(args)["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    both = _build_parser().parse_args(["serve", "-sc", '{"method": "mtp", "num_speculative_tokens": 1}',
                                       "--spec-tokens", "3"])
    with pytest.raises(DeltaServeError, match="--spec-tokens and --speculative-config's 'num_speculative_tokens'"):
        engine_kwargs(both)
