"""Maps Hugging Face tensor names onto DecoderLM parameters, fusing and reordering where the model
keeps a fused layout (qkv, gate/up, GDN input projections, stacked experts)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import torch

from deltaserve.errors import ShapeMismatchError, WeightLoadError
from deltaserve.models.config import ModelConfig
from deltaserve.models.decoder import DecoderLM
from deltaserve.models.layers.moe import SparseMoE

log = logging.getLogger(__name__)

LAYER = re.compile(r"layers\.(\d+)\.(.+)")
SKIPPED_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.")
MTP_PREFIX = "mtp."
MTP_NORMS = ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight")


def load_weights(model: DecoderLM, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copies every tensor into place, then checks that no parameter was left unfilled."""
    config = model.config
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))  # a parameter still NaN after loading was missing from the checkpoint
        skipped_vision = skipped_mtp = 0
        for name, tensor in tensors:
            if name.startswith(SKIPPED_PREFIXES):
                skipped_vision += 1
            elif name.startswith(MTP_PREFIX) and model.mtp is None:
                skipped_mtp += 1
            else:
                _load_one(model, config, name, tensor)
        if skipped_vision:
            log.info("skipped %d vision tensors (text generation only)", skipped_vision)
        if skipped_mtp:
            log.info("skipped %d multi-token-prediction tensors (the model was built without its MTP head)",
                     skipped_mtp)
        _zero_padding(model)
        _check_filled(model)


def _load_one(model: DecoderLM, config: ModelConfig, name: str, tensor: torch.Tensor) -> None:
    if name.startswith(MTP_PREFIX):
        _load_mtp(model.mtp, config, name[len(MTP_PREFIX):], tensor, name)
        return
    if name == "lm_head.weight":
        if not config.tie_word_embeddings:
            _copy(model.lm_head, tensor, name)
        return
    prefix = config.weight_prefix
    if not name.startswith(prefix):
        log.warning("ignoring unexpected tensor %s", name)
        return
    local = name[len(prefix):]
    if local == "embed_tokens.weight":
        _copy(model.embed_tokens, tensor, name)
    elif local == "norm.weight":
        _copy(model.norm.weight, tensor, name)
    elif match := LAYER.fullmatch(local):
        index, rest = int(match.group(1)), match.group(2)
        if index >= config.num_layers:
            raise ShapeMismatchError(f"{name}: layer {index} but the config has {config.num_layers} layers")
        _load_layer(model.layers[index], config, rest, tensor, name)
    elif "rotary_emb" not in local:
        log.warning("ignoring unexpected tensor %s", name)


def _load_mtp(mtp, config: ModelConfig, local: str, tensor: torch.Tensor, name: str) -> None:
    """mtp.* tensors: its fc and norms, and its decoder layer named as a main layer's. Layers past the ones
    built (MultiTokenPredictor keeps the first) are left unread."""
    if local == "fc.weight":
        _copy(mtp.fc, tensor, name)
    elif local in MTP_NORMS:
        _copy(getattr(mtp, local.split(".")[0]).weight, tensor, name)
    elif match := LAYER.fullmatch(local):
        index, rest = int(match.group(1)), match.group(2)
        if index < len(mtp.layers):
            _load_layer(mtp.layers[index], config, rest, tensor, name)
    else:
        log.warning("ignoring unexpected tensor %s", name)


def _load_layer(layer, config: ModelConfig, rest: str, tensor: torch.Tensor, name: str) -> None:
    if rest in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        _copy(getattr(layer, rest.split(".")[0]).weight, tensor, name)
    elif rest.startswith("self_attn."):
        _load_attention(layer.mixer, rest[len("self_attn."):], tensor, name)
    elif rest.startswith("linear_attn."):
        _load_gdn(layer.mixer, config, rest[len("linear_attn."):], tensor, name)
    elif rest.startswith("mlp."):
        _load_mlp(layer.mlp, config, rest[len("mlp."):], tensor, name)
    elif "rotary_emb" not in rest:
        log.warning("ignoring unexpected tensor %s", name)


