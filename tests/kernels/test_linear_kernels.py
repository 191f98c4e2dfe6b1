"""The skinny GEMM (a few rows of x against a wide weight, as in decode) against x @ W^T, whole and split
along K into partial sums."""

import random

import pytest
import torch

from deltaserve import kernels
from deltaserve.kernels.linear import reference
from deltaserve.kernels.linear.triton_skinny_gemm import (MAX_SPLIT_ROWS, MIN_SPLIT_PROGRAMS, SPLIT_K, SPLIT_PROGRAMS,
                                                         SPLIT_TILES, default_tiles, faster_than_cublas, k_splits,
                                                         skinny_gemm, skinny_gemm_parts)
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


# splits of K: one slice and several; one row and the most; N off the tile
@pytest.mark.parametrize("rows,n,k,splits", [(1, 40, 64, 2), (3, 100, 128, 4), (16, 33, 256, 8), (2, 20, 96, 1)])
def test_skinny_gemm_parts_sum_to_the_product(rows, n, k, splits):
    x, weight = torch.randn(rows, k), torch.randn(n, k)
    partial = skinny_gemm_parts(x, weight, splits, tiles=(16, 32, 2, 4))
    assert partial.parts.shape == (splits, rows, n) and partial.parts.dtype == torch.float32
    slice_k = k // splits
    for s in range(splits):  # each part is its own K slice's product
        cols = slice(s * slice_k, (s + 1) * slice_k)
        assert_close(partial.parts[s], reference.linear(x[:, cols], weight[:, cols]))
    assert_close(partial.total(), reference.linear(x, weight))


def test_k_splits_cut_short_weights_into_whole_slices():
    for _ in range(50):
        n, k = random.randint(16, 8192), 256 * random.randint(1, 64)
        splits = k_splits(n, k)
        if n > MAX_SPLIT_ROWS:
            assert splits == 1
        programs = -(-n // SPLIT_TILES.block_n) * splits
        assert splits == 1 or (k % (splits * SPLIT_K) == 0 and MIN_SPLIT_PROGRAMS <= programs <= SPLIT_PROGRAMS)
    # the 2048-wide shapes: output projections (2048 x 4096) in four slices, the MoE router (264 x 2048) in 16
    assert k_splits(2048, 4096) == 4 and k_splits(264, 2048) == 16 and k_splits(4096, 4096) == 1


def test_linear_partial_stays_a_tensor_on_the_reference():
    x, weight = torch.randn(2, 4096), torch.randn(2048, 4096)
    assert_close(kernels.linear_partial(x, weight), x @ weight.T)


def test_skinny_gemm_writes_its_accumulator_in_the_dtype_asked():
    x, weight = torch.randn(3, 96).half(), torch.randn(70, 96).half()  # 16-bit in, fp32 out unrounded
    out = skinny_gemm(x, weight, (16, 32, 2, 4), out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, x.float() @ weight.float().T)


def test_linear_returns_the_dtype_asked_on_the_reference():
    x, weight = torch.randn(4, 32).bfloat16(), torch.randn(50, 32).bfloat16()
    out = kernels.linear(x, weight, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, x.float() @ weight.float().T, tol=1e-2)  # the reference rounds to bf16 first
