import pytest
import torch
import triton
import triton.language as tl

from deltaserve.kernels.capture_rows import capture_tables
from deltaserve.kernels.gdn import reference
from deltaserve.kernels.gdn.fla_chunk import split_at_captures
from deltaserve.kernels.gdn.triton_capture_search import block_caps, captures_before
from deltaserve.kernels.gdn.triton_chunk import CHUNK, _unit_lower_inverse, chunk_gdn
from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
from tests.kernels.conftest import assert_close

pytestmark = pytest.mark.triton


def _inputs(tokens, hk, hv, dk, dv, slots, dtype=torch.float32):
    # q/k/v come sliced out of one projection in the model: pass strided views.
    packed = torch.randn(tokens, 2 * hk * dk + hv * dv + 2 * hv).to(dtype)
    q, k, v, a, b = packed.split([hk * dk, hk * dk, hv * dv, hv, hv], -1)
    A_log, dt_bias = torch.randn(hv) * 0.5, torch.randn(hv)
    h_pool = torch.randn(slots, hv, dk, dv) * 0.3
    return (q.reshape(tokens, hk, dk), k.reshape(tokens, hk, dk), v.reshape(tokens, hv, dv), a, b, A_log, dt_bias,
            h_pool)


# streamed: the grid tile, head, sequence first and evict-first state traffic, what the widest steps take.
@pytest.mark.parametrize("hk,hv,dk,dv,block_v,streamed", [(2, 4, 16, 24, None, None), (1, 3, 12, 16, 8, None),
                                                          (2, 2, 16, 16, 16, None), (1, 2, 16, 72, 64, None),
                                                          (1, 3, 12, 40, 16, True), (2, 4, 16, 24, None, True)])
def test_recurrent_decode_matches_reference(hk, hv, dk, dv, block_v, streamed):
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(3, hk, hv, dk, dv, slots=5)
    slots = torch.tensor([3, 0, 4])
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots)
    out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool, slots, block_v=block_v, streamed=streamed)
    assert_close(out, expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[1, 2]], h_pool[[1, 2]])  # untouched slots


def test_decode_tiles_widen_with_the_batch():
    from deltaserve.kernels.gdn.triton_recurrent import decode_tiles

    assert decode_tiles(32, 4) == (16, 2, False)  # one sequence of 32 value heads: many narrow programs
    assert decode_tiles(16 * 32, 4) == (32, 4, False)
    assert decode_tiles(32 * 32, 4) == (64, 4, False)
    assert decode_tiles(64 * 32, 4) == (64, 4, True) and decode_tiles(64 * 32, 2) == (64, 2, False)


def test_a_bfloat16_state_is_read_and_written_as_the_reference_does():
    # The kernels compute in fp32 whatever the pool holds and round the state back into it.
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(3, 2, 4, 16, 16, slots=5)
    h_pool = h_pool.to(torch.bfloat16)
    slots = torch.tensor([3, 0, 4])
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, slots)
    out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool, slots)
    assert pool.dtype == torch.bfloat16
    assert_close(out, expected)
    assert_close(pool.float(), expected_pool.float(), tol=1e-2)
    starts = torch.tensor([0, 70, 73], dtype=torch.int32)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(73, 2, 4, 16, 16, slots=4)
    h_pool = h_pool.to(torch.bfloat16)
    snaps, expected_snaps = (torch.zeros(3, 4, 16, 16, dtype=torch.bfloat16) for _ in range(2))
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    captures = [(40, 1), (71, 0)]
    expected = reference.chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, torch.tensor([2, 1]),
                                                starts, captures, expected_snaps)
    out = chunk_gdn(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([2, 1]), starts, captures, snaps)
    assert_close(out, expected)
    assert_close(pool.float(), expected_pool.float(), tol=1e-2)
    assert_close(snaps.float(), expected_snaps.float(), tol=1e-2)


