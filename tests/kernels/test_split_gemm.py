"""cuBLAS split along K (split_gemm): each part is its own slice's product, read in place from views of x
and the weight; and the rule that picks the split."""

import random

import pytest
import torch

from deltaserve.kernels.linear import reference
from deltaserve.kernels.linear.split_gemm import MAX_N, MAX_ROWS, MIN_K, SPLITS, cublas_splits, split_gemm_parts
from tests.kernels.conftest import assert_close


# one slice and several; a row stride wider than K (a column slice of a larger activation)
@pytest.mark.parametrize("rows,n,k,splits,row_stride", [(1, 40, 64, 2, 64), (17, 33, 96, 3, 96), (5, 20, 128, 4, 200),
                                                         (3, 8, 32, 1, 32)])
def test_split_gemm_parts_are_the_slices_products(rows, n, k, splits, row_stride):
    x = torch.randn(rows, row_stride)[:, :k]
    weight = torch.randn(n, k)
    partial = split_gemm_parts(x, weight, splits)
    assert partial.parts.shape == (splits, rows, n) and partial.parts.dtype == torch.float32
    assert partial.dtype == x.dtype
    step = k // splits
    for s in range(splits):
        cols = slice(s * step, (s + 1) * step)
        assert_close(partial.parts[s], reference.linear(x[:, cols], weight[:, cols]))
    assert_close(partial.total(), reference.linear(x, weight))


def test_split_gemm_parts_of_bfloat16_sum_in_fp32():
    x, weight = torch.randn(6, 256).bfloat16(), torch.randn(24, 256).bfloat16()
    partial = split_gemm_parts(x, weight, 2)
    expected = x.float() @ weight.float().T
    assert partial.total().dtype == torch.bfloat16
    assert_close(partial.parts.sum(0), expected)


def test_cublas_splits_only_short_weights_at_decode_rows():
    assert cublas_splits(64, 4096, 12288) == SPLITS and cublas_splits(128, 2048, 4096) == SPLITS
    assert cublas_splits(64, 24576, 4096) == 1 and cublas_splits(256, 4096, 4096) == 1
    for _ in range(50):
        m, n, k = random.randint(1, 300), random.randint(16, 30000), 2 * random.randint(8, 8192)
        expected = SPLITS if m <= MAX_ROWS and n <= MAX_N and k >= MIN_K else 1
        assert cublas_splits(m, n, k) == expected
