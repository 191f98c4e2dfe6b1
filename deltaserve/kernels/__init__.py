"""Every numeric op the models use, each behind one dispatch point (see dispatch.py).

Each function below runs the Triton kernel in `<op>/triton_*.py` for CUDA tensors (unless
DELTASERVE_KERNELS=reference), else the torch reference in `<op>/reference.py`, which is the
definition of correct. Triton modules are imported on first use, so machines without Triton never
import them.
"""

import torch

from deltaserve.kernels.activation import reference as _act
from deltaserve.kernels.attention import reference as _attn
from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh
from deltaserve.kernels.conv1d import reference as _conv
from deltaserve.kernels.decode_inputs import reference as _decode_inputs
from deltaserve.kernels.dispatch import use_triton
from deltaserve.kernels.gdn import decode_fused_reference as _gdn_decode
from deltaserve.kernels.gdn import reference as _gdn
from deltaserve.kernels.linear import reference as _linear
from deltaserve.kernels.moe import reference as _moe
from deltaserve.kernels.norm import reference as _norm
from deltaserve.kernels.norm.gated_norm import GatedNorm
from deltaserve.kernels.partial_sums import PartialSums, total
from deltaserve.kernels.pending_projection import PendingProjection
from deltaserve.kernels.rotary import reference as _rotary
from deltaserve.kernels.sampling import reference as _sampling
from deltaserve.kernels.slot_copy import reference as _slot_copy


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias), in out_dtype (x's by default). A few rows (decode) against a weight where the
    skinny GEMM reads faster than cuBLAS take it; everything else is cuBLAS through torch. A wider
    out_dtype is written by the GEMM itself from its fp32 accumulator, not cast after: the logits, at
    128 rows of the 9B shape's 248320 x 4096 head 540 against 608 us (benchmarks/results/split_gemm.json)."""
    out_dtype = out_dtype or x.dtype
    if bias is None and use_triton(x) and x.dim() == 2:
        from deltaserve.kernels.linear import triton_skinny_gemm as skinny
        if x.shape[0] <= skinny.MAX_ROWS and skinny.faster_than_cublas(weight.shape[0]):
            return skinny.skinny_gemm(x, weight, out_dtype=out_dtype)
        if out_dtype != x.dtype:
            return torch.mm(x, weight.T, out_dtype=out_dtype)
    return _linear.linear(x, weight, bias).to(out_dtype)


def linear_partial(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                   ) -> torch.Tensor | PartialSums:
    """linear() for a consumer that takes PartialSums (add_rms_norm, moe_route): a few rows against a
    weight too short to keep the GPU reading come back split along K, the sum left to the consumer.
    Up to skinny.MAX_ROWS rows the skinny GEMM splits; above, up to split_gemm.MAX_ROWS, cuBLAS."""
    if bias is None and use_triton(x) and x.dim() == 2:
        from deltaserve.kernels.linear import split_gemm
        from deltaserve.kernels.linear import triton_skinny_gemm as skinny
        if x.shape[0] <= skinny.MAX_ROWS:
            if skinny.k_splits(*weight.shape) > 1:
                return skinny.skinny_gemm_parts(x, weight)
        elif (splits := split_gemm.cublas_splits(x.shape[0], *weight.shape)) > 1:
            return split_gemm.split_gemm_parts(x, weight, splits)
    return linear(x, weight, bias)


# From this many rows a projection that only the residual add-norm reads is left pending for it
# (PendingProjection): long passes, where the GEMM's result is megabytes; a decode step's few rows keep the
# split and skinny GEMMs of linear_partial, whose parts the add-norm sums. None: never. 8192 is where it was
# timed (benchmarks/prefill_fusions.py on an H100, prefill_fusions_h100_at_daa9d70.json): the 9B shape's
# 4096 x 4096 projection and add-norm 431 -> 393 us at 8192 rows and 1848 -> 1752 at 32768, the 12288-wide down
# projection 1195 -> 1199 and 5283 -> 4954; the sums byte-identical to the unfused ones. Shorter passes (the
# server's default 2048-token steps, the prefill graphs) were not timed and keep the GEMM and the add-norm.
PENDING_PROJECTION_MIN_ROWS: int | None = 8192


def linear_to_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                       ) -> torch.Tensor | PartialSums | PendingProjection:
    """linear_partial() for a block's output projection, whose one consumer is the residual add-norm: from
    PENDING_PROJECTION_MIN_ROWS rows the GEMM is left for add_rms_norm to run into the residual."""
    pending_from = PENDING_PROJECTION_MIN_ROWS
    if pending_from is not None and bias is None and use_triton(x) and x.dim() == 2 and x.shape[0] >= pending_from:
        return PendingProjection(x, weight)
    return linear_partial(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    if use_triton(x):
        from deltaserve.kernels.norm.triton_rms_norm import rms_norm as kernel
        return kernel(x, weight, eps, offset)
    return _norm.rms_norm(x, weight, eps, offset)


def add_rms_norm(x: torch.Tensor | PartialSums | PendingProjection, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual). A PendingProjection is added into residual by its GEMM (which
    overwrites residual) and the sum normed."""
    if isinstance(x, PendingProjection):
        summed = x.added_to(residual)
        return rms_norm(summed, weight, eps, offset), summed
    if use_triton(x):
        from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm as kernel
        return kernel(x, residual, weight, eps, offset)
    return _norm.add_rms_norm(total(x), residual, weight, eps, offset)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm as kernel
        return kernel(x, gate, weight, eps)
    return _norm.gated_rms_norm(x, gate, weight, eps)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(q):
        from deltaserve.kernels.rotary.triton_rotary import apply_rotary as kernel
        return kernel(q, k, positions, cos_sin_cache)
    return _rotary.apply_rotary(q, k, positions, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        from deltaserve.kernels.activation.triton_silu_and_mul import silu_and_mul as kernel
        return kernel(x)
    return _act.silu_and_mul(x)


def output_gate(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    if use_triton(out):
        from deltaserve.kernels.attention.triton_output_gate import output_gate as kernel
        return kernel(out, gate)
    return _attn.output_gate(out, gate)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    if use_triton(k):
        from deltaserve.kernels.attention.triton_store_kv import store_kv as kernel
        return kernel(k, v, k_cache, v_cache, slot_mapping)
    return _attn.store_kv(k, v, k_cache, v_cache, slot_mapping)


def rotary_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, q_norm: torch.Tensor | None = None,
                    k_norm: torch.Tensor | None = None, eps: float = 1e-6, norm_offset: float = 0.0,
                    k_out: bool = False, q_rows: torch.Tensor | None = None
                    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Optional per-head q/k RMSNorm, rotary, and the KV store, in one launch; returns the rotated q (with
    k_out, the rotated q and k). q_rows: q holds only these rows of the batch's."""
    if use_triton(q):
        from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv as kernel
        return kernel(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, q_norm, k_norm, eps,
                      norm_offset, k_out, q_rows=q_rows)
    return _attn.rotary_store_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, q_norm, k_norm,
                                 eps, norm_offset, k_out, q_rows)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                    gate: torch.Tensor | None = None, max_query_len: int | None = None) -> torch.Tensor:
    """gate: the output is multiplied by sigmoid(gate) [T, Hq, D] (in the kernel's last store).
    max_query_len: the longest chunk, where the host knows it (the kernel's grid; None in a graph)."""
    if use_triton(q):
        from deltaserve.kernels.attention.triton_paged_attention import paged_attention as kernel
        return kernel(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, gate=gate,
                      max_query_len=max_query_len)
    return _attn.paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, gate)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, state_slots: torch.Tensor,
                  query_start_loc: torch.Tensor, capture_rows: list[tuple[int, int]] | None = None,
                  conv_snapshots: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton(x):
        from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d as kernel
        return kernel(x, weight, conv_state, state_slots, query_start_loc, capture_rows, conv_snapshots)
    return _conv.causal_conv1d(x, weight, conv_state, state_slots, query_start_loc, capture_rows, conv_snapshots)


