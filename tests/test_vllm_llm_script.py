"""A script written for vLLM's LLM runs as it is: vLLM's engine arguments are taken, renamed or refused by
name; generate and chat draw vLLM's progress bar unless use_tqdm=False; chat takes chat_template,
chat_template_kwargs and continue_final_message."""

import random

import pytest
from tqdm import tqdm

from deltaserve import LLM, RequestOutputKind, SamplingParams, StructuredOutputsParams
from deltaserve.errors import DeltaServeError, InvalidPromptError, InvalidSamplingParamsError
from deltaserve.vllm_engine_args import ONLY, engine_args_from_vllm

TEMPLATE = ("{% for m in messages %}[{{ m.role }}{% if flavour is defined %} {{ flavour }}{% endif %}] "
            "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
# a value of each argument that deltaserve cannot honour
REFUSED = {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 4,
           "enable_chunked_prefill": False, "kv_cache_dtype": "fp8",
           "enable_lora": True,
           "tokenizer_mode": "mistral", "hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
           "enable_sleep_mode": True, "cpu_offload_gb": 4, "runner": "pooling", "skip_tokenizer_init": True}
GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(checkpoint_factory):
    return LLM(checkpoint_factory("qwen3.5"), device="cpu", chat_template=TEMPLATE, max_num_seqs=4)


def _word() -> str:
    return f"w{random.randrange(10**6)}"


def test_vllms_engine_arguments_start_the_same_engine(checkpoint_factory, llm):
    path = checkpoint_factory("qwen3.5")
    vllm_style = LLM(path, device="cpu", chat_template=TEMPLATE, max_num_seqs=4, trust_remote_code=True,
                     tensor_parallel_size=1, pipeline_parallel_size=1, enable_chunked_prefill=True,
                     kv_cache_dtype="auto", quantization=None, disable_log_stats=True, tokenizer=path,
                     mamba_ssm_cache_dtype="float32", enable_expert_parallel=True, disable_custom_all_reduce=True,
                     distributed_executor_backend="mp", enable_sleep_mode=False, cpu_offload_gb=0,
                     hf_overrides=None, num_gpu_blocks_override=64, swap_space=4, hf_token=None,
                     compilation_config={"cudagraph_capture_sizes": [1, 2, 4]}, runner="generate",
                     skip_tokenizer_init=False, logprobs_mode="raw_logprobs")
    assert vllm_style.engine.config.gdn_state_dtype == "float32" and vllm_style.engine.config.num_kv_blocks == 64
    prompts = [[random.randrange(3, 200) for _ in range(random.randint(1, 30))] for _ in range(3)]
    outs = vllm_style.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [
        o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert all(o.finished and o.outputs[0].finished() for o in outs)  # a field, and a method as in vLLM


@pytest.mark.parametrize("name", sorted(ONLY))
def test_a_value_deltaserve_cannot_honour_is_refused_by_name(name):
    assert set(REFUSED) == set(ONLY)
    with pytest.raises(DeltaServeError, match=f"^{name}={REFUSED[name]!r}: "):
        engine_args_from_vllm("m", {name: REFUSED[name]})
    assert engine_args_from_vllm("m", {name: ONLY[name][0][0]}) == {}


def test_renamed_checked_and_unknown_arguments():
    assert engine_args_from_vllm("m", {"mamba_ssm_cache_dtype": "bfloat16", "max_num_seqs": 3}) == {
        "gdn_state_dtype": "bfloat16", "max_num_seqs": 3}
    assert engine_args_from_vllm("m", {"mamba_ssm_cache_dtype": None}) == {}
    with pytest.raises(DeltaServeError, match="same setting"):
        engine_args_from_vllm("m", {"mamba_ssm_cache_dtype": "bfloat16", "gdn_state_dtype": "float32"})
    with pytest.raises(DeltaServeError, match="num_gpu_blocks_override and num_kv_blocks"):
        LLM("m", num_kv_blocks=8, num_gpu_blocks_override=16)
    with pytest.raises(DeltaServeError, match="tokenizer='other'"):
        engine_args_from_vllm("m", {"tokenizer": "other"})
    with pytest.raises(DeltaServeError, match="tensor_parallel_size=True"):
        engine_args_from_vllm("m", {"tensor_parallel_size": True})
    name = f"no_such_{random.randrange(1000)}"
    with pytest.raises(TypeError, match=f"LLM\\(\\) got an unexpected keyword argument '{name}'"):
        engine_args_from_vllm("m", {name: 1})


def test_enqueued_prompts_and_chats_finish_in_wait_for_completion(llm):
    """vLLM's enqueue / enqueue_chat / wait_for_completion: ids at once, the outputs of what was queued in its
    order, as generate and chat give them; a generate meanwhile runs them too and returns its own alone."""
    prompts = [[random.randrange(3, 200) for _ in range(random.randint(1, 20))] for _ in range(random.randint(2, 4))]
    chats = [[{"role": "user", "content": _word()}] for _ in range(2)]
    ids = llm.enqueue(prompts, GREEDY) + llm.enqueue_chat(chats, GREEDY)
    assert len(set(ids)) == len(prompts) + 2
    between = llm.generate(prompts[:1], GREEDY, use_tqdm=False)  # steps the queued ones too
    assert [o.request_id for o in between] != ids[:1]
    outs = llm.wait_for_completion(use_tqdm=False)
    assert [o.request_id for o in outs] == ids
    expected = llm.generate(prompts, GREEDY, use_tqdm=False) + llm.chat(chats, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in expected]
    assert [o.prompt for o in outs[len(prompts):]] == [o.prompt for o in expected[len(prompts):]]
    assert llm.wait_for_completion(use_tqdm=False) == [] and not llm.engine.has_unfinished_requests()


def test_the_progress_bar_counts_the_finished_prompts(llm, capsys):
    count = random.randint(2, 5)
    prompts = [[random.randrange(3, 200) for _ in range(random.randint(1, 20))] for _ in range(count)]
    quiet = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert capsys.readouterr().err == ""
    loud = llm.generate(prompts, GREEDY)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and f"{count}/{count}" in err and "output:" in err
    assert [o.outputs[0].token_ids for o in loud] == [o.outputs[0].token_ids for o in quiet]

    made = []

    class Recording(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, disable=True, **kwargs)
            made.append(self)

        def update(self, n=1):
            self.updates = getattr(self, "updates", 0) + n

    llm.chat([[{"role": "user", "content": _word()}]] * count, GREEDY, use_tqdm=Recording)
    assert [(bar.total, bar.updates) for bar in made] == [(count, count)]


def test_chat_template_kwargs_and_a_template_for_one_call_render_the_prompt(llm):
    tok, word, flavour = llm.get_tokenizer(), _word(), _word()
    messages = [{"role": "user", "content": word}]
    out = llm.chat(messages, GREEDY, use_tqdm=False, chat_template_kwargs={"flavour": flavour})[0]
    assert out.prompt_token_ids == tok.encode(f"[user {flavour}] {word}\n[assistant]", add_special_tokens=False)
    other = "{% for m in messages %}<{{ m.content }}>{% endfor %}"
    out = llm.chat(messages, GREEDY, use_tqdm=False, chat_template=other)[0]
    assert out.prompt_token_ids == tok.encode(f"<{word}>", add_special_tokens=False)
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]  # the engine's template again
    assert out.prompt_token_ids == tok.encode(f"[user] {word}\n[assistant]", add_special_tokens=False)


def test_continue_final_message_goes_on_writing_the_last_message(llm):
    tok, word, start = llm.get_tokenizer(), _word(), _word()
    messages = [{"role": "user", "content": word}, {"role": "assistant", "content": start}]
    out = llm.chat(messages, GREEDY, use_tqdm=False, continue_final_message=True, add_generation_prompt=False)[0]
    assert out.prompt_token_ids == tok.encode(f"[user] {word}\n[assistant] {start}", add_special_tokens=False)
    with pytest.raises(InvalidPromptError, match="add_generation_prompt=False"):
        llm.chat(messages, GREEDY, use_tqdm=False, continue_final_message=True)


def test_capture_points_are_where_each_message_starts_under_the_calls_options(llm):
    tok, flavour = llm.get_tokenizer(), _word()
    messages = [{"role": role, "content": _word()} for role in ("system", "user", "assistant", "user")]
    options = {"flavour": flavour}
    full = tok.encode(tok.apply_chat_template(messages, **options), add_special_tokens=False)
    offsets = tok.message_offsets(messages, full=full, **options)
    for i in range(1, len(messages)):
        before = tok.encode(tok.apply_chat_template(messages[:i], add_generation_prompt=False, **options),
                            add_special_tokens=False)
        assert offsets[i] == len(before) and full[:len(before)] == before


@pytest.mark.parametrize("kwargs,named", [
    ({"chat_template_kwargs": {"tools": []}}, "may not carry tools"),
    ({"chat_template_kwargs": {"tokenize": True, "add_generation_prompt": False}}, "add_generation_prompt, tokenize"),
    ({"chat_template": "not/a/file.jinja"}, "chat_template: .*no such file"),
    ({"chat_template": "{% for m in messages %}"}, "chat_template: "),
])
def test_bad_chat_arguments_are_named(llm, kwargs, named):
    with pytest.raises(InvalidPromptError, match=named):
        llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False, **kwargs)
    assert not llm.engine.has_unfinished_requests()


