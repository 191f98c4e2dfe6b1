"""EngineConfig: the user's knobs, resolved against the machine and the model."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from deltaserve.chat_content_format import CONTENT_FORMATS
from deltaserve.engine.load_formats import LOAD_FORMATS
from deltaserve.engine.profiler import ProfilerConfig
from deltaserve.engine.speculative_config import SpeculativeConfig
from deltaserve.engine.waiting_queue import SCHEDULING_POLICIES
from deltaserve.errors import DeltaServeError
from deltaserve.sampling_params import LOGPROBS_MODES, MAX_LOGPROBS

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    model: str | None = None
    revision: str | None = None  # a hub revision (branch, tag or commit) where `model` is a repo id
    download_dir: str | None = None  # the hub cache to read and download a repo id's checkpoint in
    hf_token: str | bool | None = None  # vLLM's: the hub token a download takes (True: the stored login's)
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    seed: int = 0
    enable_prefix_caching: bool = True
    ssm_snapshot_slots: int | None = None  # GDN state snapshots for the prefix cache (default: sized to memory)
    ssm_snapshot_interval: int = 1024  # also save a snapshot every this many prompt tokens
    # While decoding, a snapshot every this many tokens: each copies the sequence's whole state (48 MiB
    # on the 9B shape in fp32; 3.96 ms for 128 sequences, 2.5% of their decode at every 16-token block).
    decode_snapshot_interval: int = 256
    # The GDN layers' recurrent state (and its snapshots): "auto" takes the dtype a checkpoint's config names in
    # mamba_ssm_dtype (float32 or bfloat16, as vLLM does) and float32 where it names none; bfloat16 halves the
    # bytes a decode step reads and writes for it (resolve_gdn_state_dtype).
    gdn_state_dtype: str = "auto"
    enforce_eager: bool = False
    async_scheduling: bool = True  # plan the next decode step while the GPU runs this one
    # vLLM's: "fcfs" serves requests in order of arrival (a request's priority must be 0); "priority" admits the
    # lowest priority value first and preempts the largest first, ties by arrival (engine/waiting_queue.py)
    scheduling_policy: str = "fcfs"
    warm_up: bool | None = None  # prefill steps at start-up that compile their kernels (None: on a GPU)
    gpu_memory_utilization: float = 0.9
    # vLLM's: the cache's size in bytes, in place of gpu_memory_utilization (and of cpu_kv_cache_gib on the CPU);
    # the GDN state and snapshot slots come out of it, as vLLM's mamba state pages share its KV budget
    kv_cache_memory_bytes: int | None = None
    # Sampling defaults for fields a request leaves unset: "auto" (the checkpoint's generation_config.json),
    # "vllm" (the API's own), or a directory holding a generation_config.json (engine/sampling_defaults.py)
    generation_config: str = "auto"
    override_generation_config: dict | None = None  # vLLM's: generation_config.json values over those
    chat_template: str | None = None  # a file or the template's text, in place of the checkpoint's
    # how the chat template is given a message's content: "string", "openai" (parts) or "auto" (read from it)
    chat_template_content_format: str = "auto"
    cpu_kv_cache_gib: float = 1.0
    max_logprobs: int = MAX_LOGPROBS  # vLLM's: the most logprobs a request may ask a token; -1: the whole vocabulary
    # vLLM's: what a sampled token's logprobs report (LOGPROBS_MODES); prompt logprobs are always raw_logprobs
    logprobs_mode: str = "raw_logprobs"
    # "dummy": random weights in the checkpoint's shapes (benchmarks); vLLM's "safetensors" and "gguf" name the
    # checkpoint's own format (model_setup.check_checkpoint_format)
    load_format: str = "auto"
    # vLLM's: None, or "fp8" for an FP8 checkpoint's own weights (deltaserve quantizes no weights itself)
    quantization: str | None = None
    # vLLM's: a ProfilerConfig or a dict of its fields; with a profiler, start_profile / stop_profile trace the
    # steps between them (engine/profiler.py)
    profiler_config: Any = None
    # vLLM's: a SpeculativeConfig or {"method": "mtp", "num_speculative_tokens": k}: the model's MTP head drafts k
    # tokens a step, verified in the next (runner/speculative_step.py)
    speculative_config: Any = None

    def __post_init__(self):
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise DeltaServeError(f"chat_template_content_format={self.chat_template_content_format!r}: give one of "
                                  f"{', '.join(CONTENT_FORMATS)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "ssm_snapshot_interval",
                     "decode_snapshot_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeltaServeError(f"{name}={value!r}: must be a positive integer")
        slots = self.ssm_snapshot_slots
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 0):
            raise DeltaServeError(f"ssm_snapshot_slots={slots!r}: must be an integer >= 0")
        if self.gdn_state_dtype != "auto" and self.gdn_state_dtype not in GDN_STATE_DTYPES:
            raise DeltaServeError(f"gdn_state_dtype={self.gdn_state_dtype!r}: must be auto or one of "
                                  f"{', '.join(GDN_STATE_DTYPES)}")
        cap = self.max_logprobs
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < -1:
            raise DeltaServeError(f"max_logprobs={cap!r}: must be an integer >= 0, or -1 for the whole vocabulary")
        if self.hf_token is not None and not isinstance(self.hf_token, (str, bool)):
            raise DeltaServeError(f"hf_token={type(self.hf_token).__name__}: give the token, or True for the "
                                  "stored login's")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise DeltaServeError(f"scheduling_policy={self.scheduling_policy!r}: give one of "
                                  f"{', '.join(SCHEDULING_POLICIES)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise DeltaServeError(f"logprobs_mode={self.logprobs_mode!r}: give one of {', '.join(LOGPROBS_MODES)}")
        self.profiler_config = ProfilerConfig.from_value(self.profiler_config)
        self.speculative_config = SpeculativeConfig.from_value(self.speculative_config)
        if self.load_format not in LOAD_FORMATS:
            raise DeltaServeError(f"load_format={self.load_format!r}: give one of {', '.join(LOAD_FORMATS)} "
                                  "(deltaserve reads safetensors and GGUF checkpoints)")
        if self.quantization not in (None, "fp8"):
            raise DeltaServeError(f"quantization={self.quantization!r}: deltaserve quantizes no weights itself; an "
                                  "FP8 checkpoint loads as it is (quantization 'fp8' or none)")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise DeltaServeError(f"gpu_memory_utilization={utilization!r}: must be in (0, 1]")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise DeltaServeError(f"generation_config={self.generation_config!r}: give 'auto', 'vllm' or a directory")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise DeltaServeError(f"max_model_len={self.max_model_len!r}: must be an integer >= 2")
        budget = self.kv_cache_memory_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise DeltaServeError(f"kv_cache_memory_bytes={budget!r}: must be a positive number of bytes (None: "
                                  "sized by gpu_memory_utilization)")
        blocks = self.num_kv_blocks
        if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
            raise DeltaServeError(f"num_kv_blocks={blocks!r}: must be a positive integer (None: sized to memory)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not -(2**63) <= self.seed < 2**63:
            raise DeltaServeError(f"seed={self.seed!r}: must be a 64-bit integer")
        for name in ("enable_prefix_caching", "enforce_eager", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):  # "no" would read as true
                raise DeltaServeError(f"{name}={getattr(self, name)!r}: must be True or False")
        if self.warm_up is not None and not isinstance(self.warm_up, bool):
            raise DeltaServeError(f"warm_up={self.warm_up!r}: must be True, False or None")
        gib = self.cpu_kv_cache_gib
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0:
            raise DeltaServeError(f"cpu_kv_cache_gib={gib!r}: must be a positive number of GiB")
        for name in ("dtype", "device"):
            if not isinstance(getattr(self, name), str):
                raise DeltaServeError(f"{name}={getattr(self, name)!r}: must be a string ('auto' by default)")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise DeltaServeError(f"device={device!r} is not a device torch knows: {e}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise DeltaServeError(f"device={device!r} but CUDA is not available on this machine")
    return resolved


GDN_STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_gdn_state_dtype(asked: str, config_names: str | None) -> str:
    """The recurrent state's dtype: the one asked for, or under "auto" the one the checkpoint's config names
    (mamba_ssm_dtype: the released Qwen3.5 configs name float32), float32 where it names none or one the
    kernels do not keep. vLLM falls back to the model dtype there; fp32 keeps the recurrence's precision."""
    if asked != "auto":
        return asked
    if config_names in GDN_STATE_DTYPES:
        return config_names
    if config_names not in (None, "auto"):
        log.warning("the config's mamba_ssm_dtype %r is not a GDN state dtype (%s): keeping float32", config_names,
                    ", ".join(GDN_STATE_DTYPES))
    return "float32"


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float": torch.float32}


def resolve_dtype(dtype: str, checkpoint_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else checkpoint_dtype
    if dtype not in DTYPES:
        raise DeltaServeError(f"dtype={dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
