import sys

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