# A 16-bit state's decode step on the tensor cores. The interpreter's dots take no bf16 operands, so the
# tests run it in fp16, the other dtype it takes; on the GPU the engine's bf16 states run it
# (benchmarks/kernels_check.py gdn_decode_dot).
# streamed: the grid head first and evict-first state traffic, what the widest steps take.
@pytest.mark.parametrize("hk,hv,dk,dv,block_v,num_warps,streamed", [
    (2, 4, 16, 24, None, None, None), (1, 3, 12, 40, 16, 2, None), (2, 2, 32, 64, 32, 4, None),
    (1, 2, 16, 72, 64, 4, None), (2, 4, 16, 24, None, None, True), (1, 3, 12, 40, 16, 2, True)])
def test_decode_dot_matches_reference(hk, hv, dk, dv, block_v, num_warps, streamed):
    from deltaserve.kernels.gdn.triton_recurrent_dot import gdn_decode_dot

    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(4, hk, hv, dk, dv, 6, dtype=torch.float16)
    h_pool = h_pool.half()
    assert not q.is_contiguous()  # strided views, as the model passes them
    slots = torch.tensor([3, -1, 0, 4], dtype=torch.int32)  # the second row is padding
    expected_pool, pool = h_pool.float(), h_pool.clone()
    live = torch.tensor([0, 2, 3])
    expected = reference.recurrent_gated_delta_rule(q[live].float(), k[live].float(), v[live].float(),
                                                    a[live].float(), b[live].float(), A_log, dt_bias, expected_pool,
                                                    slots[live].long())
    out = gdn_decode_dot(q, k, v, a, b, A_log, dt_bias, pool, slots, block_v=block_v, num_warps=num_warps,
                         streamed=streamed)
    assert out.dtype == torch.float16 and pool.dtype == torch.float16
    assert_close(out[live], expected, tol=2e-3)
    assert_close(pool.float(), expected_pool, tol=2e-3)
    assert torch.equal(pool[[1, 2, 5]], h_pool[[1, 2, 5]])  # slots no live row names, the padding's included


def test_decode_takes_the_dot_kernel_for_16_bit_states_only(monkeypatch):
    from deltaserve import kernels
    from deltaserve.kernels.gdn import triton_recurrent, triton_recurrent_dot

    calls = []
    monkeypatch.setattr(triton_recurrent_dot, "gdn_decode_dot", lambda *args: calls.append("dot"))
    monkeypatch.setattr(triton_recurrent, "gdn_recurrent", lambda *args: calls.append("widened"))
    monkeypatch.setattr(kernels, "use_triton", lambda x: True)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(2, 1, 2, 16, 16, 3)
    slots = torch.tensor([0, 2])
    for q_dtype, state_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                 (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
        kernels.recurrent_gated_delta_rule(q.to(q_dtype), k.to(q_dtype), v, a, b, A_log, dt_bias,
                                           h_pool.to(state_dtype), slots)
    assert calls == ["dot", "dot", "widened", "widened"]


def test_recurrent_decode_skips_padding_slot():
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(2, 1, 2, 8, 8, slots=3)
    pool = h_pool.clone()
    out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1, -1]))
    expected_pool = h_pool.clone()
    expected = reference.recurrent_gated_delta_rule(q[:1], k[:1], v[:1], a[:1], b[:1], A_log, dt_bias,
                                                    expected_pool, torch.tensor([1]))
    assert_close(out[:1], expected)
    assert_close(pool, expected_pool)
    assert torch.equal(pool[[0, 2]], h_pool[[0, 2]])  # the padding row wrote no state


