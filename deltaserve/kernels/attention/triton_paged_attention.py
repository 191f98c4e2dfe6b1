"""Causal attention over paged K/V for a ragged batch (prefill chunks, decode tokens, verify rows alike).

One program per (sequence, KV head, tile of query rows). The rows of a tile are (token, query head)
pairs of one KV head's group, token-major, so at decode the whole GQA group shares one pass over the
KV pages: each K/V page is read once per KV head. Keys are gathered page by page through the block
table; an online softmax (base 2) carries the running max and sum. Nothing is read from the host, so
the launch can be captured in a CUDA graph: the tile count is bounded by the largest possible q_len,
`T - B + 1`, and tiles past a sequence's rows return at once. A caller outside a graph, which knows the
longest q_len, passes it: over 128 prompts of 128 tokens the bound made 1017 tiles a (sequence, KV
head) where 8 hold rows, and the empty programs alone took 1.8 ms a layer on the H200
(profile_prefill_qwen3.5-9b_128x128_f3df3cd.json).

Long prefill chunks take 128-row tiles (LONG_ROWS). A tile's rows attend to every key up to its first
row's position, so those key tiles are walked without the causal and bounds masks (INTERIOR), the rest with
them, and the last row tiles, which walk the most keys, are launched first.

Where there are few programs (decode, or a short chunk over a long cached prefix) most of the GPU
would sit idle, so the keys are split into `splits` ranges (flash-decoding): each program writes its range's normalised
output and log-sum-exp, and a second kernel merges the ranges.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deltaserve.kernels.pdl import launch_options, wait_for_prior_grid, wait_for_prior_grid_only
from deltaserve.kernels.sm_count import num_sms


@triton.jit
def _attend_keys(n, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head, offs_d,
                 mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos,
                 stride_vc_head, stride_bt, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                 MASKED: tl.constexpr):
    """One step of the online softmax over keys [n, n + BLOCK_N), gathered page by page. Unless MASKED,
    every one of those keys exists and every row of the tile may attend to it (see INTERIOR)."""
    k_pos = n + tl.arange(0, BLOCK_N)
    if MASKED:
        k_valid = k_pos < kv_stop
        page = tl.load(block_tables + seq * stride_bt + k_pos // PAGE, mask=k_valid, other=0).to(tl.int64)
        kv_mask = k_valid[:, None] & mask_d[None, :]
    else:
        page = tl.load(block_tables + seq * stride_bt + k_pos // PAGE).to(tl.int64)
        kv_mask = mask_d[None, :]
    in_page = k_pos % PAGE
    k_ptrs = (k_cache + page[:, None] * stride_kc_block + in_page[:, None] * stride_kc_pos
              + kv_head * stride_kc_head + offs_d[None, :])
    v_ptrs = (v_cache + page[:, None] * stride_vc_block + in_page[:, None] * stride_vc_pos
              + kv_head * stride_vc_head + offs_d[None, :])
    k_tile = tl.load(k_ptrs, mask=kv_mask, other=0.0).to(q_tile.dtype)
    scores = tl.dot(q_tile, tl.trans(k_tile), input_precision=PRECISION) * scale_log2
    if MASKED:
        scores = tl.where((k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v_tile = tl.load(v_ptrs, mask=kv_mask, other=0.0).to(q_tile.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _walk_keys(start, stop, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head,
               offs_d, mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block,
               stride_vc_pos, stride_vc_head, stride_bt, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
               PRECISION: tl.constexpr, MASKED: tl.constexpr, LOOP_FOR: tl.constexpr):
    """_attend_keys over the key tiles from `start` to `stop`, BLOCK_N apart."""
    if LOOP_FOR:  # compiled: a for loop, which the pipeliner can prefetch (a while loop it cannot)
        for key0 in range(start, stop, BLOCK_N):
            m_i, l_i, acc = _attend_keys(
                key0, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head, offs_d,
                mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos,
                stride_vc_head, stride_bt, PAGE, BLOCK_N, PRECISION, MASKED)
    else:  # the interpreter cannot take loaded bounds in range()
        n = start
        while n < stop:
            m_i, l_i, acc = _attend_keys(
                n, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head, offs_d,
                mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos,
                stride_vc_head, stride_bt, PAGE, BLOCK_N, PRECISION, MASKED)
            n += BLOCK_N
    return m_i, l_i, acc


@triton.jit
def _gated(out, gate, row, head, offs_d, mask, stride_g_t, stride_g_h, HAS_GATE: tl.constexpr):
    """out * sigmoid(gate) at the (row, head) of each output element, in fp32 (out itself without a gate)."""
    if HAS_GATE:
        g = tl.load(gate + row * stride_g_t + head * stride_g_h + offs_d, mask=mask, other=0.0).to(tl.float32)
        out = out / (1.0 + tl.exp(-g))
    return out


# The split count is an argument, not a constexpr, and never specialised: a constexpr compiled one
# kernel per count, and the counts a step can take (as many as fill the SMs) are too many to compile at
# start-up. SPLIT says whether the keys are split at all, which changes what the program stores. The
# split shares the grid's second axis with the KV head, which is a constexpr: dividing the program id by
# the runtime count instead took 27 more registers a thread at 16-row tiles and spilled 104 more bytes at
# 128-row ones (sm_90, tests/kernels/sm90_compile.py).
@triton.jit(do_not_specialize=["splits"])
def _paged_attention_kernel(
    q, k_cache, v_cache, o, lse, gate, query_start_loc, seq_lens, block_tables, scale_log2, splits,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_g_t, stride_g_h, stride_kc_block, stride_kc_pos,
    stride_kc_head, stride_vc_block, stride_vc_pos, stride_vc_head, stride_bt,
    GROUP: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    LOOP_FOR: tl.constexpr, HAS_GATE: tl.constexpr, INTERIOR: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    wait_for_prior_grid(USE_PDL)
    seq, tile = tl.program_id(0), tl.program_id(2)
    if INTERIOR:  # the last tiles, whose rows attend to the most keys, start first
        tile = tl.num_programs(2) - 1 - tile
    kv_head, split = tl.program_id(1) % KV_HEADS, tl.program_id(1) // KV_HEADS
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    seq_len = tl.load(seq_lens + seq)
    if tile * BLOCK_M < q_len * GROUP:
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        token = rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_valid = token < q_len
        q_pos = seq_len - q_len + token  # position of each row's token in its sequence
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        q_ptrs = q + (q_start + token).to(tl.int64)[:, None] * stride_q_t + head[:, None] * stride_q_h + offs_d[None, :]
        q_tile = tl.load(q_ptrs, mask=row_valid[:, None] & mask_d[None, :], other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # Keys past the tile's last query position are masked for every row: stop there.
        kv_end = tl.minimum(seq_len, seq_len - q_len + (tile * BLOCK_M + BLOCK_M - 1) // GROUP + 1)
        if SPLIT:  # this program's share of the keys, whole BLOCK_N tiles each
            share = tl.cdiv(tl.cdiv(kv_end, splits), BLOCK_N) * BLOCK_N
            n = split * share
            kv_stop = tl.minimum(kv_end, n + share)
        else:
            n = 0
            kv_stop = kv_end
        if INTERIOR:  # whole key tiles that every row of the tile attends to: no masks
            first_pos = seq_len - q_len + (tile * BLOCK_M) // GROUP  # the position of the tile's first row
            interior_end = n + tl.maximum(tl.minimum(kv_stop, first_pos + 1) - n, 0) // BLOCK_N * BLOCK_N
            m_i, l_i, acc = _walk_keys(
                n, interior_end, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head,
                offs_d, mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block,
                stride_vc_pos, stride_vc_head, stride_bt, PAGE, BLOCK_N, PRECISION, False, LOOP_FOR)
            n = interior_end
        m_i, l_i, acc = _walk_keys(
            n, kv_stop, kv_stop, q_tile, q_pos, m_i, l_i, acc, k_cache, v_cache, block_tables, seq, kv_head, offs_d,
            mask_d, scale_log2, stride_kc_block, stride_kc_pos, stride_kc_head, stride_vc_block, stride_vc_pos,
            stride_vc_head, stride_bt, PAGE, BLOCK_N, PRECISION, True, LOOP_FOR)
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_row = (q_start + token).to(tl.int64)
        if SPLIT:  # partial output [T, Hq, splits, D] fp32 and its log2-sum-exp [T, Hq, splits]
            part = (out_row * (GROUP * KV_HEADS) + head) * splits + split
            tl.store(o + part[:, None] * BLOCK_D + offs_d[None, :], out, mask=row_valid[:, None] & mask_d[None, :])
            tl.store(lse + part, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_i)), mask=row_valid)
        else:
            mask = row_valid[:, None] & mask_d[None, :]
            out = _gated(out, gate, out_row[:, None], head[:, None], offs_d[None, :], mask, stride_g_t, stride_g_h,
                         HAS_GATE)
            o_ptrs = o + out_row[:, None] * stride_o_t + head[:, None] * stride_o_h + offs_d[None, :]
            tl.store(o_ptrs, out.to(o.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["splits"])
def _merge_splits_kernel(part, lse, o, gate, splits, stride_o_t, stride_o_h, stride_g_t, stride_g_h,
                         Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_S: tl.constexpr, HAS_GATE: tl.constexpr, USE_PDL: tl.constexpr = False):
    """One (token, head): the splits' outputs weighted by their share of the softmax mass. BLOCK_S, the
    count's next power of two, is all of it that is compiled in: five kernels serve every count. On the
    H200 one kernel of 32 rows for all of them took up to 7 us longer at 2 to 8 splits over some hundreds
    of tokens, and 16 rows at 2 warps about 1 us longer than at 4 (paged_attention_splits.json).
    The output projection's launch waits for its end (pdl.wait_for_prior_grid_only)."""
    wait_for_prior_grid_only(USE_PDL)
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    row = token * Q_HEADS + head
    offs_s = tl.arange(0, BLOCK_S)
    real = offs_s < splits
    offs_d = tl.arange(0, BLOCK_D)
    lse_s = tl.load(lse + row * splits + offs_s, mask=real, other=float("-inf"))
    top = tl.max(lse_s, 0)
    weight = tl.exp2(lse_s - tl.where(top == float("-inf"), 0.0, top))
    outs = tl.load(part + (row * splits + offs_s)[:, None] * BLOCK_D + offs_d[None, :], mask=real[:, None], other=0.0)
    out = tl.sum(outs * weight[:, None], 0) / tl.maximum(tl.sum(weight, 0), 1e-30)
    out = _gated(out, gate, token, head, offs_d, offs_d < HEAD_DIM, stride_g_t, stride_g_h, HAS_GATE)
    tl.store(o + token * stride_o_t + head * stride_o_h + offs_d, out.to(o.dtype.element_ty), mask=offs_d < HEAD_DIM)


