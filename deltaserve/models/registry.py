"""Which architectures deltaserve runs, and how a model path becomes a loaded DecoderLM."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import torch

from deltaserve.errors import ShapeMismatchError, UnsupportedArchitectureError, WeightLoadError
from deltaserve.models.config import ModelConfig, parse_model_config
from deltaserve.models.decoder import DecoderLM
from deltaserve.models.hub_checkpoint import hub_checkpoint, looks_like_repo_id
from deltaserve.models.fp8_checkpoint import dequantized
from deltaserve.models.loader import load_weights
from deltaserve.models.random_init import init_random_weights
from deltaserve.models.weights import iterate_safetensors, safetensors_files

log = logging.getLogger(__name__)

# Every architecture maps onto DecoderLM; what differs (norm offset, q/k norm, output gate, GDN
# packing, MoE) is read from the config by parse_model_config.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)


@dataclass
class ModelSource:
    """Where a model comes from: a Hugging Face directory or a GGUF file, and the hub's repo id where it was
    named by one (its snapshot directory's name is a commit hash)."""

    path: str
    is_gguf: bool
    repo_id: str | None = None

    @property
    def name(self) -> str:
        return self.repo_id or os.path.basename(os.path.normpath(self.path))


def resolve_model_source(model: str | None, revision: str | None = None,
                         download_dir: str | None = None, hf_token: str | bool | None = None) -> ModelSource:
    """`revision` and `download_dir` speak of the hub: a repo id's revision and the cache it is read from."""
    if revision is not None and (model is None or os.path.exists(model) or not looks_like_repo_id(model)):
        raise WeightLoadError(f"revision={revision!r} names a revision on the Hugging Face hub, but the model "
                              f"{model or '(the demo model)'!r} is not a repo id")
    if model is None:
        from deltaserve.models.gguf_loader import demo_model_path

        return ModelSource(demo_model_path(), True)
    if not os.path.exists(model):
        if looks_like_repo_id(model):
            return ModelSource(hub_checkpoint(model, revision, download_dir, hf_token), False, repo_id=model)
        raise WeightLoadError(f"model path {model!r} does not exist (give a checkpoint directory, a .gguf file "
                              "or a Hugging Face repo id)")
    if os.path.isfile(model):
        if model.endswith(".gguf") or _starts_as_gguf(model):  # a GGUF file by its magic, whatever its name
            return ModelSource(model, True)
        raise WeightLoadError(f"{model!r} is a file but not a GGUF file; give a checkpoint directory or a .gguf file")
    if not os.path.exists(os.path.join(model, "config.json")):
        gguf_files = sorted(name for name in os.listdir(model) if name.lower().endswith(".gguf"))
        if gguf_files:
            raise WeightLoadError(f"{model!r} has no config.json but holds GGUF files: name one of them, as "
                                  f"{os.path.join(model, gguf_files[0])!r} ({', '.join(gguf_files)})")
        raise WeightLoadError(f"{model!r} has no config.json")
    return ModelSource(model, False)


def _starts_as_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def read_architecture(raw: dict) -> str:
    archs = raw.get("architectures") or []
    if not isinstance(archs, list):
        raise UnsupportedArchitectureError(f"architectures={archs!r}: must be a list of class names, as "
                                           f"[{SUPPORTED_ARCHITECTURES[0]!r}]")
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise UnsupportedArchitectureError(
        f"architecture {archs or 'missing'} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def load_hf_config(model_dir: str) -> tuple[dict, ModelConfig]:
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise WeightLoadError(f"cannot read {path}: {e}") from e
    if not isinstance(raw, dict):
        raise WeightLoadError(f"{path} holds a JSON {type(raw).__name__}, not an object")
    try:
        return raw, parse_model_config(raw, read_architecture(raw))
    except (WeightLoadError, ShapeMismatchError) as e:  # named with the file they are about
        raise type(e)(f"{path}: {e}") from e


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device, max_positions: int,
                with_mtp: bool = False) -> DecoderLM:
    """with_mtp: with the checkpoint's multi-token-prediction head (model.mtp); a config without one refuses."""
    return DecoderLM(config, dtype, device, max_positions, with_mtp=with_mtp).eval()


def load_model(source: ModelSource, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_positions: int, gguf_tensors: dict | None = None, dummy: bool = False,
               with_mtp: bool = False) -> DecoderLM:
    model = build_model(config, dtype, device, max_positions, with_mtp=with_mtp)
    if dummy:
        init_random_weights(model)
    elif source.is_gguf:
        load_weights(model, gguf_tensors.items())
    else:  # tensors are read straight onto the model's device
        tensors = iterate_safetensors(safetensors_files(source.path), device)
        if config.fp8_weights:
            tensors = dequantized(tensors, config.fp8_weight_block)
        load_weights(model, tensors)
    return model