def _check_chunk(lens, hk, hv, dk, dv, slots, captures, kernel=chunk_gdn, tol=1e-4, **tiles):
    starts = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    tokens = sum(lens)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(tokens, hk, hv, dk, dv, slots=len(lens) + 3)
    spare = h_pool.shape[0] - 1  # the reference runs a padding row (slot -1) from a zero state here
    assert spare not in slots
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected_pool[spare] = 0.0
    snap_shape = (max([s for _, s in captures], default=0) + 2, hv, dk, dv)
    expected_snaps, snaps = torch.zeros(snap_shape), torch.zeros(snap_shape)
    ref_slots = torch.tensor([s if s >= 0 else spare for s in slots])
    expected = reference.chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, expected_pool, ref_slots, starts,
                                                captures, expected_snaps)
    out = kernel(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor(slots), starts, captures, snaps, **tiles)
    assert_close(out, expected, tol)
    live = [s for s in slots if s >= 0]
    assert_close(pool[live], expected_pool[live], tol)
    untouched = [s for s in range(pool.shape[0]) if s not in live]
    assert torch.equal(pool[untouched], h_pool[untouched])
    assert_close(snaps, expected_snaps, tol)


# Ragged lengths: 1, 0, under a chunk, one row past a chunk, several chunks, a last sequence of no rows
# (a graph's pass that fills its rung); value heads grouped 1, 2, 3.
@pytest.mark.parametrize("lens,hk,hv,dk,dv", [
    ([1, 9, 0, 5], 2, 4, 16, 24),
    ([70, 1, 3], 1, 3, 12, 16),
    ([130, 64], 2, 2, 32, 16),
    ([128, 0], 1, 2, 16, 16),
])
@pytest.mark.parametrize("decayed_k", [True, False])  # the state loop's k from the prepare kernel, or its own
def test_chunk_prefill_matches_reference(lens, hk, hv, dk, dv, decayed_k):
    slots = list(range(len(lens) + 1, 1, -1))  # reversed, leaving slots 0, 1 and the spare alone
    _check_chunk(lens, hk, hv, dk, dv, slots, [], decayed_k=decayed_k)


EDGE_LENS = [150, 1, 66]  # rows 0-149, 150, 151-216
EDGE_CAPTURES = [
    (0, 0),  # first row of a sequence (and of its first chunk)
    (40, 1),  # inside a chunk
    (63, 2), (64, 3),  # last row of a chunk, first row of the next
    (127, 4), (128, 5), (129, 6),  # three rows in a row, across a chunk edge
    (149, 7),  # last row of a sequence, inside its last (short) chunk
    (150, 8),  # a one-row sequence
    (151 + 65, 9),  # last row of a sequence whose second chunk has two rows
    (40, 10),  # the same row captured twice
]


@pytest.mark.parametrize("kernel", [chunk_gdn, gdn_recurrent])
def test_prefill_captures_inside_and_at_the_edges_of_chunks(kernel):
    _check_chunk(EDGE_LENS, 1, 2, 16, 16, [3, 0, 4], EDGE_CAPTURES, kernel)


def test_prefill_captures_with_the_state_loop_normalising_k():
    # captures in a pass of many sequences, where the state kernel normalises k itself (no kd)
    _check_chunk(EDGE_LENS, 1, 2, 16, 16, [3, 0, 4], EDGE_CAPTURES, decayed_k=False)


@pytest.mark.parametrize("kernel", [chunk_gdn, gdn_recurrent])
def test_prefill_reads_a_graphs_device_capture_table(kernel):
    # A graph-replayed pass hands the kernels a fixed table [4, n]: pair rows and slots, then the same
    # again as the distinct sorted rows (no row repeats there).
    from deltaserve.kernels.capture_rows import GraphCaptureRows

    lens, hv, dk, dv = [70, 9], 2, 16, 16
    starts = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(sum(lens), 1, hv, dk, dv, slots=4)
    # Mid-chunk, both sides of a chunk edge, a second sequence, and an unused entry: a row past the pass.
    captures = [(15, 2), (63, 0), (64, 3), (78, 1), (80, 4)]
    rows, slots = [r for r, _ in captures], [s for _, s in captures]
    table = GraphCaptureRows(torch.tensor([rows, slots, rows, slots], dtype=torch.int32))
    expected_pool, pool = h_pool.clone(), h_pool.clone()
    expected_snaps, snaps = torch.zeros(5, hv, dk, dv), torch.zeros(5, hv, dk, dv)
    expected = kernel(q, k, v, a, b, A_log, dt_bias, expected_pool, torch.tensor([1, 2]), starts, captures,
                      expected_snaps)
    out = kernel(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1, 2]), starts, table, snaps)
    assert torch.equal(out, expected) and torch.equal(pool, expected_pool) and torch.equal(snaps, expected_snaps)
    assert snaps[:4].abs().sum(dim=(1, 2, 3)).min() > 0  # every capture in the pass wrote its slot
    assert not snaps[4].any()  # the one past it wrote nothing


