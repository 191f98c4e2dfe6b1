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
    ({"top_p": 1.5}, "top_p"), ({"temperature": -0.1}, "temperature"), ({"top_k": 0}, "top_k"),
    ({"min_p": 2.0}, "min_p"), ({"n": 0}, "n"), ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"logprobs": 100}, "logprobs"),
    ({"max_tokens": "ten"}, "max_tokens"), ({"stop": [""]}, "stop"),
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
    assert not engine.has_unfinished_requests()
    assert engine.stats().kv_blocks_used == 0 and engine.stats().state_slots_used == 0


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
