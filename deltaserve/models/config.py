"""ModelConfig: the facts about a checkpoint that the engine needs, read from its config.json."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from deltaserve.errors import ShapeMismatchError, WeightLoadError
from deltaserve.models.fp8_checkpoint import fp8_weight_block

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass
class ModelConfig:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    # The longest context the config allows (its length keys, stretched by a rope scaling that extends them;
    # context_length_from says how), or None where the config names no length: max_model_len may not pass it.
    context_length: int | None = None
    context_length_from: str = ""
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    partial_rotary_factor: float = 1.0
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: list[str] = field(default_factory=list)
    # Qwen3-Next / Qwen3.5 specifics
    norm_offset: float = 0.0  # 1.0 where RMSNorm scales by (1 + w)
    qk_norm: bool = False
    attn_output_gate: bool = False
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    # mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: list[bool] = field(default_factory=list)
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None
    dtype: torch.dtype = torch.float32
    weight_prefix: str = "model."  # where the text model's tensors start
    num_mtp_layers: int = 0
    mamba_ssm_dtype: str | None = None  # the recurrent state's dtype the checkpoint asks for, if it names one
    # an FP8 checkpoint's scale blocks (rows, columns), or None for one scale a tensor or row (fp8_checkpoint.py)
    fp8_weight_block: tuple[int, int] | None = None
    fp8_weights: bool = False  # its linear weights are stored in FP8, dequantized as they are read

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION]

    @property
    def has_moe(self) -> bool:
        return any(self.moe_layers)

    @property
    def mtp_layer_idx(self) -> int:
        """The multi-token-prediction layer's id among the attention layers (its KV pool layer): past the
        model's own layers, as vLLM numbers it."""
        return self.num_layers

    @property
    def is_hybrid(self) -> bool:
        return bool(self.gdn_layers)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.gdn_value_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    def validate(self) -> None:
        for name, key in SIZES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name in POSITIVE else 0):
                raise ShapeMismatchError(f"the config's {key}={value!r}: must be an integer, "
                                         f"{'at least 1' if name in POSITIVE else 'at least 0'}")
        for name, key in (("rms_norm_eps", "rms_norm_eps"), ("rope_theta", "rope_theta")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ShapeMismatchError(f"the config's {key}={value!r}: must be a positive number")
        if self.num_heads % max(self.num_kv_heads, 1):
            raise ShapeMismatchError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        if self.is_hybrid and self.linear_num_value_heads % self.linear_num_key_heads:
            raise ShapeMismatchError(
                f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                f"linear_num_key_heads={self.linear_num_key_heads}"
            )
        if len(self.layer_types) != self.num_layers:
            raise ShapeMismatchError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")


# the keys a config must name (the rest have defaults)
REQUIRED_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# ModelConfig's sizes, by the config key they are read from
SIZES = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
         "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
         "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings",
         "linear_num_key_heads": "linear_num_key_heads", "linear_num_value_heads": "linear_num_value_heads",
         "linear_key_head_dim": "linear_key_head_dim", "linear_value_head_dim": "linear_value_head_dim",
         "linear_conv_kernel_dim": "linear_conv_kernel_dim", "num_experts": "num_experts",
         "num_experts_per_tok": "num_experts_per_tok", "moe_intermediate_size": "moe_intermediate_size",
         "shared_expert_intermediate_size": "shared_expert_intermediate_size"}
POSITIVE = {"hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"}


def _dtype_of(cfg: dict) -> torch.dtype:
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(name), torch.float32)