MAX_SPLITS = 32
# Prefill chunks whose sequences hold LONG_ROWS rows or more (tokens times the GQA group) take 128 x 64 tiles
# at 8 warps; chunks of INTERIOR_TOKENS tokens or more walk the key tiles that every row of a query tile
# attends to without masks, the last (longest) query tiles first. On the H200, 16 query heads of 256 over 4 KV
# heads (2 alike), a chunk of 2048 tokens took 89.3 us fresh (cuDNN's sdpa 89.2), 234.9 over 2048 cached keys,
# 577.0 over 6144 and 2489.7 over 30720 (428 TFLOP/s), against 307.7 / 783.9 / 1917.4 / 8649.8 in masked
# 64 x 32 tiles and 148.3 / 332.7 / 731.7 / 3272.0 in masked 128 x 64 ones. Walked, the 128 x 64 tiles took a
# 1024-token prompt in 42.6 us against 52.6 masked, but 128 prompts of 128 tokens in 213.5 against 190.9
# masked (211.0 against 192.1 at 2 KV heads), where 64 x 32 tiles took 300.3 (paged_attention_prefill.json):
# a few key tiles a sequence gain less from the walk than its second loop costs. Between 128 and 1024 tokens
# the walk is not measured, so it waits for 1024.
LONG_ROWS = 512
INTERIOR_TOKENS = 1024


