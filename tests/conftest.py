import os
import random
import sys

# Some tests draw their parameters when collected. Under pytest-xdist every worker collects the whole suite and
# must draw the same ones, so the draws are seeded from the run's id: the same in each worker, new every run.
random.seed(os.environ.get("PYTEST_XDIST_TESTRUNUID") or os.urandom(16))

# Workers share the machine's cores: each takes its share of torch's threads rather than all of them.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# transformers binds flash-linear-attention kernels at import time when that package is present; they
# need a GPU. On CPU the reference of record is transformers' torch path.
sys.modules.setdefault("fla", None)


import pytest

from tests.checkpoints import make_checkpoint


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """Writes each tiny checkpoint once per test run."""
    made: dict[tuple, str] = {}

    def make(arch: str, seed: int = 0, **overrides) -> str:
        key = (arch, seed, tuple(sorted(overrides.items())))
        if key not in made:
            path = str(tmp_path_factory.mktemp(arch.replace(".", "_")))
            made[key] = make_checkpoint(arch, path, seed, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def demo_llm():
    """The built-in demo model (SmolLM2-135M-Instruct GGUF), loaded once per test run."""
    from deltaserve import LLM

    return LLM(device="cpu")


@pytest.fixture(scope="session")
def demo_reference():
    """transformers' own model from the demo GGUF file (fp32, eval), loaded once per test run: the tests
    that compare with it only read it, and each load parses and dequantizes the whole file."""
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF model")
    import os

    import torch
    from transformers import AutoModelForCausalLM

    from deltaserve.models.gguf_loader import demo_model_path

    path = demo_model_path()
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
