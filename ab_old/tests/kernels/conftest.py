"""Triton kernels run on the CPU through Triton's interpreter, against their torch references.

TRITON_INTERPRET must be in the environment before any kernel is decorated, which happens when a
`deltaserve.kernels.<op>.triton_*` module is first imported (only these tests import them on a
machine without a GPU). Without Triton installed the directory is skipped.
"""

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4) -> None:
    """Max abs error relative to the reference's max magnitude."""
    err = (actual.float() - expected.float()).abs().max().item()
    scale = max(expected.float().abs().max().item(), 1e-6)
    assert err <= tol * scale, f"max abs error {err:.3e} vs reference magnitude {scale:.3e}"
