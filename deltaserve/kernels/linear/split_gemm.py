"""x @ W^T split along K into fp32 PartialSums by cuBLAS itself: one strided batched GEMM, no copies.

At a decode batch of a few dozen rows cuBLAS covers a projection with few output tiles, too few
programs to read the weight at the memory's bandwidth; S slices of K give it S times as many. Slice
s is x[:, s*K/S:(s+1)*K/S] against the same columns of W: views of both with batch stride K/S, which
cuBLAS reads in place. Its fp32 results are the parts that the consumer (the residual add-norm)
adds up on load, in a fixed order (partial_sums.py).
"""

import torch

from deltaserve.kernels.partial_sums import PartialSums

# From more than the skinny GEMM's rows up to MAX_ROWS, weights of at most MAX_N rows and at least MIN_K
# columns run in SPLITS slices. On the H200 (benchmarks/results/split_gemm.json), split against whole at
# 32 / 64 / 128 rows: the 9B shape's 4096 x 12288 down projection 26.9 / 29.6 / 29.9 against 29.5 / 31.9 /
# 33.5 us, its 4096 x 4096 out projection 11.2 / 12.0 / 12.3 against 13.0 / 11.7 / 13.6 (one rule for both:
# 0.3 us lost at 64 rows), the 35B-A3B shape's 2048 x 4096 out projection 7.1 / 7.2 / 8.0 against 9.6 /
# 10.0 / 9.6; the add-norm reads the second part in 0.1-0.5 us more. The wider weights (gate/up, qkv, the
# GDN input projection) measured slower split.
MAX_ROWS = 128
MAX_N = 4096
MIN_K = 4096
SPLITS = 2


def cublas_splits(m: int, n: int, k: int) -> int:
    """How many K slices a [m, k] @ [n, k]^T runs as on cuBLAS for a consumer of PartialSums (1: whole)."""
    return SPLITS if m <= MAX_ROWS and n <= MAX_N and k >= MIN_K and k % SPLITS == 0 else 1


def split_gemm_parts(x: torch.Tensor, weight: torch.Tensor, splits: int) -> PartialSums:
    """x [M, K] @ weight [N, K]^T as `splits` fp32 parts [splits, M, N], one per slice of K."""
    m, k = x.shape
    n = weight.shape[0]
    assert k % splits == 0 and x.stride(-1) == 1 and weight.is_contiguous(), (k, splits)
    step = k // splits
    x_slices = x.as_strided((splits, m, step), (step, x.stride(0), 1))
    w_slices = weight.as_strided((splits, step, n), (step, 1, k))  # slice s of W^T
    if x.is_cuda:
        parts = torch.bmm(x_slices, w_slices, out_dtype=torch.float32)
    else:  # bmm has no out_dtype on the CPU: the same slices in fp32
        parts = torch.bmm(x_slices.float(), w_slices.float())
    return PartialSums(parts, x.dtype)
