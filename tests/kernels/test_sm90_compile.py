"""The production kernels compile for the H200 (sm_90a) without spilling registers or overrunning
shared memory: checked on the CPU by compiling them as the GPU's JIT would (see sm90_compile.py)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.kernels.sm90_compile import SMEM_LIMIT

pytestmark = pytest.mark.triton


@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None, reason="no CUDA backend in Triton")
def test_kernels_compile_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script compiles, not interprets
    script = os.path.join(os.path.dirname(__file__), "sm90_compile.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert results, run.stderr[-2000:]
    for result in results:
        assert "error" not in result, result
        assert result["shared"] <= SMEM_LIMIT, result
        assert result.get("spill_bytes", 0) == 0, result