def _load_attention(attn, rest: str, tensor: torch.Tensor, name: str) -> None:
    q, kv = attn.q_size, attn.kv_size
    rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
    proj, kind = rest.split(".", 1) if "." in rest else (rest, "")
    if proj in rows:
        target = attn.qkv_proj if kind == "weight" else attn.qkv_bias
        _copy(_require(target, name)[slice(*rows[proj])], tensor, name)
    elif proj == "o_proj":
        _copy(_require(attn.o_proj if kind == "weight" else attn.o_bias, name), tensor, name)
    elif proj in ("q_norm", "k_norm"):
        _copy(_require(getattr(attn, proj), name), tensor, name)
    else:
        raise WeightLoadError(f"unexpected attention tensor {name}")


def _load_gdn(gdn, config: ModelConfig, rest: str, tensor: torch.Tensor, name: str) -> None:
    conv, value, heads = gdn.conv_dim, gdn.value_size, gdn.num_v_heads
    fused_rows = {
        "in_proj_qkv.weight": (0, conv),
        "in_proj_z.weight": (conv, conv + value),
        "in_proj_b.weight": (conv + value, conv + value + heads),
        "in_proj_a.weight": (conv + value + heads, conv + value + 2 * heads),
    }
    if rest in fused_rows:
        _copy(gdn.in_proj[slice(*fused_rows[rest])], tensor, name)
    elif rest == "in_proj_qkvz.weight":
        _copy(gdn.in_proj[: conv + value], _unpack_qkvz(tensor, config, name), name)
    elif rest == "in_proj_ba.weight":
        _copy(gdn.in_proj[conv + value :], _unpack_ba(tensor, config, name), name)
    elif rest == "conv1d.weight":
        _copy(gdn.conv_weight, tensor.reshape(tensor.shape[0], -1) if tensor.dim() == 3 else tensor, name)
    elif rest in ("A_log", "dt_bias"):
        _copy(getattr(gdn, rest), tensor, name)
    elif rest == "norm.weight":
        _copy(gdn.norm_weight, tensor, name)
    elif rest == "out_proj.weight":
        _copy(gdn.out_proj, tensor, name)
    else:
        raise WeightLoadError(f"unexpected linear-attention tensor {name}")


def _unpack_qkvz(tensor: torch.Tensor, config: ModelConfig, name: str) -> torch.Tensor:
    """Qwen3-Next packs rows per key-head group as [q, k, v (ratio heads), z (ratio heads)]; the
    model's layout is [all q | all k | all v | all z]."""
    groups, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    ratio = config.linear_num_value_heads // groups
    per_group = 2 * dk + 2 * ratio * dv
    _expect_rows(tensor, groups * per_group, name)
    q, k, v, z = tensor.reshape(groups, per_group, -1).split([dk, dk, ratio * dv, ratio * dv], dim=1)
    return torch.cat([part.reshape(-1, tensor.shape[-1]) for part in (q, k, v, z)])


def _unpack_ba(tensor: torch.Tensor, config: ModelConfig, name: str) -> torch.Tensor:
    groups = config.linear_num_key_heads
    ratio = config.linear_num_value_heads // groups
    _expect_rows(tensor, groups * 2 * ratio, name)
    b, a = tensor.reshape(groups, 2 * ratio, -1).split([ratio, ratio], dim=1)
    return torch.cat([b.reshape(-1, tensor.shape[-1]), a.reshape(-1, tensor.shape[-1])])


