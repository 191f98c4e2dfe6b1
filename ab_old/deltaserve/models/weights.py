"""Reading checkpoint tensors: one safetensors file, or shards listed by an index file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch

from deltaserve.errors import WeightLoadError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def safetensors_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, INDEX_FILE)
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise WeightLoadError(f"cannot read the shard index {index}: {e}") from e
        files = [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
    elif os.path.exists(os.path.join(model_dir, SINGLE_FILE)):
        files = [os.path.join(model_dir, SINGLE_FILE)]
    else:
        found = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
        if not found:
            raise WeightLoadError(
                f"no weights in {model_dir}: expected {SINGLE_FILE}, {INDEX_FILE} with its shards, or *.safetensors"
            )
        files = [os.path.join(model_dir, n) for n in found]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise WeightLoadError(f"weight file(s) listed but missing: {', '.join(missing)}")
    return files


def iterate_safetensors(files: list[str], device: str | torch.device = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in files:
        try:
            with safe_open(path, framework="pt", device=str(device)) as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except WeightLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt headers/data
            raise WeightLoadError(f"cannot read weight file {path}: {e}") from e
