"""The command line's engine options reach the engine's configuration."""

import random

import pytest
import torch

from deltaserve import LLM
from deltaserve.cli import _build_parser, _parse, byte_count, token_count
from deltaserve.engine.engine_config import EngineConfig
from deltaserve.errors import DeltaServeError
from deltaserve.server.launcher import engine_kwargs
from tests.fp8_checkpoints import write_fp8_pair


def test_serve_options_become_engine_config_fields():
    args = _build_parser().parse_args(["serve", "--gdn-state-dtype", "bfloat16", "--no-prefix-caching",
                                       "--ssm-snapshot-interval", "512", "--decode-snapshot-interval", "64",
                                       "--enforce-eager", "--max-num-seqs", "8", "--load-format", "dummy",
                                       "--gpu-memory-utilization", "0.5", "--generation-config", "vllm",
                                       "--revision", "v2", "--download-dir", "/models", "--max-logprobs", "-1"])
    kwargs = engine_kwargs(args)
    assert kwargs == {"gdn_state_dtype": "bfloat16", "enable_prefix_caching": False, "ssm_snapshot_interval": 512,
                      "decode_snapshot_interval": 64, "enforce_eager": True, "max_num_seqs": 8, "load_format": "dummy",
                      "gpu_memory_utilization": 0.5, "generation_config": "vllm", "revision": "v2",
                      "download_dir": "/models", "max_logprobs": -1}
    config = EngineConfig(**kwargs)
    assert config.gdn_state_dtype == "bfloat16" and config.max_num_seqs == 8
    assert "gdn_state_dtype" not in engine_kwargs(_build_parser().parse_args(["serve"]))  # the default rules
    vllm_name = _build_parser().parse_args(["serve", "--mamba-ssm-cache-dtype", "float32"])  # vLLM's name for it
    assert engine_kwargs(vllm_name)["gdn_state_dtype"] == "float32"


def test_an_unknown_state_dtype_is_refused():
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["serve", "--gdn-state-dtype", "float16"])
    with pytest.raises(DeltaServeError, match="gdn_state_dtype='int8'"):
        EngineConfig(gdn_state_dtype="int8")


@pytest.mark.parametrize("share", [0, 1.5, -0.1, True, "0.9"])
def test_a_memory_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(DeltaServeError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=share)


def test_token_counts_take_vllms_suffixes():
    whole, tenths = random.randint(1, 999), random.randint(0, 9)
    suffix, scale = random.choice([("k", 10**3), ("m", 10**6), ("K", 2**10), ("M", 2**20)])
    args = _build_parser().parse_args(["serve", "--max-model-len", f"{whole}{suffix}",
                                       "--max-num-batched-tokens", str(whole)])
    assert engine_kwargs(args)["max_model_len"] == whole * scale
    assert engine_kwargs(args)["max_num_batched_tokens"] == whole
    assert token_count(f"{whole}.{tenths}k") == whole * 1000 + tenths * 100  # decimal suffixes take fractions
    for bad in (f"{whole}.5K", f"{whole}.0001k", "k", f"{whole}x", f"-{whole}k", f"{whole}.5"):
        with pytest.raises(SystemExit):
            _build_parser().parse_args(["serve", "--max-model-len", bad])
    for auto in ("auto", "AUTO", "-1"):  # vLLM's: the model's own, as when unset
        assert "max_model_len" not in engine_kwargs(_build_parser().parse_args(["serve", "--max-model-len", auto]))


def test_the_kv_cache_budget_takes_vllms_byte_suffixes():
    """--kv-cache-memory-bytes reads as vLLM's human-readable integers (it was refused); t and T, a tera, too."""
    whole, tenths = random.randint(1, 999), random.randint(0, 9)
    suffix, scale = random.choice([("k", 10**3), ("m", 10**6), ("g", 10**9), ("t", 10**12), ("K", 2**10),
                                   ("M", 2**20), ("G", 2**30), ("T", 2**40)])
    args = _build_parser().parse_args(["serve", "--kv-cache-memory-bytes", f"{whole}{suffix}"])
    assert engine_kwargs(args) == {"kv_cache_memory_bytes": whole * scale}
    assert EngineConfig(**engine_kwargs(args)).kv_cache_memory_bytes == whole * scale
    assert byte_count(f"{whole}.{tenths}g") == whole * 10**9 + tenths * 10**8
    assert byte_count(str(whole)) == whole and token_count(f"{whole}T") == whole * 2**40
    assert "kv_cache_memory_bytes" not in engine_kwargs(_build_parser().parse_args(["serve"]))
    assert engine_kwargs(_parse(["chat", "--kv-cache-memory-bytes", "8G"])) == {"kv_cache_memory_bytes": 8 * 2**30}
    for bad in ("0", f"-{whole}", f"{whole}.5G", "G", f"{whole}B", f"{whole}.5"):
        with pytest.raises(SystemExit):
            _build_parser().parse_args(["serve", "--kv-cache-memory-bytes", bad])