# A prefill step's gated delta rule by its row count (for a graph, its rung; a pass replayed the same way
# runs the same kernel). Short passes (a prefix-cache hit's tail) are latency-bound: up to
# TOKEN_LOOP_MAX_ROWS rows the token loop of triton_recurrent, up to SHORT_CHUNK_MAX_ROWS the chunk
# kernels with 16-row chunks (less work on each chunk's serial path), then 64-row chunks. H200, Qwen3.5
# GDN shape, a pass beside a 16-row padding sequence (kernels_check gdn_short_pass): 16 rows 19 / 27 /
# 57 us (loop / 16-row chunks / 64-row chunks), 48 rows 40 / 35 / 59, 80 rows 62 / 40 / 73, 112 rows
# 84 / 49 / 75. Many short sequences in one pass (a verify step's k + 1 rows each) take the token loop by their
# longest: its programs run them side by side.
TOKEN_LOOP_MAX_ROWS = 16
SHORT_CHUNK_MAX_ROWS = 128
SHORT_CHUNK = 16


def chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc,
                           capture_rows: list[tuple[int, int]] | None = None,
                           h_snapshots: torch.Tensor | None = None, longest_chunk: int | None = None,
                           store_state: bool | torch.Tensor = True, output_norm: GatedNorm | None = None
                           ) -> torch.Tensor:
    """The gated delta rule over a ragged prefill batch (see gdn/reference.py). longest_chunk: a bound on every
    sequence's rows where the caller knows one (ForwardBatch.max_query_len), else the pass's rows bound them.
    store_state=False (a verify graph's few rows a sequence, in the token loop) leaves the states as they were,
    for commit_gated_delta_rule; a [B] integer tensor leaves them so for the sequences whose entry is 0 (the
    verify chunks of a pass beside prompt chunks). output_norm: the gated RMSNorm applied to the output (by the
    long passes' output kernel where triton_chunk.FUSED_OUTPUT_NORM says so, else by gated_rms_norm after)."""
    if use_triton(q):
        rows = q.shape[0]
        if min(rows, longest_chunk or rows) <= TOKEN_LOOP_MAX_ROWS or store_state is False:
            from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
            out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc, capture_rows,
                                h_snapshots, store_state=store_state)
            return out if output_norm is None else gated_rms_norm(out, *output_norm)
        from deltaserve.kernels.gdn.triton_chunk import chunk_gdn as kernel
        short = dict(chunk=SHORT_CHUNK, block_v=64) if rows <= SHORT_CHUNK_MAX_ROWS else {}
        return kernel(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc, capture_rows,
                      h_snapshots, store_state=store_state if isinstance(store_state, torch.Tensor) else None,
                      output_norm=output_norm, **short)
    out = _gdn.chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots, query_start_loc,
                                      capture_rows, h_snapshots, store_state)
    return out if output_norm is None else _norm.gated_rms_norm(out, *output_norm)


