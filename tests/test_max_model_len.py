"""max_model_len against the context the checkpoint's config allows: refused past it unless an environment
variable allows it, a rope scaling that stretches positions counted in, today's behaviour where the config names
no length."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from deltaserve import LLM
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.errors import DeltaServeError
from deltaserve.models.config import parse_model_config
from tests.checkpoints import make_checkpoint

ALLOW_VARS = ("DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")
CONTEXT = 512  # tests/checkpoints.py's max_position_embeddings
LINEAR = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


@pytest.fixture(autouse=True)
def no_allowance(monkeypatch):
    """Each test starts with neither variable set, whatever the shell running the tests has."""
    for name in ALLOW_VARS:
        monkeypatch.delenv(name, raising=False)


def _engine(path: str, max_model_len: int | None) -> LLMEngine:
    return LLMEngine.from_args(path, device="cpu", max_model_len=max_model_len, max_num_seqs=2)


def test_a_max_model_len_past_the_config_is_refused_naming_both_and_the_way_round(checkpoint_factory):
    with pytest.raises(DeltaServeError) as info:
        _engine(checkpoint_factory("llama"), CONTEXT + 1)
    message = str(info.value)
    assert f"max_model_len={CONTEXT + 1}" in message
    assert f"context length of {CONTEXT} (max_position_embeddings={CONTEXT} in its config)" in message
    assert "DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN=1" in message and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in message


@pytest.mark.parametrize("name", ALLOW_VARS)
@pytest.mark.parametrize("value", ["1", "true", " TRUE "])
def test_either_variable_allows_it_with_a_warning(name, value, checkpoint_factory, monkeypatch, caplog):
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="deltaserve"):
        engine = _engine(checkpoint_factory("llama"), 2 * CONTEXT)
    assert engine.max_model_len == 2 * CONTEXT
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"max_model_len={2 * CONTEXT}" in w and f"{name}=1" in w for w in warnings), warnings


@pytest.mark.parametrize("value", ["0", "", "false", "yes"])
def test_other_values_allow_nothing(value, checkpoint_factory, monkeypatch):
    monkeypatch.setenv("DELTASERVE_ALLOW_LONG_MAX_MODEL_LEN", value)
    with pytest.raises(DeltaServeError, match="is more than the model's context length"):
        _engine(checkpoint_factory("llama"), CONTEXT + 1)


@pytest.mark.parametrize("asked, taken", [(CONTEXT, CONTEXT), (CONTEXT - 100, CONTEXT - 100), (None, CONTEXT)])
def test_the_config_length_or_less_loads_and_unset_takes_it(asked, taken, checkpoint_factory, caplog):
    with caplog.at_level(logging.WARNING, logger="deltaserve"):
        engine = _engine(checkpoint_factory("llama"), asked)
    assert engine.max_model_len == taken
    assert not [r for r in caplog.records if "context length" in r.getMessage()]


def _rope_checkpoint(tmp_path, rope_parameters: dict) -> str:
    return make_checkpoint("llama", str(tmp_path), rope_parameters=rope_parameters)


def test_linear_rope_scaling_allows_the_stretched_length_and_is_the_default(tmp_path):
    path = _rope_checkpoint(tmp_path, LINEAR)
    assert _engine(path, 2 * CONTEXT).max_model_len == 2 * CONTEXT
    assert _engine(path, None).max_model_len == 2 * CONTEXT
    with pytest.raises(DeltaServeError) as info:
        _engine(path, 2 * CONTEXT + 1)
    assert (f"context length of {2 * CONTEXT} (max_position_embeddings={CONTEXT} times the linear rope scaling "
            f"factor 2 in its config)") in str(info.value)


def test_llama3_rope_scaling_counts_no_factor_again(tmp_path):
    """Llama 3's max_position_embeddings is already the stretched length."""
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 128, "rope_theta": 10000.0}
    path = _rope_checkpoint(tmp_path, llama3)
    assert _engine(path, CONTEXT).max_model_len == CONTEXT
    with pytest.raises(DeltaServeError, match=f"context length of {CONTEXT} "):
        _engine(path, CONTEXT + 1)


def _config(**fields) -> dict:
    return dict(num_attention_heads=4, hidden_size=64, num_hidden_layers=2, vocab_size=100, **fields)


@pytest.mark.parametrize("fields, length, source", [
    (dict(max_position_embeddings=32768), 32768, "max_position_embeddings=32768"),
    (dict(max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32768}),
     131072, "original_max_position_embeddings=32768 times the yarn rope scaling factor 4"),
    (dict(max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.0}),
     8192, "max_position_embeddings=4096 times the dynamic rope scaling factor 2"),
    (dict(max_position_embeddings=4096, rope_scaling={"rope_type": "yarn", "factor": None}),
     4096, "max_position_embeddings=4096"),
    (dict(max_position_embeddings=4096, seq_length=2048), 2048, "seq_length=2048"),
    (dict(max_position_embeddings=4096, model_max_length=8192), 8192, "model_max_length=8192"),
    (dict(n_positions=1024), 1024, "n_positions=1024"),
    (dict(), None, ""),
])
def test_the_context_length_read_from_a_config(fields, length, source):
    config = parse_model_config(_config(**fields), "LlamaForCausalLM")
    assert (config.context_length, config.context_length_from) == (length, source)


def test_a_config_naming_no_length_takes_any_max_model_len_as_before(checkpoint_factory, tmp_path):
    path = shutil.copytree(checkpoint_factory("llama"), tmp_path / "no_length")
    config = json.loads((path / "config.json").read_text())
    del config["max_position_embeddings"]
    (path / "config.json").write_text(json.dumps(config))
    assert _engine(str(path), 8 * CONTEXT).max_model_len == 8 * CONTEXT
    assert _engine(str(path), None).max_model_len == 4096  # the default max_position_embeddings, as before


def test_the_demo_gguf_context_length_holds_too():
    """A GGUF names its context in `llama.context_length` (8192 for the demo model)."""
    with pytest.raises(DeltaServeError, match="max_model_len=16384 is more than the model's context length of 8192"):
        LLM(device="cpu", max_model_len=16384)