@pytest.mark.parametrize("kernel", [chunk_gdn, gdn_recurrent])
def test_prefill_padding_sequence_reads_and_writes_no_state(kernel):
    _check_chunk([5, 3, 70], 1, 2, 16, 16, [2, -1, 0], [(2, 0), (80, 1)], kernel)


# A pass whose verify chunks run beside prompt chunks: the prompt chunks' states are written back, the verify
# chunks' left for their verdicts; every row's output is the same either way.
@pytest.mark.parametrize("kernel,lens", [(chunk_gdn, [70, 4, 3, 130]), (gdn_recurrent, [9, 4, 1, 3])])
def test_prefill_writes_back_the_states_of_the_sequences_it_is_told_to(kernel, lens):
    hk, hv, dk, dv = 1, 2, 16, 16
    starts = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(sum(lens), hk, hv, dk, dv, slots=len(lens) + 2)
    slots = torch.randperm(len(lens) + 1)[: len(lens)]
    stores = torch.randint(0, 2, (len(lens),), dtype=torch.int32)
    stores[0], stores[1] = 1, 0  # both kinds, whatever the draw
    inputs = (q, k, v, a, b, A_log, dt_bias)
    expected_pool, every_pool, pool = h_pool.clone(), h_pool.clone(), h_pool.clone()
    expected = reference.chunk_gated_delta_rule(*inputs, expected_pool, slots, starts, store_state=stores)
    every = kernel(*inputs, every_pool, slots, starts)
    out = kernel(*inputs, pool, slots, starts, store_state=stores)
    assert torch.equal(out, every)
    assert_close(out, expected, 1e-4)
    written = slots[stores.bool()]
    assert_close(pool[written], expected_pool[written], 1e-4)
    assert torch.equal(pool[written], every_pool[written])
    others = [s for s in range(pool.shape[0]) if s not in written.tolist()]
    assert torch.equal(pool[others], h_pool[others]) and torch.equal(expected_pool[others], h_pool[others])


# The token loop on ragged prefill rows (short passes take it): lengths 1 and 0 (last too), grouped value heads.
@pytest.mark.parametrize("lens,hk,hv,dk,dv,block_v", [
    ([1, 9, 0, 5], 2, 4, 16, 24, None),
    ([20, 1, 3], 1, 3, 12, 16, 8),
    ([16, 0], 1, 2, 16, 16, None),
])
def test_token_loop_prefill_matches_reference(lens, hk, hv, dk, dv, block_v):
    slots = list(range(len(lens) + 1, 1, -1))
    _check_chunk(lens, hk, hv, dk, dv, slots, [(0, 0), (sum(lens) - 1, 1)], gdn_recurrent, block_v=block_v)


def test_token_loop_over_many_short_sequences_in_decode_tiles():
    # A speculative verify pass: sequences of k + 1 = 3 rows, the state after each row but the last captured.
    # Enough of them take a decode step's wider tiles and warps, with the same result as the reference.
    from deltaserve.kernels.gdn.triton_recurrent import decode_tiles, ragged_tiles

    assert ragged_tiles(64, 4) == (8, 1, False)
    assert ragged_tiles(512, 4) == (*decode_tiles(512, 4)[:2], False) and not ragged_tiles(4096, 4)[2]
    seqs = 5
    captures = [(3 * s + j, 2 * s + j) for s in range(seqs) for j in range(2)]
    slots = list(range(seqs + 1, 1, -1))
    _check_chunk([3] * seqs, 1, 2, 16, 64, slots, captures, gdn_recurrent, block_v=32, num_warps=4)