def commit_gated_delta_rule(k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq: int,
                            step_seqs: int) -> None:
    """A verify step's GDN states advanced through each sequence's kept rows (its first row_count, from
    i * rows_per_seq), every layer at once (see gdn/triton_commit.py); step_seqs: the sequences of the step that
    ran those rows (its tiles)."""
    if use_triton(k):
        from deltaserve.kernels.gdn.triton_commit import gdn_commit
        return gdn_commit(k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq, step_seqs)
    return _gdn.commit_gated_delta_rule(k, v, a, b, A_log, dt_bias, h_all, state_slots, row_count, rows_per_seq)


def recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots) -> torch.Tensor:
    """A decode step's gated delta rule, one token per sequence. Over a 16-bit state its reductions run on
    the tensor cores (triton_recurrent_dot: no fp32 copy of the tile is held, so more of it is in flight)."""
    if use_triton(q):
        from deltaserve.kernels.gdn.triton_recurrent_dot import gdn_decode_dot, takes_dot
        if takes_dot(q, k, h_pool):
            return gdn_decode_dot(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots)
        from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
        return gdn_recurrent(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots)
    return _gdn.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, h_pool, state_slots)


def gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps: float,
                     state_slots) -> torch.Tensor:
    """A GDN layer's decode step, one token per sequence, in one launch: conv update + SiLU of the
    [q | k | v] channels of `mixed`, the gated delta rule on h_pool[slot], the gated RMSNorm with z.
    Returns [B, Hv*Dv]."""
    if use_triton(mixed):
        from deltaserve.kernels.gdn.triton_decode_fused import gdn_decode_fused as kernel
        return kernel(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight, eps, state_slots)
    return _gdn_decode.gdn_decode_fused(mixed, z, a, b, conv_weight, conv_state, A_log, dt_bias, h_pool, norm_weight,
                                        eps, state_slots)