EXPERT = re.compile(r"experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
SHARED_EXPERT = re.compile(r"shared_expert\.(gate_proj|up_proj|down_proj)\.weight")


def _load_mlp(mlp, config: ModelConfig, rest: str, tensor: torch.Tensor, name: str) -> None:
    if hasattr(mlp, "in_proj"):
        _load_moe(mlp, config, rest, tensor, name)
    elif hasattr(mlp, "gate_up_proj"):
        _load_dense(mlp, rest, tensor, name)
    else:
        raise WeightLoadError(f"unexpected MLP tensor {name}")


def _load_moe(moe, config: ModelConfig, rest: str, tensor: torch.Tensor, name: str) -> None:
    experts, inter, rows = config.num_experts, config.moe_intermediate_size, moe.rows
    if rest == "gate.weight":
        _copy(moe.in_proj[rows.router], tensor, name)
    elif rest == "shared_expert_gate.weight":
        _copy(moe.in_proj[_require(rows.shared_gate, name)], tensor, name)
    elif match := SHARED_EXPERT.fullmatch(rest):
        _copy(_shared_expert_target(moe, match.group(1), name), tensor, name)
    elif match := EXPERT.fullmatch(rest):
        expert, proj = int(match.group(1)), match.group(2)
        if expert >= experts:
            raise ShapeMismatchError(f"{name}: expert {expert} but the config has {experts}")
        target = {"gate_proj": moe.w13[expert, :inter], "up_proj": moe.w13[expert, inter:],
                  "down_proj": moe.w2[expert]}[proj]
        _copy(target, tensor, name)
    elif rest == "experts.gate_up_proj":  # all routed experts in one tensor; a fused shared expert follows them
        _copy(moe.w13[:experts], tensor, name)
    elif rest == "experts.down_proj":
        _copy(moe.w2[:experts], tensor, name)
    else:
        raise WeightLoadError(f"unexpected MoE tensor {name}")


def _shared_expert_target(moe, proj: str, name: str) -> torch.Tensor:
    """Stacked as expert E when fused (see SparseMoE); otherwise rows of the input GEMM and shared_down."""
    if moe.fused_shared:
        shared, inter = moe.num_experts, moe.shared_size
        return {"gate_proj": moe.w13[shared, :inter], "up_proj": moe.w13[shared, inter:],
                "down_proj": moe.w2[shared]}[proj]
    if proj == "down_proj":
        return _require(moe.shared_down, name)
    gate_up = moe.in_proj[_require(moe.rows.shared_gate_up, name)]
    half = moe.shared_size
    return gate_up[:half] if proj == "gate_proj" else gate_up[half:]


def _load_dense(mlp, rest: str, tensor: torch.Tensor, name: str) -> None:
    inter = mlp.down_proj.shape[1]
    proj, kind = rest.split(".", 1)
    halves = {"gate_proj": slice(0, inter), "up_proj": slice(inter, 2 * inter)}
    if proj in halves:
        target = mlp.gate_up_proj if kind == "weight" else mlp.gate_up_bias
        _copy(_require(target, name)[halves[proj]], tensor, name)
    elif proj == "down_proj":
        _copy(_require(mlp.down_proj if kind == "weight" else mlp.down_bias, name), tensor, name)
    else:
        raise WeightLoadError(f"unexpected MLP tensor {name}")


def _require(target, name: str):
    if target is None:
        raise WeightLoadError(f"{name} has no place in the model built from config.json (a bias the config disables?)")
    return target


def _expect_rows(tensor: torch.Tensor, rows: int, name: str) -> None:
    if tensor.dim() != 2 or tensor.shape[0] != rows:
        raise ShapeMismatchError(f"{name}: shape {tuple(tensor.shape)} does not match the config ({rows} rows)")


def _copy(target: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if tuple(target.shape) != tuple(tensor.shape):
        raise ShapeMismatchError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} does not match {tuple(target.shape)} implied by config.json"
        )
    target.copy_(tensor)


def _zero_padding(model: DecoderLM) -> None:
    """Rows that only align a fused GEMM's output have no checkpoint tensor."""
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.zero_padding()


def _check_filled(model: DecoderLM) -> None:
    missing = [name for name, p in model.named_parameters() if torch.isnan(p).any()]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        if any(name.startswith(MTP_PREFIX) for name in missing):
            shown += " (mtp.*: the multi-token-prediction head, built as asked)"
        raise WeightLoadError(f"the checkpoint lacks tensors for: {shown}")