@pytest.mark.parametrize("chunk", [16, 32])
def test_chunk_prefill_with_shorter_chunks(chunk):
    _check_chunk([40, 1, 17], 1, 2, 16, 16, [3, 0, 4], [(15, 0), (16, 1), (39, 2), (50, 3)], chunk=chunk)


# The output off the state kernel's serial path, in its own kernel (an option the benchmarks measure).
@pytest.mark.parametrize("chunk,split_output", [(64, True), (16, True)])
def test_chunk_prefill_with_and_without_a_separate_output_kernel(chunk, split_output):
    captures = [(15, 0), (64, 1), (100, 2), (131, 3)]
    _check_chunk([130, 1, 20], 2, 4, 16, 16, [3, 0, 4], captures, chunk=chunk, split_output=split_output)


# The gated norm after the output: in the output kernel's last store where one tile holds a head's row (the
# split output at 16 columns), by the norm's own kernel otherwise (the output on the state kernel's path, or in
# 8-column tiles). Each against the reference's rule and norm, and the fused one against the unfused kernels.
@pytest.mark.parametrize("split_output,output", [(True, None), (False, None), (True, {"bv": 8})])
def test_chunk_prefill_gated_norm_of_its_output(split_output, output):
    from deltaserve.kernels.norm.gated_norm import GatedNorm
    from deltaserve.kernels.norm.reference import gated_rms_norm as reference_norm
    from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm

    lens, hk, hv, dk, dv = [130, 1, 20], 2, 4, 16, 16
    starts = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    q, k, v, a, b, A_log, dt_bias, h_pool = _inputs(sum(lens), hk, hv, dk, dv, slots=5)
    slots = torch.tensor([3, 0, 4])
    packed = torch.randn(sum(lens), hv * dv + 3)  # the gate, sliced out of a wider projection as in the model
    norm = GatedNorm(packed[:, 1 : 1 + hv * dv].reshape(-1, hv, dv), torch.randn(dv), 1e-6)
    inputs = (q, k, v, a, b, A_log, dt_bias)
    expected_pool, unfused_pool, pool = h_pool.clone(), h_pool.clone(), h_pool.clone()
    expected = reference_norm(reference.chunk_gated_delta_rule(*inputs, expected_pool, slots, starts), *norm)
    unfused = gated_rms_norm(chunk_gdn(*inputs, unfused_pool, slots, starts, split_output=split_output,
                                       output=output), *norm)
    out = chunk_gdn(*inputs, pool, slots, starts, split_output=split_output, output=output, output_norm=norm,
                    fuse_norm=True)
    assert_close(out, expected, 1e-4)
    assert_close(out, unfused, 1e-5)
    assert torch.equal(pool, unfused_pool)


# The buffers that only feed dots in 16 bits (bf16 under the GPU's bf16 dots; the interpreter's are fp16), with
# the output in the state kernel or its own, captures inside chunks: the reference to 16-bit rounding.
@pytest.mark.parametrize("split_output", [False, True])
def test_chunk_prefill_with_16_bit_buffers_between_the_kernels(split_output):
    captures = [(15, 0), (64, 1), (100, 2), (131, 3)]
    _check_chunk([130, 1, 20], 2, 4, 16, 16, [3, 0, 4], captures, split_output=split_output,
                 buffer_dtype=torch.float16, tol=3e-3)