def moe_route(router_logits: torch.Tensor | PartialSums, top_k: int, renormalize: bool, shared_gate: bool = False,
              live_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """shared_gate: the last column is the shared expert's gate; it becomes choice k+1, expert E.
    live_rows ([1] on the device): rows at or after it get the id one past the stacked experts and
    weight 0, which moe_experts skips."""
    if use_triton(router_logits):
        from deltaserve.kernels.moe.triton_moe_route import moe_route as kernel
        return kernel(router_logits, top_k, renormalize, shared_gate, live_rows=live_rows)
    return _moe.moe_route(total(router_logits), top_k, renormalize, shared_gate, live_rows)


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor, partial: bool = False) -> torch.Tensor | PartialSums:
    """partial: the caller takes PartialSums (it feeds add_rms_norm), which the direct path of a few
    tokens may return: its down projection split over groups of each token's choices."""
    if use_triton(x):
        from deltaserve.kernels.moe.triton_moe_experts import moe_experts as kernel
        return kernel(x, w13, w2, weights, ids, partial=partial)
    return _moe.moe_experts(x, w13, w2, weights, ids)


def copy_slot(srcs: tuple[torch.Tensor, ...], src_slot: int, dsts: tuple[torch.Tensor, ...], dst_slot: int) -> None:
    """dst[:, dst_slot] = src[:, src_slot] for each pair of layer-major state pools [layers, slots, ...]."""
    triton_copy = _triton_slot_copy(srcs, dsts)
    if triton_copy is not None:
        return triton_copy.copy_slot(srcs, src_slot, dsts, dst_slot)
    return _slot_copy.copy_slot(srcs, src_slot, dsts, dst_slot)


def copy_slot_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """copy_slot with (source slot, destination slot) read from the device tensor `slots` [2]; a negative
    source slot copies nothing (a graph-replayed pass restores this way, from its fixed buffers)."""
    triton_copy = _triton_slot_copy(srcs, dsts)
    if triton_copy is not None:
        return triton_copy.copy_slot_at(srcs, dsts, slots)
    return _slot_copy.copy_slot_at(srcs, dsts, slots)


def copy_slots_at(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], pairs: torch.Tensor) -> None:
    """copy_slot_at for every row (source slot, destination slot) of the device tensor `pairs` [n, 2], in one
    launch: the destinations distinct, none of them another row's source in the same pool."""
    triton_copy = _triton_slot_copy(srcs, dsts, pools=(1, 2))
    if triton_copy is not None:
        return triton_copy.copy_slots_at(srcs, dsts, pairs)
    return _slot_copy.copy_slots_at(srcs, dsts, pairs)


def zero_slots(pools: tuple[torch.Tensor, ...], slots: torch.Tensor) -> None:
    """pool[:, slot] = 0 for each layer-major state pool and each slot in the device tensor `slots`."""
    triton_copy = _triton_slot_copy(pools, pools)
    if triton_copy is not None:
        return triton_copy.zero_slots(pools, slots)
    return _slot_copy.zero_slots(pools, slots)


