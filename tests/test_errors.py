"""Every kind of bad input raises its own error type before any work is scheduled, and the engine
goes on serving the other requests."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from deltaserve import (
    LLM,
    InvalidPromptError,
    InvalidSamplingParamsError,
    PromptTooLongError,
    SamplingParams,
    ShapeMismatchError,
    StepFailedError,
    UnsupportedArchitectureError,
    WeightLoadError,
)

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture
def broken_copy(checkpoint_factory, tmp_path):
    def copy() -> str:
        target = tmp_path / "model"
        shutil.copytree(checkpoint_factory("llama"), target)
        return str(target)

    return copy


def test_unknown_architecture_lists_supported(broken_copy):
    path = broken_copy()
    config = json.load(open(os.path.join(path, "config.json")))
    config["architectures"] = ["GPT2LMHeadModel"]
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel.*Qwen3_5ForCausalLM"):
        LLM(path, device="cpu")


def _with_config(path: str, change) -> None:
    name = os.path.join(path, "config.json")
    config = json.load(open(name))
    json.dump(change(config), open(name, "w"))


@pytest.mark.parametrize("change, error, message", [
    (lambda c: {k: v for k, v in c.items() if k != "hidden_size"}, WeightLoadError, "config has no hidden_size"),
    (lambda c: [c], WeightLoadError, "config.json holds a JSON list, not an object"),
    (lambda c: {**c, "hidden_size": "64"}, ShapeMismatchError, "hidden_size='64': must be an integer"),
    (lambda c: {**c, "num_key_value_heads": 1.5}, ShapeMismatchError, "num_key_value_heads=1.5: must be an integer"),
    (lambda c: {**c, "rms_norm_eps": "tiny"}, ShapeMismatchError, "rms_norm_eps='tiny': must be a positive number"),
    (lambda c: {**c, "rope_scaling": "linear"}, WeightLoadError, "cannot be read as a LlamaForCausalLM config"),
    (lambda c: {**c, "architectures": "LlamaForCausalLM"}, UnsupportedArchitectureError,
     "architectures='LlamaForCausalLM': must be a list of class names"),
])
def test_a_malformed_config_is_named_not_a_traceback(broken_copy, change, error, message):
    """Each raised KeyError, AttributeError or a transformers validation error from deep in the loader (an
    architectures string read as a list of its letters)."""
    path = broken_copy()
    _with_config(path, change)
    with pytest.raises(error, match=f"config.json: .*{message}|{message}"):
        LLM(path, device="cpu")


def test_missing_weight_file(broken_copy):
    path = broken_copy()
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(WeightLoadError, match="no weights"):
        LLM(path, device="cpu")


def test_corrupt_weight_file(broken_copy):
    path = broken_copy()
    weights = os.path.join(path, "model.safetensors")
    data = open(weights, "rb").read()
    open(weights, "wb").write(data[: len(data) // 2])
    with pytest.raises(WeightLoadError, match="model.safetensors"):
        LLM(path, device="cpu")


def test_missing_tensor_is_named(broken_copy):
    path = broken_copy()
    weights = os.path.join(path, "model.safetensors")
    tensors = load_file(weights)
    del tensors["model.layers.2.mlp.down_proj.weight"]
    save_file(tensors, weights)
    with pytest.raises(WeightLoadError, match="layers.2.mlp.down_proj"):
        LLM(path, device="cpu")


def test_shape_not_matching_config(broken_copy):
    path = broken_copy()
    config = json.load(open(os.path.join(path, "config.json")))
    config["intermediate_size"] = 128
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    with pytest.raises(ShapeMismatchError, match="mlp"):
        LLM(path, device="cpu")


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"temperature": -0.1}, "temperature"), ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"), ({"n": 0}, "n"), ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"logprobs": -2}, "logprobs"),
    ({"prompt_logprobs": -5}, "prompt_logprobs"), ({"logprobs": 2.0}, "logprobs"),
    ({"max_tokens": "ten"}, "max_tokens"), ({"stop": [""]}, "stop"), ({"stop": 5}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"), ({"stop_token_ids": ["a"]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"include_stop_str_in_output": "no"}, "include_stop_str_in_output"),
    ({"skip_special_tokens": None}, "skip_special_tokens"), ({"detokenize": 1}, "detokenize"),
    ({"spaces_between_special_tokens": "no"}, "spaces_between_special_tokens"),
    # past float32's range the sampler would see inf or 0 (a penalty of 0 divides logits into inf)
    ({"temperature": 1e308}, "temperature"), ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"repetition_penalty": 1e39}, "repetition_penalty"),
    # vLLM's fields deltaserve does not honour: taken at their defaults, refused by name otherwise (a thinking
    # budget is honoured: only what is not a count of tokens is refused)
    ({"thinking_token_budget": -2}, "thinking_token_budget"), ({"thinking_token_budget": True}, "thinking_token_budget"),
    ({"thinking_token_budget": 1.5}, "thinking_token_budget"),
    ({"logprob_token_ids": list(range(129))}, "logprob_token_ids"), ({"logprob_token_ids": ["a"]}, "logprob_token_ids"),
    ({"logprob_token_ids": 3}, "logprob_token_ids"),
    ({"flat_logprobs": True}, "flat_logprobs"), ({"extra_args": {"k": 1}}, "extra_args"),
    ({"skip_reading_prefix_cache": "yes"}, "skip_reading_prefix_cache"),
    ({"repetition_detection": {"max_pattern_size": 4}}, "repetition_detection"),
])
def test_invalid_sampling_values(kwargs, field):
    with pytest.raises(InvalidSamplingParamsError, match=field):
        SamplingParams(**kwargs)


@pytest.fixture(scope="module")
def small_llm(tmp_path_factory):
    from tests.checkpoints import make_checkpoint

    path = make_checkpoint("qwen3.5", str(tmp_path_factory.mktemp("errors")))
    return LLM(path, device="cpu", max_model_len=64)


def test_bad_prompts_raise_and_leave_nothing_queued(small_llm):
    engine = small_llm.engine
    with pytest.raises(InvalidPromptError, match="empty"):
        small_llm.generate([""], GREEDY)
    with pytest.raises(InvalidPromptError, match="empty"):
        small_llm.generate([[1, 2], []], GREEDY)
    with pytest.raises(PromptTooLongError, match="64") as info:
        small_llm.generate([[1, 2, 3], list(range(64))], GREEDY)
    assert (info.value.prompt_len, info.value.max_model_len) == (64, 64)
    for out_of_range in ([1, 99999], [-1, 2], [1, 2**70]):
        with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
            small_llm.generate([out_of_range], GREEDY)
    for not_ids in ([1, 2.0], [True, 3], [1, "2"], [5, None], [False]):
        with pytest.raises(InvalidPromptError, match="list of token ids"):
            small_llm.engine.add_request("bad", not_ids, GREEDY)
    for request_id in (5, None, ["a"], ""):  # as vLLM's, a request is named by a string
        with pytest.raises(InvalidPromptError, match="must be a non-empty string"):
            small_llm.engine.add_request(request_id, [1, 2], GREEDY)
    # half of a UTF-16 pair is no text a tokenizer encodes: in a prompt, and in bad_words
    with pytest.raises(InvalidPromptError, match="lone UTF-16 surrogate"):
        small_llm.generate(["a b", "Hi \udcff"], GREEDY)
    with pytest.raises(InvalidSamplingParamsError, match="bad_words.*surrogate"):
        SamplingParams(bad_words=["ok", "\ud800"])
    assert not engine.has_unfinished_requests()
    assert engine.stats().kv_blocks_used == 0 and engine.stats().state_slots_used == 0


def test_vllm_prompt_dicts_are_taken_as_the_text_or_ids_they_hold(small_llm):
    ids = [int(t) for t in np.random.default_rng().integers(2, 200, size=int(np.random.default_rng().integers(2, 9)))]
    text = small_llm.get_tokenizer().decode(ids)
    expected = [o.outputs[0].token_ids for o in small_llm.generate([ids, text], GREEDY)]
    got = small_llm.generate([{"prompt_token_ids": ids}, {"prompt": text}], GREEDY)
    assert [o.outputs[0].token_ids for o in got] == expected
    assert small_llm.generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids == expected[0]
    for bad, named in (({"prompt": text, "multi_modal_data": {}}, "'multi_modal_data' is not supported"),
                       ({"prompt": text, "prompt_token_ids": ids}, "either 'prompt'"), ({}, "either 'prompt'"),
                       ({"prompt": ids}, "'prompt' is text, got list"),
                       ({"prompt_token_ids": text}, "'prompt_token_ids' is a list of token ids, got str")):
        with pytest.raises(InvalidPromptError, match=named):
            small_llm.generate([{"prompt": text}, bad], GREEDY)
    assert not small_llm.engine.has_unfinished_requests()


def test_integer_ids_of_any_integer_type_are_taken(small_llm):
    ids = [int(t) for t in np.random.default_rng().integers(2, 200, size=9)]
    expected = small_llm.generate([ids], GREEDY)[0]
    out = small_llm.generate([list(np.array(ids, dtype=np.int32))], GREEDY)[0]  # numpy scalars
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert out.outputs[0].text == expected.outputs[0].text and out.prompt_token_ids == ids


def test_failed_request_leaves_the_others_running(small_llm):
    engine = small_llm.engine
    expected = small_llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    engine.add_request("a", [5, 6, 7], GREEDY)
    engine.add_request("b", [8, 9], GREEDY)
    engine.step()
    with pytest.raises(InvalidSamplingParamsError):
        engine.add_request("bad", [1, 2], {"max_tokens": 3})
    with pytest.raises(PromptTooLongError):
        engine.add_request("long", list(range(100)), GREEDY)
    engine.add_request("c", [1, 2, 3, 4], GREEDY)
    engine.abort("c")  # an abort in the middle returns its blocks and slot at once
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    assert done == {"a": expected[0].outputs[0].token_ids, "b": expected[1].outputs[0].token_ids}
    assert engine.stats().kv_blocks_used == 0 and engine.stats().state_slots_used == 0


def _is_clean(llm) -> bool:
    """Nothing running or waiting, and nothing held (a queued step may still run: it finds its rows done)."""
    stats = llm.engine.stats()
    return (stats.num_running == stats.num_waiting == stats.kv_blocks_used == stats.state_slots_used == 0
            and not llm.engine._parents)


def test_fields_set_after_construction_are_checked_when_the_request_is_added(small_llm):
    expected = small_llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    params.max_tokens = 0
    with pytest.raises(InvalidSamplingParamsError, match="max_tokens"):
        small_llm.generate([[5, 6, 7]], params)
    params.max_tokens, params.stop_token_ids = 6, [expected[2]]  # read when added, not when built
    assert small_llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids == expected[:3]
    for tokens in ([-1], [10**30]):
        with pytest.raises(InvalidSamplingParamsError, match="stop_token_ids.*outside the vocabulary"):
            small_llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, stop_token_ids=tokens))
    assert _is_clean(small_llm)


def test_sampling_params_and_chats_of_the_wrong_shape_are_named(small_llm):
    with pytest.raises(InvalidSamplingParamsError, match="got int"):
        small_llm.generate("a b", 5)
    with pytest.raises(InvalidSamplingParamsError, match="got dict"):
        small_llm.generate("a b", {"temperature": 0})
    for messages in (None, {"role": "user", "content": "hi"}, [], [[]], ["hi"]):
        with pytest.raises(InvalidPromptError, match="conversation"):
            small_llm.chat(messages, GREEDY)
    assert _is_clean(small_llm)


@pytest.mark.parametrize("raised", [RuntimeError("a bug in the step"), KeyboardInterrupt()])
def test_a_failure_out_of_the_step_leaves_the_engine_empty(small_llm, monkeypatch, raised):
    """What escapes LLMEngine.step (a bug, Ctrl-C) reaches the caller, and the requests of the call are
    aborted, so the next call runs alone and right."""
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    expected = [o.outputs[0].token_ids for o in small_llm.generate(prompts, GREEDY)]
    take_token, calls = small_llm.engine._take_token, []

    def fails_on_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise raised
        return take_token(*args, **kwargs)

    monkeypatch.setattr(small_llm.engine, "_take_token", fails_on_the_third)
    with pytest.raises(type(raised)):
        small_llm.generate(prompts, GREEDY)
    monkeypatch.undo()
    assert _is_clean(small_llm)
    assert [o.outputs[0].token_ids for o in small_llm.generate(prompts, GREEDY)] == expected


def test_a_step_that_fails_inside_the_engine_raises_with_its_cause(small_llm, monkeypatch):
    """The engine aborts the requests of a failed step and goes on; generate says so instead of returning
    them cut short."""
    execute = small_llm.engine.runner.execute

    def broken(plan):
        raise ValueError("the device is gone")

    monkeypatch.setattr(small_llm.engine.runner, "execute", broken)
    monkeypatch.setattr(small_llm.engine.config, "async_scheduling", False)
    with pytest.raises(StepFailedError, match="aborted 2 of the 2") as info:
        small_llm.generate([[5, 6, 7], [8, 9]], GREEDY)
    assert isinstance(info.value.__cause__, ValueError)
    monkeypatch.setattr(small_llm.engine.runner, "execute", execute)
    assert _is_clean(small_llm)
    assert len(small_llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids) == 6
