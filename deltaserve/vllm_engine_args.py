"""vLLM's engine arguments that a script written for vLLM's `LLM(...)` passes, so that it runs on deltaserve as
it is: each is taken where deltaserve does what it asks (or always does it), renamed where deltaserve calls it
otherwise, and refused by name, with the reason, where it cannot. `vllm serve`'s flags of the same names are
checked here too (server/vllm_flags.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from deltaserve.engine.engine_config import EngineConfig
from deltaserve.errors import DeltaServeError

# taken and dropped: deltaserve runs no code from a checkpoint, keeps no periodic stats log, and on its one GPU
# holds every expert and has no all-reduce or worker processes to choose; it swaps nothing to the CPU (vLLM ignores
# swap_space too), and captures its own CUDA graphs of its own kernels
# (compilation_config's torch.compile and capture settings)
ACCEPTED = ("trust_remote_code", "disable_log_stats", "enable_expert_parallel", "disable_custom_all_reduce",
            "distributed_executor_backend", "swap_space", "compilation_config")
RENAMED = {"mamba_ssm_cache_dtype": "gdn_state_dtype", "num_gpu_blocks_override": "num_kv_blocks"}
# name -> (the values deltaserve does, why no other)
ONLY = {
    "tensor_parallel_size": ((1,), "deltaserve runs a model on one GPU"),
    "pipeline_parallel_size": ((1,), "deltaserve runs a model on one GPU"),
    "data_parallel_size": ((1,), "deltaserve runs a model on one GPU"),
    "enable_chunked_prefill": ((True, None), "deltaserve always prefills a prompt longer than "
                                             "max_num_batched_tokens in chunks"),
    "kv_cache_dtype": (("auto",), "the KV cache is kept in the model's dtype"),
    "tokenizer_mode": (("auto", "hf"), "deltaserve reads the checkpoint's own fast tokenizer"),
    "enable_lora": ((False, None), "deltaserve serves no LoRA adapters"),
    "hf_overrides": ((None,), "deltaserve reads the checkpoint's config.json as it is"),
    "enable_sleep_mode": ((False, None), "deltaserve keeps its weights on the GPU while it runs"),
    "cpu_offload_gb": ((0, 0.0, None), "deltaserve keeps every weight on the GPU"),
    "runner": (("auto", "generate", None), "deltaserve runs generative models only"),
    "skip_tokenizer_init": ((False, None), "deltaserve detokenizes with the checkpoint's tokenizer"),
}


def refusal(name: str, value: Any, model: str | None) -> str | None:
    """Why deltaserve cannot take vLLM's argument `name` (one of ONLY, or tokenizer) at this value; None where
    it can."""
    if name == "tokenizer":
        if value is None or value == model:
            return None
        return "deltaserve reads the tokenizer from the model's own checkpoint (name the model, or leave it out)"
    values, why = ONLY[name]
    if value in values and type(value) in {type(v) for v in values}:  # True is no size of 1
        return None
    shown = [repr(v) for v in values if v is not None and not isinstance(v, bool)]  # a switch: leave it out
    return f"{why} ({f'give {shown[0]}, or ' if shown else ''}leave it out)"


def engine_args_from_vllm(model: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """LLM's keyword arguments as EngineConfig's: vLLM's names translated or checked, any other name that
    EngineConfig lacks refused as Python refuses an unexpected argument."""
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    out = {}
    for name, value in kwargs.items():
        if name in ACCEPTED:
            continue
        if name in ONLY or name == "tokenizer":
            reason = refusal(name, value, model)
            if reason is not None:
                raise DeltaServeError(f"{name}={value!r}: {reason}")
        elif name == "mamba_cache_dtype":  # the whole cache's dtype: the GDN state's, where nothing names it
            if value is not None and "mamba_ssm_cache_dtype" not in kwargs and "gdn_state_dtype" not in kwargs:
                out["gdn_state_dtype"] = value
        elif name in RENAMED:
            if value is None:  # as if left out
                continue
            if RENAMED[name] in kwargs:
                raise DeltaServeError(f"{name} and {RENAMED[name]} name the same setting: give one of them")
            out[RENAMED[name]] = value
        elif name in fields:
            out[name] = value
        else:
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}")
    return out