def _triton_slot_copy(srcs: tuple[torch.Tensor, ...], dsts: tuple[torch.Tensor, ...], pools: tuple = (2,)):
    """The Triton slot-copy module where it takes these pools (as many pairs as `pools` allows, each layer's slot
    contiguous)."""
    if not (use_triton(srcs[0]) and len(srcs) in pools):
        return None
    from deltaserve.kernels.slot_copy import triton_slot_copy as triton_copy
    return triton_copy if all(triton_copy.slot_is_contiguous(pool) for pool in (*srcs, *dsts)) else None


def unpack_decode_inputs(input_ids: torch.Tensor, token_sources: torch.Tensor, sampled_tokens: torch.Tensor,
                         packed_blocks: torch.Tensor, block_width: torch.Tensor, block_tables: torch.Tensor) -> None:
    """A decode graph's inputs completed on the device: pending input ids from the tokens the step before
    sampled, block table rows from their packed copy (see decode_inputs/reference.py)."""
    if use_triton(input_ids):
        from deltaserve.kernels.decode_inputs.triton_unpack_decode_inputs import unpack_decode_inputs as kernel
        return kernel(input_ids, token_sources, sampled_tokens, packed_blocks, block_width, block_tables)
    return _decode_inputs.unpack_decode_inputs(input_ids, token_sources, sampled_tokens, packed_blocks, block_width,
                                               block_tables)


MaskPlan = _sampling.MaskPlan
RowTokens = _sampling.RowTokens


def apply_penalties(logits: torch.Tensor, prompt: RowTokens, output: RowTokens, repetition: torch.Tensor,
                    frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """A penalised copy of logits [B, V], from each row's prompt and output tokens (sampling/reference.py)."""
    if use_triton(logits):
        from deltaserve.kernels.sampling.triton_penalties import apply_penalties as kernel
        return kernel(logits, prompt, output, repetition, frequency, presence)
    return _sampling.apply_penalties(logits, prompt, output, repetition, frequency, presence)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
    """A copy of logits [B, V] where row b keeps only the tokens that bitmask[mask_rows[b]] allows (a grammar's
    mask; -1: a free row), sampling/reference.py."""
    if use_triton(logits):
        from deltaserve.kernels.sampling.triton_token_bitmask import apply_token_bitmask as kernel
        return kernel(logits, bitmask, mask_rows)
    return _sampling.apply_token_bitmask(logits, bitmask, mask_rows)


def greedy_tokens(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[b] = argmax of logits[b], the first on ties (a decode graph's greedy tokens)."""
    if use_triton(logits):
        from deltaserve.kernels.sampling.triton_race import greedy_tokens as kernel
        return kernel(logits, out)
    return torch.argmax(logits, dim=-1, out=out)


def sample_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor, seeds: torch.Tensor, *, mask: MaskPlan) -> torch.Tensor:
    """Each row's token: its argmax where its temperature is 0, else its seed's race over its scaled and
    masked logits (sampling/reference.py)."""
    if use_triton(logits):
        from deltaserve.kernels.sampling.triton_race import sample_from_logits as kernel
        return kernel(logits, temperature, top_k, top_p, min_p, seeds, mask=mask)
    return _sampling.sample_from_logits(logits, temperature, top_k, top_p, min_p, seeds, mask=mask)


__all__ = [
    "rms_norm", "add_rms_norm", "gated_rms_norm", "apply_rotary", "silu_and_mul", "store_kv", "rotary_store_kv",
    "paged_attention", "causal_attention_fresh", "output_gate", "causal_conv1d", "chunk_gated_delta_rule",
    "commit_gated_delta_rule", "recurrent_gated_delta_rule", "gdn_decode_fused", "linear", "linear_partial",
    "linear_to_residual", "PartialSums", "PendingProjection", "GatedNorm", "moe_route", "moe_experts", "copy_slot",
    "copy_slot_at", "copy_slots_at", "zero_slots", "unpack_decode_inputs", "apply_penalties", "apply_token_bitmask",
    "MaskPlan", "RowTokens", "sample_from_logits", "greedy_tokens",
]