# u in 16 bits too (an option the benchmarks measure), with and without the output kernel and captures.
@pytest.mark.parametrize("split_output", [False, True])
def test_chunk_prefill_with_u_in_16_bits(split_output):
    captures = [(15, 0), (64, 1), (100, 2), (131, 3)]
    _check_chunk([130, 1, 20], 2, 4, 16, 16, [3, 0, 4], captures, split_output=split_output,
                 buffer_dtype=torch.float16, u_dtype=torch.float16, tol=3e-3)


@triton.jit
def _inverse_kernel(a, out, CHUNK: tl.constexpr, SUB: tl.constexpr):
    rows = tl.arange(0, CHUNK)
    tile = rows[:, None] * CHUNK + rows[None, :]
    tl.store(out + tile, _unit_lower_inverse(tl.load(a + tile), CHUNK, SUB, "ieee"))


# Diagonal blocks of 64, 32, 16, 8 and 4 rows: 1, 2, 4, 8 and 16 blocks, the block series summing up to
# 14 powers of M. Entries of order 0.2 leave every power of the series in the result.
@pytest.mark.parametrize("sub", [64, 32, 16, 8, 4])
def test_unit_lower_inverse_in_diagonal_blocks(sub):
    A = torch.tril(torch.randn(CHUNK, CHUNK) * 0.2, -1)
    inverse = torch.empty(CHUNK, CHUNK)
    _inverse_kernel[(1,)](A, inverse, CHUNK=CHUNK, SUB=sub)
    assert_close(inverse @ (torch.eye(CHUNK) + A), torch.eye(CHUNK))


def test_chunk_prefill_inverse_in_8_row_blocks():  # the long passes' blocks on the GPU
    _check_chunk([150, 7], 1, 2, 16, 16, [1, 0], [(70, 0)], prepare={"sub": 8})


@pytest.mark.parametrize("prepare", [{"bv": 16}, {"bv": 64, "warps": 8}])
def test_chunk_prefill_prepare_kernel_tiles(prepare):
    # w and u in narrower or wider column tiles than Dk and Dv (32) per dot; the result is the same.
    _check_chunk([70, 9], 1, 2, 32, 32, [1, 0], [(30, 0)], prepare=prepare)


def test_chunk_prefill_of_many_sequences_takes_the_wide_state_tiles():
    # Enough sequences that 64-column tiles fill an H200's multiprocessors (the interpreter counts its 132):
    # the state kernel takes them, with the same result as the reference.
    from deltaserve.kernels.gdn import triton_chunk

    lens = torch.randint(1, 70, (34,)).tolist()
    assert triton_chunk._state_block_v(len(lens), 4, 64, torch.device("cpu")) == triton_chunk.STATE_WIDE_BLOCK_V
    assert triton_chunk._state_block_v(1, 4, 64, torch.device("cpu")) == triton_chunk.STATE_BLOCK_V
    _check_chunk(lens, 2, 4, 16, 64, list(range(len(lens) + 1, 1, -1)), [])


def test_chunk_prefill_state_tiles_and_warps():
    _check_chunk([67, 20], 2, 4, 16, 48, [1, 0], [(30, 0), (70, 1)], block_v=16, num_warps=2)


def test_capture_tables_sort_rows_and_find_each_sequences_first_capture():
    rows, snaps, first, repeats = capture_tables([(9, 4), (2, 1), (9, 5), (0, 2)], torch.tensor([0, 1, 5, 12]))
    assert rows.tolist() == [0, 2, 9] and snaps.tolist() == [2, 1, 4]
    assert first.tolist() == [0, 1, 2]
    assert repeats == [(5, 4)]
    assert CHUNK == 64


@triton.jit
def _first_captures_kernel(cap_rows, num_caps, query_start_loc, first, BLOCK_CAPS: tl.constexpr):
    seq = tl.program_id(0)
    tl.store(first + seq, captures_before(cap_rows, num_caps, tl.load(query_start_loc + seq), BLOCK_CAPS))