def test_vllms_call_options_are_taken_at_none_and_refused_by_name_otherwise(llm):
    prompt = [random.randrange(3, 200) for _ in range(random.randint(1, 20))]
    plain = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    none = dict(lora_request=None, priority=None, tokenization_kwargs=None, mm_processor_kwargs=None)
    assert llm.generate([prompt], GREEDY, use_tqdm=False, **none)[0].outputs[0].token_ids == plain
    conversation = [{"role": "user", "content": _word()}]
    chat = llm.chat(conversation, GREEDY, False, None, chat_template_content_format="auto", tokenization_kwargs=None,
                    mm_processor_kwargs=None)  # vLLM's order: lora_request the fourth
    assert chat[0].outputs[0].token_ids == llm.chat(conversation, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    refused = {"lora_request": ("lora", 1, "/adapters/a"), "tokenization_kwargs": {"truncation": True},
               "mm_processor_kwargs": {"fps": 2}}
    for name, value in refused.items():
        with pytest.raises(InvalidPromptError, match=f"^{name}=.*: deltaserve .*leave it out"):
            llm.generate([prompt], GREEDY, use_tqdm=False, **{name: value})
        with pytest.raises(InvalidPromptError, match=f"^{name}="):
            llm.chat(conversation, GREEDY, use_tqdm=False, **{name: value})
    # priority: zeros under fcfs, the engine's default (test_priority_engine.py has the rest)
    assert llm.generate([prompt], GREEDY, use_tqdm=False, priority=[0])[0].outputs[0].token_ids == plain
    with pytest.raises(InvalidPromptError, match="^priority=1: priority scheduling is not enabled"):
        llm.generate([prompt], GREEDY, use_tqdm=False, priority=[1])
    with pytest.raises(InvalidPromptError, match="chat_template_content_format='parts'"):  # vLLM's three only
        llm.chat(conversation, GREEDY, use_tqdm=False, chat_template_content_format="parts")
    assert not llm.engine.has_unfinished_requests()


def test_the_tokenizer_answers_as_a_hugging_face_one(llm):
    """What vLLM scripts do with llm.get_tokenizer(): render with tokenize=False or True, read eos_token_id,
    call it, batch_decode, len."""
    tok = llm.get_tokenizer()
    reference = tok.hf  # the Hugging Face tokenizer under it, which is what vLLM hands out
    messages = [{"role": "user", "content": _word()}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert llm.generate([{"prompt_token_ids": ids}], GREEDY, use_tqdm=False)[0].prompt_token_ids == ids
    assert tok.eos_token_id == reference.eos_token_id and len(tok) == len(reference)
    words = [_word() for _ in range(3)]
    assert tok(words[0])["input_ids"] == reference(words[0])["input_ids"]
    batch = [tok.encode(w, add_special_tokens=False) for w in words]
    assert tok.batch_decode(batch) == words


@pytest.mark.parametrize("method", ["encode", "embed", "classify", "score", "reward", "sleep",
                                    "wake_up"])
def test_vllms_methods_for_what_deltaserve_does_not_do_refuse_by_name(llm, method):
    with pytest.raises(DeltaServeError, match=f"LLM.{method}: "):
        getattr(llm, method)(["a prompt"])


def test_vllms_sampling_params_api():
    """What vLLM's code calls on its SamplingParams: output_kind (the offline LLM returns the final outputs, as
    vLLM's sets FINAL_ONLY), skip_clone, clone, from_optional; a stop string is a list of one, no bad words an
    empty list, and a structural tag is refused by name."""
    seed = random.randrange(10**6)
    params = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, skip_clone=True, stop="x", seed=seed,
                            structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    assert params.stop == ["x"] and params.bad_words == [] and params.output_kind == RequestOutputKind.FINAL_ONLY
    copy = params.clone()
    copy.structured_outputs.json["type"] = "array"
    assert copy.seed == seed and params.structured_outputs.json == {"type": "object"}  # a deep copy
    assert SamplingParams.from_optional(temperature=None, top_p=0.5, seed=None).temperature == 1.0
    assert SamplingParams(output_kind=1).output_kind == RequestOutputKind.DELTA
    with pytest.raises(InvalidSamplingParamsError, match="output_kind"):
        SamplingParams(output_kind=7)
    with pytest.raises(InvalidSamplingParamsError, match="structural_tag"):
        StructuredOutputsParams(json={}, structural_tag="{}")


def test_vllms_output_fields_seeds_and_token_texts(llm):
    """vLLM's: sample i of a request seeded s draws as one seeded s + i; without detokenizing no logprob has a
    text; and the output fields vLLM's code reads are there."""
    prompt = [random.randrange(3, 200) for _ in range(random.randint(2, 12))]
    seed = random.randrange(10**6)
    sampled = dict(max_tokens=6, temperature=1.0, ignore_eos=True)
    two = llm.generate([prompt], SamplingParams(n=2, seed=seed, **sampled), use_tqdm=False)[0]
    for i in range(2):
        alone = llm.generate([prompt], SamplingParams(seed=seed + i, **sampled), use_tqdm=False)[0]
        assert two.outputs[i].token_ids == alone.outputs[0].token_ids, i
    out = llm.generate([prompt], SamplingParams(max_tokens=3, logprobs=2, prompt_logprobs=1, detokenize=False),
                       use_tqdm=False)[0]
    assert all(lp.decoded_token is None for entry in out.outputs[0].logprobs for lp in entry.values())
    assert all(lp.decoded_token is None for entry in out.prompt_logprobs[1:] for lp in entry.values())
    assert (out.lora_request, out.encoder_prompt, out.encoder_prompt_token_ids, out.kv_transfer_params) == (None,) * 4
    assert out.outputs[0].lora_request is None and out.outputs[0].text == ""