@pytest.mark.parametrize("field, value", [("num_kv_blocks", -1), ("num_kv_blocks", 0), ("seed", "x"),
                                          ("seed", 2**64), ("enforce_eager", "no"), ("enable_prefix_caching", "yes"),
                                          ("async_scheduling", 1), ("cpu_kv_cache_gib", -1), ("device", None),
                                          ("dtype", 5)])
def test_engine_settings_of_the_wrong_kind_are_named(field, value):
    """A string where a switch goes would read as true, a negative pool size failed deep in torch."""
    with pytest.raises(DeltaServeError, match=f"{field}="):
        EngineConfig(**{field: value})


def test_vllms_names_for_engine_options():
    parse = _build_parser().parse_args
    blocks = random.randint(16, 4096)
    assert engine_kwargs(parse(["serve", "--num-gpu-blocks-override", str(blocks)])) == {"num_kv_blocks": blocks}
    assert engine_kwargs(parse(["serve", "--async-scheduling"])) == {"async_scheduling": True}
    assert engine_kwargs(parse(["serve", "--no-async-scheduling"])) == {"async_scheduling": False}
    assert "async_scheduling" not in engine_kwargs(parse(["chat"]))
    content_format = random.choice(["auto", "string", "openai"])
    assert engine_kwargs(parse(["serve", "--chat-template-content-format", content_format])) == {
        "chat_template_content_format": content_format}
    with pytest.raises(DeltaServeError, match="chat_template_content_format='parts'"):
        EngineConfig(chat_template_content_format="parts")
    policy = random.choice(["fcfs", "priority"])
    assert engine_kwargs(parse(["serve", "--scheduling-policy", policy])) == {"scheduling_policy": policy}
    assert engine_kwargs(parse(["chat", "--scheduling-policy", policy])) == {"scheduling_policy": policy}
    assert "scheduling_policy" not in engine_kwargs(parse(["serve"]))  # the engine's fcfs
    with pytest.raises(DeltaServeError, match="scheduling_policy='lifo': give one of fcfs, priority"):
        EngineConfig(scheduling_policy="lifo")



@pytest.mark.parametrize("value", ["0", "-1", str(-random.randint(2, 100))])
def test_a_queue_length_below_one_is_refused_by_name(value, capsys, tmp_path):
    """0 or less would refuse every request with a 503; from a config file the value meets the same check."""
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["serve", "--max-queue", value])
    assert "--max-queue" in capsys.readouterr().err
    config = tmp_path / "serve.yaml"
    config.write_text(f"max-queue: {value}\n")
    with pytest.raises(SystemExit):
        _parse(["serve", "--config", str(config)])
    assert "--max-queue" in capsys.readouterr().err
    assert _build_parser().parse_args(["serve", "--max-queue", "1"]).max_queue == 1


def test_vllms_checkpoint_format_flags(checkpoint_factory, tmp_path):
    """--load-format safetensors / gguf name the checkpoint's own format, --quantization fp8 an FP8 checkpoint's,
    and --mamba-cache-dtype the GDN state's dtype where --mamba-ssm-cache-dtype does not name it."""
    parse = _build_parser().parse_args
    dtype = random.choice(["float32", "bfloat16"])
    assert engine_kwargs(parse(["serve", "--mamba-cache-dtype", dtype])) == {"gdn_state_dtype": dtype}
    assert engine_kwargs(parse(["serve", "--mamba-cache-dtype", dtype, "--mamba-ssm-cache-dtype", "float32"])) == {
        "gdn_state_dtype": "float32"}
    assert engine_kwargs(parse(["serve", "-q", "fp8", "--load-format", "safetensors"])) == {
        "quantization": "fp8", "load_format": "safetensors"}
    with pytest.raises(DeltaServeError, match="quantization='awq': deltaserve quantizes no weights itself"):
        EngineConfig(quantization="awq")
    with pytest.raises(DeltaServeError, match="load_format='pt': give one of auto, dummy, safetensors, gguf"):
        EngineConfig(load_format="pt")
    path = checkpoint_factory("qwen3.5")
    with pytest.raises(DeltaServeError, match="load_format='gguf', but .* is a safetensors checkpoint"):
        LLM(path, device="cpu", load_format="gguf")
    with pytest.raises(DeltaServeError, match="quantization='fp8': .* is no FP8 checkpoint"):
        LLM(path, device="cpu", quantization="fp8")
    llm = LLM(path, device="cpu", load_format="safetensors", mamba_cache_dtype="bfloat16")
    assert llm.engine.loaded.runner.state_pool.h_all.dtype == torch.bfloat16
    fp8, _ = write_fp8_pair(path, tmp_path, (4, 4))
    assert LLM(fp8, device="cpu", quantization="fp8").generate([[5, 6]], use_tqdm=False)[0].outputs[0].token_ids