def _rope(cfg: dict) -> tuple[float, dict | None, float]:
    """(theta, scaling or None, partial_rotary_factor) from either the old or the rope_parameters form."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {}) or None
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rope_type = params.get("rope_type") or params.get("type")
    if rope_type and rope_type != "default":
        scaling = params
    if scaling and (scaling.get("rope_type") or scaling.get("type")) in (None, "default"):
        scaling = None
    return float(theta), scaling, float(partial)


# The keys a config may name its context length by (vLLM reads the same); where several are named the
# smallest holds, and model_max_length, where named, over them all.
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_target_positions",
                       "max_sequence_length", "max_seq_length", "seq_len")
# Rope scalings whose max_position_embeddings already counts the stretch, so that their factor is not applied again
PRESTRETCHED_ROPE_TYPES = ("llama3", "longrope", "su")


def _named_context_length(cfg: dict) -> tuple[int, str] | None:
    """(length, the key naming it), or None where the config names none."""
    def named(key):
        value = cfg.get(key)
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    if named("model_max_length"):
        return cfg["model_max_length"], "model_max_length"
    found = [(cfg[key], key) for key in CONTEXT_LENGTH_KEYS if named(key)]
    return min(found) if found else None


def context_length(cfg: dict, scaling: dict | None) -> tuple[int, str] | None:
    """(the longest context the config allows, how it is read), or None where it names no length. A rope
    scaling that stretches positions (linear, dynamic, yarn) extends the context by its factor: yarn's from its
    original_max_position_embeddings."""
    named = _named_context_length(cfg)
    if named is None:
        return None
    length, key = named
    rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if not scaling or rope_type in PRESTRETCHED_ROPE_TYPES:
        return length, f"{key}={length}"
    factor = scaling.get("factor") or 1.0  # a null factor stretches nothing
    if rope_type == "yarn" and scaling.get("original_max_position_embeddings"):
        length, key = scaling["original_max_position_embeddings"], "original_max_position_embeddings"
    if factor == 1.0:
        return length, f"{key}={length}"
    return int(length * factor), f"{key}={length} times the {rope_type} rope scaling factor {factor:g}"


def _eos_ids(cfg: dict) -> list[int]:
    eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]


def parse_model_config(raw: dict, architecture: str) -> ModelConfig:
    """Reads a Hugging Face config.json dict; the text model's fields for the multimodal wrappers."""
    cfg = raw.get("text_config", raw) if architecture.endswith("ForConditionalGeneration") else raw
    if not isinstance(cfg, dict):
        raise WeightLoadError(f"the config's text_config is {type(cfg).__name__}, not an object")
    missing = [key for key in REQUIRED_KEYS if key not in cfg]
    if missing:
        raise WeightLoadError(f"the config has no {', '.join(missing)} (a {architecture} config names them)")
    for key in REQUIRED_KEYS:
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ShapeMismatchError(f"the config's {key}={cfg[key]!r}: must be an integer, at least 1")
    try:
        return _parse(raw, cfg, architecture)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:  # a field of the wrong kind
        raise WeightLoadError(f"the config cannot be read as a {architecture} config "
                              f"({type(exc).__name__}: {exc})") from exc


def _parse(raw: dict, cfg: dict, architecture: str) -> ModelConfig:
    heads = cfg["num_attention_heads"]
    theta, scaling, partial = _rope(cfg)
    hybrid_family = architecture.startswith(("Qwen3Next", "Qwen3_5"))
    num_layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types") if hybrid_family else None
    if hybrid_family and not layer_types:
        interval = cfg.get("full_attention_interval", 4)
        layer_types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)]
    layer_types = layer_types or [FULL_ATTENTION] * num_layers
    num_experts = cfg.get("num_experts", 0) or 0
    sparse_step = cfg.get("decoder_sparse_step", 1) or 1
    mlp_only = set(cfg.get("mlp_only_layers", []) or [])
    moe_layers = [num_experts > 0 and i not in mlp_only and (i + 1) % sparse_step == 0 for i in range(num_layers)]
    config = ModelConfig(
        architecture=architecture,
        hidden_size=cfg["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg.get("intermediate_size", 0) or 0,
        vocab_size=cfg["vocab_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))),
        rope_theta=theta,
        rope_scaling=scaling,
        partial_rotary_factor=partial,
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        layer_types=list(layer_types),
        norm_offset=1.0 if hybrid_family else 0.0,
        qk_norm=architecture.startswith(("Qwen3ForCausalLM", "Qwen3Next", "Qwen3_5")),
        attn_output_gate=hybrid_family,
        linear_num_key_heads=cfg.get("linear_num_key_heads", 0) or 0,
        linear_num_value_heads=cfg.get("linear_num_value_heads", 0) or 0,
        linear_key_head_dim=cfg.get("linear_key_head_dim", 0) or 0,
        linear_value_head_dim=cfg.get("linear_value_head_dim", 0) or 0,
        linear_conv_kernel_dim=cfg.get("linear_conv_kernel_dim", 4) or 4,
        num_experts=num_experts,
        num_experts_per_tok=cfg.get("num_experts_per_tok", 0) or 0,
        moe_intermediate_size=cfg.get("moe_intermediate_size", 0) or 0,
        shared_expert_intermediate_size=cfg.get("shared_expert_intermediate_size", 0) or 0,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        moe_layers=moe_layers,
        eos_token_ids=_eos_ids(cfg) or _eos_ids(raw),
        bos_token_id=cfg.get("bos_token_id", raw.get("bos_token_id")),
        dtype=_dtype_of(cfg if ("dtype" in cfg or "torch_dtype" in cfg) else raw),
        weight_prefix="model.language_model." if architecture.endswith("ForConditionalGeneration") else "model.",
        num_mtp_layers=cfg.get("mtp_num_hidden_layers", cfg.get("num_nextn_predict_layers", 0)) or 0,
        mamba_ssm_dtype=cfg.get("mamba_ssm_dtype", raw.get("mamba_ssm_dtype")),
    )
    allowed = context_length(cfg, scaling)
    if allowed is not None:
        config.context_length, config.context_length_from = allowed
    quantization = raw.get("quantization_config", cfg.get("quantization_config"))
    if quantization is not None:  # refused here, before a weight is read, unless it is FP8
        config.fp8_weight_block, config.fp8_weights = fp8_weight_block(quantization), True
    config.validate()
    return config
