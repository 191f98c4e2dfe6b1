"""The GDN recurrent state's dtype: asked for, or under "auto" the one the checkpoint's config names."""

import json
import os
import shutil

import pytest
import torch

from deltaserve import LLM
from deltaserve.engine.engine_config import resolve_gdn_state_dtype


@pytest.mark.parametrize("asked, named, kept", [
    ("auto", None, "float32"), ("auto", "float32", "float32"), ("auto", "bfloat16", "bfloat16"),
    ("auto", "float16", "float32"), ("auto", "auto", "float32"),
    ("float32", "bfloat16", "float32"), ("bfloat16", "float32", "bfloat16"), ("bfloat16", None, "bfloat16"),
])
def test_auto_takes_the_configs_mamba_ssm_dtype_and_an_asked_dtype_wins(asked, named, kept):
    assert resolve_gdn_state_dtype(asked, named) == kept


def _naming(path: str, tmp_path, dtype: str) -> str:
    """A copy of the checkpoint whose config.json names `dtype` as its mamba_ssm_dtype."""
    copy = str(tmp_path / f"named_{dtype}")
    shutil.copytree(path, copy)
    with open(os.path.join(copy, "config.json")) as f:
        config = json.load(f)
    config["mamba_ssm_dtype"] = dtype
    with open(os.path.join(copy, "config.json"), "w") as f:
        json.dump(config, f)
    return copy


def test_a_checkpoint_naming_a_bfloat16_state_gets_one_unless_the_engine_asks_otherwise(checkpoint_factory, tmp_path):
    path = _naming(checkpoint_factory("qwen3.5"), tmp_path, "bfloat16")
    named = LLM(path, device="cpu", max_num_batched_tokens=64, warm_up=False)
    loaded = named.engine.loaded
    assert loaded.runner.state_pool.h_all.dtype == torch.bfloat16
    assert next(iter(loaded.snapshots.h.values())).dtype == torch.bfloat16
    asked = LLM(path, device="cpu", max_num_batched_tokens=64, warm_up=False, gdn_state_dtype="float32")
    assert asked.engine.loaded.runner.state_pool.h_all.dtype == torch.float32
    plain = LLM(checkpoint_factory("qwen3.5"), device="cpu", max_num_batched_tokens=64, warm_up=False)
    assert plain.engine.loaded.runner.state_pool.h_all.dtype == torch.float32
