"""A Hugging Face repo id as the model: its snapshot in the local hub cache serves as the checkpoint
directory would, under the repo id's name; a repo the cache lacks is downloaded or refused by name."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import huggingface_hub.constants
import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.errors import WeightLoadError
from deltaserve.models.hub_checkpoint import looks_like_repo_id
from deltaserve.models.registry import resolve_model_source
from tests.server.live_server import REPO_ROOT

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache: str, repo_id: str, files_from: str, only: tuple[str, ...] | None = None,
               commit: str = COMMIT, branch: str = "main") -> str:
    """Lays a checkpoint out as the hub's cache does: the snapshot named by its commit, refs/BRANCH naming it."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(snapshot)
    for name in os.listdir(files_from):
        if only is None or name in only:
            shutil.copy(os.path.join(files_from, name), snapshot)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", branch), "w") as f:
        f.write(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache of this test's own, offline unless a test says otherwise, and a hub that refuses
    every connection (no request leaves the machine)."""
    cache = str(tmp_path / "hub")
    os.makedirs(cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    return cache


def test_repo_ids_are_told_from_paths():
    for repo_id in ("Qwen/Qwen3.5-9B", "meta-llama/Llama-3.1-8B-Instruct", "org/name_v2.1"):
        assert looks_like_repo_id(repo_id), repo_id
    for path in ("model", "a/b/c", "../x", "/abs/dir", "org/", "/org", "./x", "org/../x", "org name/x"):
        assert not looks_like_repo_id(path), path


def test_a_cached_repo_serves_as_its_directory_does(hub_cache, checkpoint_factory):
    directory = checkpoint_factory("qwen3.5")
    snapshot = cache_repo(hub_cache, "tiny-org/tiny-qwen3.5", directory)
    source = resolve_model_source("tiny-org/tiny-qwen3.5")
    assert (source.path, source.is_gguf, source.name) == (snapshot, False, "tiny-org/tiny-qwen3.5")

    prompt = [random.randrange(1, 200) for _ in range(random.randint(3, 12))]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    by_repo = LLM("tiny-org/tiny-qwen3.5", device="cpu", dtype="float32", max_model_len=128)
    by_path = LLM(directory, device="cpu", dtype="float32", max_model_len=128)
    assert by_repo.engine.model_name == "tiny-org/tiny-qwen3.5"
    tokens = by_repo.generate([prompt], params)[0].outputs[0].token_ids
    assert tokens == by_path.generate([prompt], params)[0].outputs[0].token_ids


def test_a_revision_and_a_download_dir_pick_the_snapshot(hub_cache, tmp_path, checkpoint_factory):
    main = cache_repo(hub_cache, "org/model", checkpoint_factory("llama"))
    other = "f" * 40
    branch = cache_repo(hub_cache, "org/model", checkpoint_factory("llama", seed=1), commit=other, branch="v2")
    assert resolve_model_source("org/model").path == main
    assert resolve_model_source("org/model", revision="v2").path == branch
    assert resolve_model_source("org/model", revision=other).path == branch  # a commit names its snapshot
    with pytest.raises(WeightLoadError, match="'org/model@v3' is neither a local path nor in the Hugging Face cache"):
        resolve_model_source("org/model", revision="v3")
    elsewhere = str(tmp_path / "elsewhere")
    moved = cache_repo(elsewhere, "org/model", checkpoint_factory("llama"))
    assert resolve_model_source("org/model", download_dir=elsewhere).path == moved
    with pytest.raises(WeightLoadError, match=f"'org/model@v2' is neither a local path nor in the Hugging Face "
                                              f"cache \\({elsewhere}\\)"):
        resolve_model_source("org/model", revision="v2", download_dir=elsewhere)


def test_a_revision_for_what_is_no_repo_id_is_refused(checkpoint_factory):
    for model in (None, checkpoint_factory("llama")):
        with pytest.raises(WeightLoadError, match="revision='main' names a revision on the Hugging Face hub"):
            resolve_model_source(model, revision="main")


def test_a_repo_the_cache_lacks_is_refused_by_name_offline(hub_cache, checkpoint_factory):
    # a cache holding only the config, as a config lookup leaves it, is not a checkpoint
    cache_repo(hub_cache, "org/config-only", checkpoint_factory("llama"), only=("config.json",))
    for repo_id in ("org/absent", "org/config-only"):
        with pytest.raises(WeightLoadError, match=f"'{repo_id}' is neither a local path nor in the Hugging Face "
                                                  f"cache \\({hub_cache}\\), and HF_HUB_OFFLINE is set"):
            resolve_model_source(repo_id)


def test_a_failed_download_names_the_repo_and_the_failure(hub_cache, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(WeightLoadError, match="'org/absent' is neither a local path nor in the Hugging Face cache "
                                              ".*, and downloading it failed: .*Error"):
        resolve_model_source("org/absent")


def test_a_path_that_is_no_repo_id_is_refused_as_a_path(tmp_path):
    with pytest.raises(WeightLoadError, match="model path '.*no/such/dir' does not exist"):
        resolve_model_source(str(tmp_path / "no" / "such" / "dir"))


def test_serve_names_the_missing_repo_and_exits(tmp_path):
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "deltaserve.cli", "serve", "org/absent", "--port", "0"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "error: model 'org/absent' is neither a local path nor in the Hugging Face cache" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_download_takes_the_token_given(hub_cache, monkeypatch, checkpoint_factory):
    """vLLM's hf_token (--hf-token): a token, or alone the stored login's; it was taken and dropped."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    from deltaserve.cli import _parse
    from deltaserve.server.launcher import engine_kwargs

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    asked = []

    def snapshot_download(repo_id, local_files_only=False, **kwargs):
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        asked.append(kwargs["token"])
        return checkpoint_factory("llama")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    token = f"hf_{random.randrange(10**9)}"
    for given in (token, True, None):
        assert resolve_model_source("org/gated", hf_token=given).path == checkpoint_factory("llama")
    assert asked == [token, True, None]
    assert engine_kwargs(_parse(["serve", "org/gated", "--hf-token", token]))["hf_token"] == token
    assert engine_kwargs(_parse(["serve", "org/gated", "--hf-token"]))["hf_token"] is True
    assert "hf_token" not in engine_kwargs(_parse(["serve", "org/gated"]))
