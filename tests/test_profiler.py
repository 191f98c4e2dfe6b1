"""vLLM's profiler_config, start_profile and stop_profile (engine/profiler.py): the torch profiler's trace of the
steps between them, written where the config says, its delay and step limit, and the refusals."""

from __future__ import annotations

import glob
import gzip
import json
import os
import random

import pytest

from deltaserve import LLM, DeltaServeError, SamplingParams
from deltaserve.engine.profiler import ProfilerConfig, ProfilerError

pytestmark = pytest.mark.timeout(300)


def _events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(scope="module")
def checkpoint(checkpoint_factory):
    return checkpoint_factory("qwen3.5")


def test_a_torch_trace_covers_the_steps_between_start_and_stop(checkpoint, tmp_path):
    folder = tmp_path / "traces"
    llm = LLM(checkpoint, device="cpu", profiler_config={"profiler": "torch", "torch_profiler_dir": str(folder)})
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)  # not traced
    prefix = f"run{random.randrange(10**6)}"
    llm.start_profile(prefix)
    llm.generate([[random.randrange(3, 300) for _ in range(9)]], SamplingParams(max_tokens=4), use_tqdm=False)
    llm.stop_profile()
    traces = glob.glob(str(folder / f"{prefix}_*.pt.trace.json.gz"))
    assert len(traces) == 1, os.listdir(folder)
    names = {e.get("name", "") for e in _events(traces[0])}
    assert any(n.startswith("aten::") for n in names)  # the steps' own operators
    assert glob.glob(str(folder / f"{prefix}_*_kernels.txt"))
    llm.stop_profile()  # not profiling: ignored, as vLLM's
    assert len(glob.glob(str(folder / "*.gz"))) == 1


def test_delay_and_step_limit(checkpoint, tmp_path):
    config = {"profiler": "torch", "torch_profiler_dir": str(tmp_path), "delay_iterations": 2, "max_iterations": 3,
              "torch_profiler_use_gzip": False, "torch_profiler_dump_cuda_time_total": False}
    llm = LLM(checkpoint, device="cpu", profiler_config=config, enable_prefix_caching=False)
    profiler = llm.engine.profiler
    llm.start_profile()
    llm.engine.add_request("a", [5, 6, 7, 8], SamplingParams(max_tokens=20, ignore_eos=True))
    running = []
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        running.append(profiler._running)
    # two steps of delay, the profiler starting at the second's end; three traced: the trace is written without
    # stop_profile
    assert running[:6] == [False, True, True, True, False, False], running
    assert [os.path.basename(p) for p in glob.glob(str(tmp_path / "deltaserve_*.pt.trace.json"))]
    llm.stop_profile()
    assert len(glob.glob(str(tmp_path / "*.json"))) == 1


def test_a_profiler_that_fails_never_fails_a_step(checkpoint, tmp_path):
    """A trace that cannot be written ends the profiling with a warning where a step ended it, and is named to a
    stop_profile call; the engine serves on either way."""
    config = {"profiler": "torch", "torch_profiler_dir": str(tmp_path), "max_iterations": random.randint(1, 2)}
    llm = LLM(checkpoint, device="cpu", profiler_config=config)

    def unwritable(prof):
        raise OSError(28, "No space left on device")

    llm.engine.profiler._write = unwritable
    llm.start_profile()
    prompt = [random.randrange(3, 300) for _ in range(5)]
    out = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 6 and not llm.engine.profiler.active
    llm.engine.profiler.config.max_iterations = 0  # no step ends it now: the stop call meets the failure
    llm.start_profile()
    llm.generate([prompt], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ProfilerError, match="did not stop and write its trace: .*No space left"):
        llm.stop_profile()
    assert len(llm.generate([prompt], SamplingParams(max_tokens=3, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids) == 3


def test_profiling_off_and_bad_configs_are_named(checkpoint, tmp_path):
    llm = LLM(checkpoint, device="cpu")
    with pytest.raises(DeltaServeError, match="profiling is off: start the engine with profiler_config"):
        llm.start_profile()
    with pytest.raises(DeltaServeError, match="profiler_config.torch_profiler_dri: not one of vLLM's"):
        ProfilerConfig.from_value({"profiler": "torch", "torch_profiler_dri": str(tmp_path)})
    with pytest.raises(DeltaServeError, match="the torch profiler needs a directory"):
        ProfilerConfig.from_value({"profiler": "torch"})
    with pytest.raises(DeltaServeError, match="profiler='nsys': give 'torch' or 'cuda'"):
        ProfilerConfig.from_value({"profiler": "nsys"})
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(DeltaServeError, match="torch_profiler_dir=.*a_file/traces': cannot be made a directory"):
        ProfilerConfig.from_value({"profiler": "torch", "torch_profiler_dir": str(tmp_path / "a_file" / "traces")})
    with pytest.raises(DeltaServeError, match="profiler='cuda': the CUDA profiler needs the engine on a GPU"):
        LLM(checkpoint, device="cpu", profiler_config={"profiler": "cuda"})