@dataclass(frozen=True)
class LaunchPlan:
    """The tiles of one call: rows (token, query head) a program, keys a step, and how many ranges the
    keys are split into (1: not split)."""
    block_m: int
    block_n: int
    tiles: int  # row tiles a (sequence, KV head)
    splits: int
    # Whether the kernel walks the keys that every row of a tile attends to without masks, the longest
    # tiles first (see LONG_ROWS).
    interior: bool = False

    @property
    def merge_rows(self) -> int:
        """The merge kernel's BLOCK_S: the split count's next power of two, all of it that is compiled in."""
        return triton.next_power_of_2(self.splits)


def launch_plan(tokens: int, seqs: int, longest: int, group: int, kv_heads: int, head_dim: int, sms: int,
                block_m: int | None = None, block_n: int | None = None, splits: int | None = None) -> LaunchPlan:
    """The tiles and split count of a call whose longest q_len is `longest`; block_m, block_n and splits
    override the defaults (a tuned call never takes the tall tiles)."""
    max_rows = max(min(longest, tokens), 1) * group
    tuned = block_m is not None or block_n is not None or splits is not None
    block_m = block_m or (16 if max_rows <= 16 else 64)
    block_n = block_n or (64 if head_dim <= 128 else 32)
    tiles = triton.cdiv(max_rows, block_m)
    programs = seqs * kv_heads * tiles
    if not tuned and programs < 128 and max_rows >= 128:
        # A short chunk over a long cached prefix (a prefix-cache hit's tail): tall tiles, so each K/V
        # tile serves more rows, and as many key splits as fill the SMs once (a second wave of programs
        # costs nearly a whole one). The step's rows make about cdiv(tokens * group, 128) tiles per KV
        # head; on the H200, 80 rows over 8240 keys (Qwen3.5-35B-A3B, 2 KV heads, a graph's 96 rows)
        # took 57.5 us this way against 76.5 with 8 splits of 32-key tiles, and 112 rows 69.8 against 80.2
        # (kernels_check paged_attention_hit_tail_*).
        work_tiles = kv_heads * triton.cdiv(tokens * group, 128)
        return LaunchPlan(128, 64, triton.cdiv(max_rows, 128), max(1, min(MAX_SPLITS, sms // work_tiles)))
    if not tuned and max_rows >= LONG_ROWS:
        return LaunchPlan(128, 64, triton.cdiv(max_rows, 128), 1, interior=min(longest, tokens) >= INTERIOR_TOKENS)
    if splits is None:
        splits = key_splits(programs, block_m, sms)
        if splits == 2 and block_m == 16 and head_dim > 128 and not tuned:
            # Where single-tile rows fill the SMs once but not twice, 64-key tiles unsplit keep as many
            # bytes in flight as two splits, without the merge kernel's launch: in the engine on the H200
            # (9B shape, 64 sequences) the step took 6.272-6.276 against 6.302-6.303 ms over 128-token
            # prompts and 8.115-8.123 against 8.253 over 2048-token ones, alternated twice in one command
            # (engine_qwen3.5-9b_*decode_bn64*_same_machine.json), though the attention alone timed 132.8
            # against 141.8 us at 2048 keys the other way round (paged_attention_decode.json).
            block_n, splits = 64, 1
    return LaunchPlan(block_m, block_n, tiles, splits)


def key_splits(programs: int, block_m: int, sms: int) -> int:
    """How many ranges the keys are split into, for `programs` (sequence, KV head, tile) programs.

    Few programs leave the SMs idle (decode of few sequences, a short chunk over a long cached prefix,
    which would otherwise walk the whole prefix in a few programs): about 256 programs in all. Single-tile
    rows (decode, short verify rows) are split up to about four programs an SM even where the programs
    already fill the SMs once: one program an SM walks its keys one tile after another at about a quarter
    of the bandwidth. On the H200 (9B attention, 16 query heads over 4 KV heads of 256, K/V out of L2;
    paged_attention_decode.json), 32 sequences took 16.7 against 20.6 us over 256 keys and 72.3 against
    134.7 over 2048 with 4 splits, 64 sequences 132.8 against 172.8 over 2048 with 2 (26.1 against 26.8
    over 256; launch_plan takes wider key tiles there instead), and 128 sequences were fastest unsplit."""
    if programs < 128:
        return min(16, triton.next_power_of_2(triton.cdiv(256, programs)))
    if block_m == 16:
        return min(16, 1 << max(0, (4 * sms // programs).bit_length() - 1))  # the largest power of two that fits
    return 1


def paged_attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                    block_m: int | None = None, block_n: int | None = None, splits: int | None = None,
                    num_warps: int | None = None, num_stages: int = 2, loop_for: bool | None = None,
                    gate: torch.Tensor | None = None, max_query_len: int | None = None,
                    interior: bool | None = None) -> torch.Tensor:
    """Same contract as the reference: q [T, Hq, D] over pools [blocks, page, Hk, D]; returns [T, Hq, D],
    times sigmoid(gate) when given (applied in the last store: a Qwen3.5 attention layer's gate took three
    elementwise launches after it). loop_for: walk the keys in a for loop (pipelined) rather than a while
    loop; by default on the GPU. max_query_len: the longest q_len of the batch, where the caller knows it
    (None: the bound T - B + 1, as a graph needs). block_m, block_n, splits, interior: override the plan's."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    if gate is not None and gate.stride(-1) != 1:
        gate = gate.contiguous()
    gate_args = (gate.stride(0), gate.stride(1)) if gate is not None else (0, 0)
    tokens, q_heads, head_dim = q.shape
    kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = q_heads // kv_heads
    seqs = seq_lens.shape[0]
    o = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if tokens == 0 or seqs == 0:
        return o
    longest = max_query_len if max_query_len is not None else tokens - seqs + 1  # the longest q_len possible
    plan = launch_plan(tokens, seqs, longest, group, kv_heads, head_dim, num_sms(q.device), block_m, block_n, splits)
    assert plan.splits <= MAX_SPLITS, f"at most {MAX_SPLITS} key splits"
    block_d = triton.next_power_of_2(head_dim)
    if plan.splits > 1:
        target = torch.empty((tokens, q_heads, plan.splits, block_d), dtype=torch.float32, device=q.device)
        lse = torch.empty((tokens, q_heads, plan.splits), dtype=torch.float32, device=q.device)
    else:
        target, lse = o, o
    grid = (seqs, kv_heads * plan.splits, plan.tiles)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, target, lse, gate if gate is not None else q, query_start_loc, seq_lens, block_tables,
        scale * 1.4426950408889634, plan.splits, q.stride(0), q.stride(1), o.stride(0), o.stride(1), *gate_args,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        GROUP=group, KV_HEADS=kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE=page,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        SPLIT=plan.splits > 1, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        LOOP_FOR=q.is_cuda if loop_for is None else loop_for, HAS_GATE=gate is not None and plan.splits == 1,
        INTERIOR=plan.interior if interior is None else interior,
        num_warps=num_warps or (8 if plan.block_m * head_dim >= 64 * 256 else 4), num_stages=num_stages,
        **launch_options(q),
    )
    if plan.splits > 1:
        _merge_splits_kernel[(tokens, q_heads)](
            target, lse, o, gate if gate is not None else o, plan.splits, o.stride(0), o.stride(1), *gate_args,
            Q_HEADS=q_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=plan.merge_rows,
            HAS_GATE=gate is not None, num_warps=4 if plan.merge_rows >= 16 else 2, **launch_options(q),
        )
    return o
