import pytest
import torch

from deltaserve import kernels
from deltaserve.kernels.activation import reference as act_reference
from deltaserve.kernels.activation.triton_silu_and_mul import silu_and_mul
from deltaserve.kernels.norm import reference as norm_reference
from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm
from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm, rms_norm
from deltaserve.kernels.partial_sums import PartialSums
from deltaserve.kernels.rotary import reference as rotary_reference
from deltaserve.kernels.rotary.triton_rotary import apply_rotary
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("width", [40, 64])
def test_rms_norm_and_residual_add(offset, width):
    x, residual, weight = torch.randn(5, width), torch.randn(5, width), torch.randn(width)
    assert_close(rms_norm(x, weight, 1e-6, offset), norm_reference.rms_norm(x, weight, 1e-6, offset))
    normed, summed = add_rms_norm(x, residual, weight, 1e-6, offset)
    expected_normed, expected_summed = norm_reference.add_rms_norm(x, residual, weight, 1e-6, offset)
    assert_close(normed, expected_normed)
    assert torch.equal(summed, expected_summed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_sums_partial_sums_first(dtype):
    parts = torch.randn(3, 4, 40)
    residual, weight = torch.randn(4, 40).to(dtype), torch.randn(40).to(dtype)
    partial = PartialSums(parts, dtype)
    normed, summed = add_rms_norm(partial, residual, weight, 1e-6, 1.0)
    # the sum of the parts, rounded to the stream's dtype, then the residual add, as the reference does it
    expected_normed, expected_summed = norm_reference.add_rms_norm(partial.total(), residual, weight, 1e-6, 1.0)
    assert normed.dtype == summed.dtype == dtype
    # fp32: the kernel adds the parts in a tree, the reference in a row; bf16: Triton's interpreter also
    # rounds fp32 to bf16 its own way, a bf16 ulp apart at most
    assert_close(summed, expected_summed, 1e-2 if dtype == torch.bfloat16 else 1e-6)
    assert_close(normed, expected_normed, 1e-2 if dtype == torch.bfloat16 else 1e-4)
    assert torch.equal(kernels.add_rms_norm(partial, residual, weight, 1e-6, 1.0)[1], expected_summed)  # CPU: reference


def test_residual_add_runs_a_pending_projection_into_the_residual():
    # A long pass's output projection, left for the add-norm: the GEMM adds its product into the residual (which it
    # overwrites), and the sum is normed, as the reference does the two apart. A residual cuBLAS cannot take in
    # place (a strided view) is left as it was.
    x, w = torch.randn(9, 48), torch.randn(40, 48)
    residual, weight = torch.randn(9, 40), torch.randn(40)
    expected_normed, expected_summed = norm_reference.add_rms_norm(x @ w.T, residual, weight, 1e-6, 1.0)
    stream = residual.clone()
    normed, summed = kernels.add_rms_norm(kernels.PendingProjection(x, w), stream, weight, 1e-6, 1.0)
    assert summed.data_ptr() == stream.data_ptr()
    assert_close(summed, expected_summed, 1e-5)
    assert_close(normed, expected_normed, 1e-4)
    wide = torch.randn(9, 80)
    strided = wide[:, ::2]
    kept = strided.clone()
    normed, summed = kernels.add_rms_norm(kernels.PendingProjection(x, w), strided, weight, 1e-6, 1.0)
    assert torch.equal(strided, kept)
    assert_close(summed, norm_reference.add_rms_norm(x @ w.T, kept, weight, 1e-6, 1.0)[1], 1e-5)


def test_rms_norm_per_head_on_strided_view():
    packed = torch.randn(6, 3, 2 * 24)
    q = packed[..., :24]  # [T, H, D] with the gate interleaved, as gated attention slices it
    weight = torch.randn(24)
    assert_close(rms_norm(q, weight, 1e-6, 1.0), norm_reference.rms_norm(q, weight, 1e-6, 1.0))


@pytest.mark.parametrize("block_rows", [4, 8])
def test_norms_over_row_tiles(block_rows):
    """Several narrow rows a program (as prefill's per-head norms run), rows not a multiple of the tile, on
    strided per-head views; with a residual; PartialSums keep one row a program whatever is asked."""
    tokens, heads, dim = 7, 3, 24  # 21 rows
    packed = torch.randn(tokens, heads, 2 * dim)
    q, gate = packed[..., :dim], packed[..., dim:]
    weight = torch.randn(dim)
    assert_close(rms_norm(q, weight, 1e-6, 1.0, block_rows=block_rows),
                 norm_reference.rms_norm(q, weight, 1e-6, 1.0))
    assert_close(gated_rms_norm(q, gate, weight, 1e-6, block_rows=block_rows),
                 norm_reference.gated_rms_norm(q, gate, weight, 1e-6))
    x, residual = torch.randn(tokens * heads, dim), torch.randn(tokens * heads, dim)
    normed, summed = add_rms_norm(x, residual, weight, 1e-6, block_rows=block_rows)
    expected_normed, expected_summed = norm_reference.add_rms_norm(x, residual, weight, 1e-6)
    assert_close(normed, expected_normed)
    assert torch.equal(summed, expected_summed)
    partial = PartialSums(torch.randn(3, tokens * heads, dim), torch.float32)
    normed, summed = add_rms_norm(partial, residual, weight, 1e-6, block_rows=block_rows)
    expected_normed, expected_summed = norm_reference.add_rms_norm(partial.total(), residual, weight, 1e-6)
    assert_close(summed, expected_summed, 1e-6)
    assert_close(normed, expected_normed)


def test_rows_per_program_packs_only_narrow_rows_of_large_batches():
    from deltaserve.kernels.norm.rows_per_program import TILE_ELEMENTS, rows_per_program

    assert rows_per_program(32, 128) == 1  # a decode step's GDN norm at one sequence
    assert rows_per_program(8192, 2048) == 1  # the hidden stream: one wide row a program
    tiled = rows_per_program(8192 * 32, 128)  # an 8k-token prompt's GDN norm
    assert tiled * 128 == TILE_ELEMENTS and tiled & (tiled - 1) == 0
    assert all(rows // rows_per_program(rows, 128) >= 512 for rows in (600, 2048, 5000, 10**6))


def test_gated_rms_norm():
    x = torch.randn(5, 3, 24)
    gate = torch.randn(5, 3 * 24 + 7)[:, :72].reshape(5, 3, 24)
    weight = torch.randn(24)
    assert_close(gated_rms_norm(x, gate, weight, 1e-6), norm_reference.gated_rms_norm(x, gate, weight, 1e-6))


@pytest.mark.parametrize("rotary_dim", [12, 20])
def test_partial_rotary(rotary_dim):
    tokens, head_dim = 6, 20
    q = torch.randn(tokens, 4, 2 * head_dim)[..., :head_dim]
    k = torch.randn(tokens, 2, head_dim)
    positions = torch.tensor([0, 5, 3, 9, 1, 2])
    cache = torch.randn(16, rotary_dim)
    expected_q, expected_k = rotary_reference.apply_rotary(q, k, positions, cache)
    out_q, out_k = apply_rotary(q, k, positions, cache)
    assert_close(out_q, expected_q)
    assert_close(out_k, expected_k)


def test_silu_and_mul():
    x = torch.randn(3, 4, 2 * 37)
    assert_close(silu_and_mul(x), act_reference.silu_and_mul(x))