def test_the_chunk_kernels_search_of_the_table_finds_what_capture_tables_builds():
    starts = torch.tensor([0, 1, 5, 12], dtype=torch.int32)
    rows, _, first, _ = capture_tables([(9, 4), (2, 1), (9, 5), (0, 2)], starts)
    found = torch.full((3,), -1, dtype=torch.int32)
    _first_captures_kernel[(3,)](rows, rows.shape[0], starts, found, BLOCK_CAPS=block_caps(rows.shape[0]))
    assert found.tolist() == first.tolist() == [0, 1, 2]


def test_split_at_captures_cuts_after_each_capture_row():
    starts, slots = [0, 1, 10, 10, 15], [4, 0, 5, 2]
    rounds = split_at_captures(starts, slots, [(0, 7), (3, 8), (9, 9), (12, 10), (5, 11)])
    assert rounds[0] == [(4, 0, 1, [7]), (0, 1, 4, [8]), (5, 10, 10, []), (2, 10, 13, [10])]
    assert rounds[1] == [(0, 4, 6, [11]), (2, 13, 15, [])]
    assert rounds[2] == [(0, 6, 10, [9])]


# A verify step whose states wait for its verdicts: the token loop leaves them as they were, then one launch
# takes each sequence's state through the rows it kept, in every layer, from the rows' k, v, a, b as the engine
# stashes them (k and v side by side in one buffer, b and a in another).
@pytest.mark.parametrize("hk,hv,dk,dv,step_seqs,counts", [(1, 2, 16, 32, 4, torch.int32),
                                                           (2, 4, 16, 24, 200, torch.int64)])  # as the engine's
def test_commit_takes_each_state_through_its_kept_rows_as_the_token_loop_does(hk, hv, dk, dv, step_seqs, counts):
    from deltaserve.kernels.gdn.triton_commit import gdn_commit

    layers, seqs, per = 2, 4, 3
    tokens = seqs * per
    starts = torch.arange(seqs + 1, dtype=torch.int32) * per
    kv = torch.randn(layers, tokens, hk * dk + hv * dv)
    ba = torch.randn(layers, tokens, 2 * hv)
    k, v = kv[..., : hk * dk].unflatten(-1, (hk, dk)), kv[..., hk * dk :].unflatten(-1, (hv, dv))
    b, a = ba[..., :hv], ba[..., hv:]
    A_log, dt_bias = torch.randn(layers, hv) * 0.5, torch.randn(layers, hv)
    h_all = torch.randn(layers, seqs + 2, hv, dk, dv) * 0.3
    slots = torch.tensor([3, 0, 5, 2])
    after = torch.zeros(layers, tokens, hv, dk, dv)  # the state after every row, as the loop captures it
    for layer in range(layers):
        q = torch.randn(tokens, hk, dk)
        inputs = (q, k[layer], v[layer], a[layer], b[layer], A_log[layer], dt_bias[layer])
        pool = h_all[layer].clone()
        out = gdn_recurrent(*inputs, pool, slots, starts, store_state=False)
        assert torch.equal(pool, h_all[layer])  # read, not written
        every_row = [(row, row) for row in range(tokens)]
        assert torch.equal(out, gdn_recurrent(*inputs, pool, slots, starts, every_row, after[layer]))
    kept = torch.tensor([1, 3, 2, 0])
    committed, expected = h_all.clone(), h_all.clone()
    gdn_commit(k, v, a, b, A_log, dt_bias, committed, slots, kept.to(counts), per, step_seqs)
    reference.commit_gated_delta_rule(k, v, a, b, A_log, dt_bias, expected, slots, kept, per)
    for seq, (slot, count) in enumerate(zip(slots.tolist(), kept.tolist())):
        last = seq * per + count - 1
        want = after[:, last] if count else h_all[:, slot]
        assert_close(committed[:, slot], want, 1e-5)
    assert_close(committed, expected)
    untouched = [s for s in range(h_all.shape[1]) if s not in slots.tolist()]
    assert torch.equal(committed[:, untouched], h_all[:, untouched])
