"""The skinny GEMM (a few rows of x against a wide weight, as in decode) against x @ W^T."""

import random

import pytest
import torch

from deltaserve import kernels
from deltaserve.kernels.linear import reference
from deltaserve.kernels.linear.triton_skinny_gemm import default_tiles, faster_than_cublas, skinny_gemm
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


# one row, a few, the most (16); K and N not multiples of the tiles; tiles as given and by default
@pytest.mark.parametrize("rows,n,k,tiles", [(1, 40, 70, (16, 32, 2, 4)), (3, 100, 33, (32, 16, 3, 4)),
                                            (16, 64, 256, (16, 64, 2, 4)), (5, 1030, 48, None)])
def test_skinny_gemm_matches_the_reference(rows, n, k, tiles):
    x, weight = torch.randn(rows, k), torch.randn(n, k)
    assert_close(skinny_gemm(x, weight, tiles), reference.linear(x, weight))


def test_skinny_gemm_strided_rows():
    x = torch.randn(4, 2 * 72)[:, :72]  # a view, as the layers may pass
    weight = torch.randn(50, 72)
    assert_close(skinny_gemm(x, weight, (16, 32, 2, 4)), reference.linear(x, weight))


def test_default_tiles_keep_every_sm_busy():
    for n in (random.randint(1024, 300_000) for _ in range(20)):
        tiles = default_tiles(n)
        assert -(-n // tiles.block_n) >= 64, (n, tiles)


def test_linear_dispatch_keeps_bias_and_many_rows_on_the_reference():
    x, weight, bias = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    assert_close(kernels.linear(x, weight, bias), x @ weight.T + bias)
    assert_close(kernels.linear(x, weight), x @ weight.T)


def test_skinny_gemm_is_chosen_where_it_measured_faster():
    # benchmarks/results/skinny_gemm.json: faster for these weights, slower for the second list
    assert all(faster_than_cublas(n) for n in (2048, 4096, 12352, 248320))
    assert not any(faster_than_cublas(n) for n in (264, 9216, 10240, 24576))
