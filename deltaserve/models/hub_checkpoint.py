"""A Hugging Face repo id (`org/name`) given where a model path goes: the checkpoint's snapshot in the local
hub cache, downloaded there first where the cache lacks its weights and the hub may be reached.

The cache comes first, without a request to the hub, so that a machine with no network (or a start-up that
should not wait on one) serves what it already holds. `HF_HUB_CACHE` / `HF_HOME` place the cache and
`HF_HUB_OFFLINE=1` forbids the download, as for every other Hugging Face library."""

from __future__ import annotations

import glob
import os
import re

from deltaserve.errors import WeightLoadError

# What the engine reads from a checkpoint: the config, the weights and the tokenizer with its chat template.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "merges.txt", "vocab.txt"]

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def looks_like_repo_id(model: str) -> bool:
    """`org/name`, the form the hub names a repository by (a relative path of two parts looks the same, so
    this is asked only of a model path that does not exist)."""
    return _REPO_ID.fullmatch(model) is not None and ".." not in model


def hub_checkpoint(repo_id: str, revision: str | None = None, cache_dir: str | None = None,
                   token: str | bool | None = None) -> str:
    """The directory of `repo_id`'s checkpoint (at `revision`, the default branch if None) in the hub cache
    (`cache_dir`, the Hugging Face one if None), downloading it there if needed with `token` (vLLM's hf_token:
    a token, True for the one `hf auth login` stored, None for HF_TOKEN or that one)."""
    from huggingface_hub import constants, snapshot_download

    cached = _cached_snapshot(repo_id, revision, cache_dir)
    if cached is not None:
        return cached
    name = repo_id if revision is None else f"{repo_id}@{revision}"
    where = f"the Hugging Face cache ({cache_dir or constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise WeightLoadError(f"model {name!r} is neither a local path nor in {where}, and HF_HUB_OFFLINE is "
                              "set: download it there first, or give a checkpoint directory or a .gguf file")
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=CHECKPOINT_FILES,
                                 token=token)
    except Exception as e:  # the hub's errors are many (network, gated, not found): each names itself
        raise WeightLoadError(f"model {name!r} is neither a local path nor in {where}, and downloading it "
                              f"failed: {type(e).__name__}: {_one_line(e)}") from e
    if not _has_weights(path):
        raise WeightLoadError(f"model {name!r} on the hub has no .safetensors weights")
    return path


def _cached_snapshot(repo_id: str, revision: str | None, cache_dir: str | None) -> str | None:
    """The cached snapshot of the repo at that revision, if it holds weights (a cache that holds only a
    config, as a tokenizer or config lookup leaves it, is not a checkpoint)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except LocalEntryNotFoundError:
        return None
    return path if _has_weights(path) else None


def _has_weights(path: str) -> bool:
    return bool(glob.glob(os.path.join(path, "*.safetensors")))


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or "no message"
