"""GPU check of the Triton kernels: error against the fp32 torch reference on bf16 inputs, and timings
at the decode shapes of the Qwen3.5-9B config (MoE at the Qwen3.5-35B-A3B shape).

    python benchmarks/kernels_check.py --commit <sha> --out benchmarks/results/kernels_check.json

Error: max |triton(bf16 inputs) - reference(fp32 copies of the same inputs)| / max |reference|, on every
output (states included). Time: microseconds per call of the kernel alone, from CUDA-graph replay of
10 calls (so Python launch cost is left out), beside the eager call time and, where it is cheap to
run, the torch reference's eager time on the same bf16 inputs. `gbps` is the bytes that the op must
move (read + write) over the kernel time, to set against the 4.24 TB/s copy bandwidth.
Results are written after every case, so a run cut short still leaves what it measured.
"""

import argparse
import datetime
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.kernel_times import per_kernel_us  # noqa: E402
from deltaserve.kernels.activation import reference as act_ref  # noqa: E402
from deltaserve.kernels.attention import reference as attn_ref  # noqa: E402
from deltaserve.kernels.conv1d import reference as conv_ref  # noqa: E402
from deltaserve.kernels.gdn import reference as gdn_ref  # noqa: E402
from deltaserve.kernels.moe import reference as moe_ref  # noqa: E402
from deltaserve.kernels.norm import reference as norm_ref  # noqa: E402
from deltaserve.kernels.rotary import reference as rot_ref  # noqa: E402

# SMOKE=1 runs every case at toy sizes on the CPU under TRITON_INTERPRET=1 (no timings): a check of
# this script itself before it spends GPU time.
SMOKE = os.environ.get("SMOKE") == "1"
DEV = "cpu" if SMOKE else "cuda"
BF16 = torch.float32 if SMOKE else torch.bfloat16
# Qwen3.5-9B text config
HIDDEN, INTER = 4096, 12288
HEADS, KV_HEADS, HEAD_DIM, ROTARY = 16, 4, 256, 64
HK, HV, DK, DV, CONV_K = 16, 32, 128, 128, 4
PAGE = 16
# Qwen3.5-35B-A3B MoE
EXPERTS, TOP_K, MOE_HIDDEN, MOE_INTER = 256, 8, 2048, 512
if SMOKE:
    HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, ROTARY = 64, 48, 4, 2, 32, 16
    HK, HV, DK, DV, PAGE = 1, 2, 16, 16, 4
    EXPERTS, TOP_K, MOE_HIDDEN, MOE_INTER = 8, 2, 32, 16
CONV_DIM = 2 * HK * DK + HV * DV


def rel_err(actual, expected) -> float:
    expected = expected.float()
    return ((actual.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


def f32(*xs):
    return [x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in xs]


def time_graph_us(fn, calls: int = 10, replays: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)


def time_eager_us(fn, iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


class Report:
    def __init__(self, path: str, meta: dict):
        self.path, self.data = path, dict(meta, cases=[])

    def add(self, case: dict) -> None:
        self.data["cases"].append(case)
        print(json.dumps(case), flush=True)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1)


ONLY: tuple[str, ...] = ()  # --only: run just the cases whose names start with one of these


def run_case(report: Report, name: str, body) -> None:
    if ONLY and not name.startswith(ONLY):
        return
    try:
        case = {"name": name}
        case.update(body())
    except Exception as exc:  # one broken kernel must not hide the others' results
        case = {"name": name, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    report.add(case)


def timing(fn, ref_fn=None, nbytes: int | None = None, graph: bool = True) -> dict:
    if SMOKE:
        return {"eager_us": 0.0}
    out = {"eager_us": round(time_eager_us(fn), 2)}
    if graph:
        out["kernel_us"] = round(time_graph_us(fn), 2)
        if nbytes:
            out["gbps"] = round(nbytes / out["kernel_us"] / 1e3, 1)
    if ref_fn is not None:
        out["reference_eager_us"] = round(time_eager_us(ref_fn, iters=5), 2)
    return out


# ---------------------------------------------------------------- cases

def gdn_decode(batch: int):
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent

    def body():
        slots_total = max(2 * batch, 8)
        q, k = torch.randn(batch, HK, DK, device=DEV, dtype=BF16), torch.randn(batch, HK, DK, device=DEV, dtype=BF16)
        v = torch.randn(batch, HV, DV, device=DEV, dtype=BF16)
        a, b = torch.randn(batch, HV, device=DEV, dtype=BF16), torch.randn(batch, HV, device=DEV, dtype=BF16)
        A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV)
        pool = torch.randn(slots_total, HV, DK, DV, device=DEV) * 0.1
        slots = torch.randperm(slots_total, device=DEV)[:batch].to(torch.int32)
        ref_pool, tri_pool = pool.clone(), pool.clone()
        expected = gdn_ref.recurrent_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, ref_pool, slots.long())
        out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, tri_pool, slots)
        res = {"shape": f"B={batch} Hk={HK} Hv={HV} Dk={DK} Dv={DV}", "rel_err_out": rel_err(out, expected),
               "rel_err_state": rel_err(tri_pool, ref_pool)}
        # fp32 inputs: the kernel should agree with the reference to fp32 rounding
        p32 = pool.clone()
        out32 = gdn_recurrent(*f32(q, k, v, a, b), A_log, dt_bias, p32, slots)
        p32r = pool.clone()
        exp32 = gdn_ref.recurrent_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, p32r, slots.long())
        res["rel_err_fp32"] = rel_err(out32, exp32)
        state_bytes = batch * HV * DK * DV * 4 * 2
        res.update(timing(lambda: gdn_recurrent(q, k, v, a, b, A_log, dt_bias, tri_pool, slots),
                          lambda: gdn_ref.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, pool, slots.long()),
                          nbytes=state_bytes))
        return res
    return body


def gdn_verify_commit(seqs: int, drafts: int = 3):
    """A verify step's GDN layer two ways: the token loop storing each sequence's state after every row but the
    last into verify slots and after its last in place, then the kept row's state copied back (every draft
    refuted, the most copying); or the loop storing nothing and gdn_commit taking each state through its kept
    rows. The committed states must equal the captured ones bit for bit (the engine's verify graphs rely on it)."""
    from deltaserve.kernels.gdn.triton_commit import gdn_commit
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent

    def body():
        per = drafts + 1
        rows = seqs * per
        q, k = torch.randn(rows, HK, DK, device=DEV, dtype=BF16), torch.randn(rows, HK, DK, device=DEV, dtype=BF16)
        v = torch.randn(rows, HV, DV, device=DEV, dtype=BF16)
        a, b = torch.randn(rows, HV, device=DEV, dtype=BF16), torch.randn(rows, HV, device=DEV, dtype=BF16)
        A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV)
        pool = torch.randn(seqs + 1, HV, DK, DV, device=DEV) * 0.1
        slots = torch.randperm(seqs, device=DEV).to(torch.int32)
        starts = (torch.arange(seqs + 1, device=DEV) * per).to(torch.int32)
        every_row = [(row, row) for row in range(rows)]
        after = torch.zeros(rows, HV, DK, DV, device=DEV)
        gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool.clone(), slots, starts, every_row, after)
        kept = torch.randint(1, per + 1, (seqs,), device=DEV, dtype=torch.int32)
        committed = pool.clone()
        out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, committed, slots, starts, store_state=False)
        unchanged = bool(torch.equal(committed, pool))
        gdn_commit(k[None], v[None], a[None], b[None], A_log[None], dt_bias[None], committed[None], slots, kept,
                   per, seqs)
        want = after[(starts[:-1] + kept - 1).long()]
        res = {"shape": f"{seqs} sequences of {per} rows, Hk={HK} Hv={HV} Dk={DK} Dv={DV}, fp32 state",
               "state_untouched_by_the_loop": unchanged,
               "bitwise_equal_to_captures": bool(torch.equal(committed[slots.long()], want)),
               "output_equal": bool(torch.equal(out, gdn_recurrent(q, k, v, a, b, A_log, dt_bias, pool.clone(), slots,
                                                                   starts)))}
        captures = [(s * per + j, s * drafts + j) for s in range(seqs) for j in range(drafts)]
        snaps = torch.zeros(seqs * drafts, HV, DK, DV, device=DEV)
        work = pool.clone()
        back = torch.tensor([s * drafts for s in range(seqs)], device=DEV)

        def captured():
            gdn_recurrent(q, k, v, a, b, A_log, dt_bias, work, slots, starts, captures, snaps)
            work.index_copy_(0, slots.long(), snaps.index_select(0, back))

        def committing():
            gdn_recurrent(q, k, v, a, b, A_log, dt_bias, work, slots, starts, store_state=False)
            gdn_commit(k[None], v[None], a[None], b[None], A_log[None], dt_bias[None], work[None], slots, kept,
                       per, seqs)

        res["captured_then_copied"] = timing(captured)
        res["committed"] = timing(committing)
        return res
    return body


def gdn_decode_fused_case(batch: int):
    """The fused GDN decode step (conv update, delta rule, gated norm) against the three unfused kernels."""
    from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d
    from deltaserve.kernels.gdn import decode_fused_reference as fused_ref
    from deltaserve.kernels.gdn.triton_decode_fused import gdn_decode_fused
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent
    from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm

    def body():
        slots_total = max(2 * batch, 8)
        packed = torch.randn(batch, CONV_DIM + HV * DV + 2 * HV, device=DEV, dtype=BF16)  # as the layer slices it
        mixed, z, b, a = packed.split([CONV_DIM, HV * DV, HV, HV], -1)
        w = torch.randn(CONV_DIM, CONV_K, device=DEV, dtype=BF16) * 0.5
        conv_state = torch.randn(slots_total, CONV_DIM, CONV_K - 1, device=DEV, dtype=BF16)
        A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV)
        pool = torch.randn(slots_total, HV, DK, DV, device=DEV) * 0.1
        norm_w = torch.randn(DV, device=DEV, dtype=BF16)
        slots = torch.randperm(slots_total, device=DEV)[:batch].to(torch.int32)
        ref_conv, ref_pool = conv_state.to(torch.float32, copy=True), pool.clone()
        expected = fused_ref.gdn_decode_fused(*f32(mixed, z, a, b, w), ref_conv, A_log, dt_bias, ref_pool,
                                              norm_w.float(), 1e-6, slots.long())
        tri_conv, tri_pool = conv_state.clone(), pool.clone()
        out = gdn_decode_fused(mixed, z, a, b, w, tri_conv, A_log, dt_bias, tri_pool, norm_w, 1e-6, slots)
        res = {"shape": f"B={batch} Hk={HK} Hv={HV} Dk={DK} Dv={DV} conv_dim={CONV_DIM} K={CONV_K}",
               "rel_err_out": rel_err(out, expected), "rel_err_state": rel_err(tri_pool, ref_pool),
               "rel_err_conv_state": rel_err(tri_conv, ref_conv)}
        nbytes = batch * (HV * DK * DV * 4 * 2 + CONV_DIM * (CONV_K - 1) * 2 * 2 + (CONV_DIM + 2 * HV * DV) * 2)
        t = timing(lambda: gdn_decode_fused(mixed, z, a, b, w, tri_conv, A_log, dt_bias, tri_pool, norm_w, 1e-6,
                                            slots), nbytes=nbytes)
        res.update({f"fused_{key}": val for key, val in t.items()})
        if not SMOKE:
            for warps in (4, 8, 16):
                res[f"fused_warps{warps}_kernel_us"] = round(time_graph_us(
                    lambda: gdn_decode_fused(mixed, z, a, b, w, tri_conv, A_log, dt_bias, tri_pool, norm_w, 1e-6,
                                             slots, num_warps=warps)), 2)

        def unfused(conv_pool=tri_conv, h_pool=tri_pool):  # the decode path before fusion: three launches
            x = causal_conv1d(mixed, w, conv_pool, slots, None)
            q, k, v = x.split([HK * DK, HK * DK, HV * DV], -1)
            o = gdn_recurrent(q.reshape(batch, HK, DK), k.reshape(batch, HK, DK), v.reshape(batch, HV, DV), a, b,
                              A_log, dt_bias, h_pool, slots)
            return gated_rms_norm(o, z.reshape(batch, HV, DV), norm_w, 1e-6)
        res["rel_err_unfused_out"] = rel_err(unfused(conv_state.clone(), pool.clone()).reshape(batch, -1), expected)
        t = timing(unfused, nbytes=nbytes)
        res.update({f"unfused_{key}": val for key, val in t.items()})
        return res
    return body


def paged_pools(seq_lens, dtype=BF16, kv_heads=KV_HEADS):
    blocks = [-(-s // PAGE) for s in seq_lens]
    total = sum(blocks) + 4
    k_cache = torch.randn(total, PAGE, kv_heads, HEAD_DIM, device=DEV, dtype=dtype)
    v_cache = torch.randn(total, PAGE, kv_heads, HEAD_DIM, device=DEV, dtype=dtype)
    perm = torch.randperm(total, device=DEV)
    tables = torch.zeros(len(seq_lens), max(blocks) + 1, dtype=torch.int32, device=DEV)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[used:used + n]
        used += n
    return k_cache, v_cache, tables


def attention_inputs(seq_lens, q_lens, kv_heads=KV_HEADS):
    """(q, k_cache, v_cache, query starts, sequence lengths, block tables, scale) of a ragged batch."""
    k_cache, v_cache, tables = paged_pools(seq_lens, kv_heads=kv_heads)
    starts = torch.tensor([0] + q_lens, device=DEV).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
    q = torch.randn(sum(q_lens), HEADS, HEAD_DIM, device=DEV, dtype=BF16)
    return q, k_cache, v_cache, starts, lens, tables, HEAD_DIM ** -0.5


def sweep_tiles(run, expected, tiles, flops: float | None = None) -> list[dict]:
    """run(**tile) for each tile dict (the first two under SMOKE): its error against `expected`, its time."""
    results = []
    for tile in tiles[:2] if SMOKE else tiles:
        cfg = dict(tile)
        try:
            fn = lambda: run(**tile)  # noqa: E731
            cfg["rel_err"] = rel_err(fn(), expected)
            if not SMOKE:
                cfg["kernel_us"] = round(time_graph_us(fn, calls=3, replays=5), 1)
                if flops:
                    cfg["tflops"] = round(flops / cfg["kernel_us"] / 1e6, 1)
        except Exception as exc:
            cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        results.append(cfg)
    return results


def attention(seq_lens, q_lens, label):
    from deltaserve.kernels.attention.triton_paged_attention import paged_attention

    def body():
        q, k_cache, v_cache, starts, lens, tables, scale = attention_inputs(seq_lens, q_lens)
        out = paged_attention(q, k_cache, v_cache, starts, lens, tables, scale)
        check = len(seq_lens) <= 64 and max(seq_lens) <= 4096
        res = {"shape": label}
        if check:
            expected = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale)
            res["rel_err_out"] = rel_err(out, expected)
        kv_bytes = sum(seq_lens) * KV_HEADS * HEAD_DIM * 2 * 2
        res.update(timing(lambda: paged_attention(q, k_cache, v_cache, starts, lens, tables, scale), nbytes=kv_bytes))
        if sum(q_lens) > 1 and "kernel_us" in res:
            flops = sum(4 * ql * (s - ql / 2) * HEADS * HEAD_DIM for s, ql in zip(seq_lens, q_lens))
            res["tflops"] = round(flops / res["kernel_us"] / 1e6, 1)
        return res
    return body


def fresh_attention(length: int):
    """The fresh-prefill attention (torch's sdpa, on its own choice of backend) on one prompt: its error
    against the fp32 reference (the math backend on fp32 copies), and its time beside sdpa's FlashAttention
    and cuDNN kernels pinned."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from deltaserve.kernels.attention.fresh_prefill import causal_attention_fresh

    def body():
        q = torch.randn(length, HEADS, HEAD_DIM, dtype=BF16, device=DEV)
        k, v = (torch.randn(length, KV_HEADS, HEAD_DIM, dtype=BF16, device=DEV) for _ in range(2))
        scale = HEAD_DIM**-0.5
        run = lambda: causal_attention_fresh(q, k, v, [0, length], scale)  # noqa: E731
        res = {"shape": f"one {length}-token prompt"}
        if length <= 8192:  # the math backend holds every score: 4.3 GB at 8192 rows
            with sdpa_kernel(SDPBackend.MATH):
                expected = causal_attention_fresh(*f32(q, k, v), [0, length], scale)
            res["rel_err_out"] = rel_err(run(), expected)
            del expected
        if not SMOKE:
            res["engine_eager_us"] = round(time_eager_us(run), 1)
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(backend):
                    res[f"{name}_eager_us"] = round(time_eager_us(run), 1)
        return res
    return body


def attention_sweep(seq_len: int):
    """Tile configs of the prefill attention on one prompt: error at each and time."""
    from deltaserve.kernels.attention.triton_paged_attention import paged_attention

    def body():
        q, k_cache, v_cache, starts, lens, tables, scale = attention_inputs([seq_len], [seq_len])
        expected = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale)
        configs = [(64, 32, 8, 2), (64, 32, 4, 2), (64, 64, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2),
                   (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 8, 3)]
        tiles = [{"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages}
                 for bm, bn, warps, stages in configs]
        run = lambda **tile: paged_attention(q, k_cache, v_cache, starts, lens, tables, scale, **tile)  # noqa: E731
        return {"shape": f"one {seq_len}-token prompt",
                "configs": sweep_tiles(run, expected, tiles, flops=4 * seq_len * seq_len / 2 * HEADS * HEAD_DIM)}
    return body


def attention_key_loop(seq_lens, q_lens, label):
    """The paged attention's key loop as a for loop (pipelined) against a while loop, same tiles."""
    from deltaserve.kernels.attention.triton_paged_attention import paged_attention

    def body():
        inputs = attention_inputs(seq_lens, q_lens)
        res = {"shape": label}
        for loop_for in (True, False):
            fn = lambda: paged_attention(*inputs, loop_for=loop_for and not SMOKE)  # noqa: E731
            fn()
            if not SMOKE:
                res["for_us" if loop_for else "while_us"] = round(time_graph_us(fn), 1)
        return res
    return body


def attention_tail_sweep(cached: int, rows: int, kv_heads: int):
    """Tile and split configs of a prefix-cache hit's tail: `rows` new rows over `cached` keys (and the
    16-row padding sequence of a graph-replayed pass beside it); the 35B-A3B shape has 2 KV heads."""
    from deltaserve.kernels.attention.triton_paged_attention import paged_attention

    def body():
        inputs = attention_inputs([cached + rows, 16], [rows, 16], kv_heads=kv_heads)
        q, k_cache, v_cache, starts, lens, tables, scale = inputs
        expected = attn_ref.paged_attention(*f32(q, k_cache, v_cache), starts, lens, tables, scale)
        res = {"shape": f"{rows} rows over {cached} cached keys, + 16 padding rows"}
        res["default_rel_err"] = rel_err(paged_attention(*inputs), expected)
        if not SMOKE:
            res["default_us"] = round(time_graph_us(lambda: paged_attention(*inputs), calls=3, replays=5), 1)
        configs = [(128, 32, splits, 8, 2) for splits in (8, 10, 11, 12, 13, 14, 16)]
        configs += [(128, 64, splits, 8, stages) for splits in (8, 11, 13) for stages in (1, 2)]
        configs += [(128, 32, splits, 8, 3) for splits in (11, 13)]
        configs += [(64, 64, splits, 4, 2) for splits in (11, 13, 22)]
        configs += [(128, 64, 13, 8, 3), (128, 64, 13, 4, 2), (128, 128, 13, 8, 2), (128, 128, 8, 8, 2),
                    (256, 64, 8, 8, 2), (256, 32, 8, 8, 2)]
        tiles = [{"block_m": bm, "block_n": bn, "splits": splits, "num_warps": warps, "num_stages": stages}
                 for bm, bn, splits, warps, stages in configs]
        res["configs"] = sweep_tiles(lambda **tile: paged_attention(*inputs, **tile), expected, tiles)
        return res
    return body


def moe_inputs(tokens: int):
    from deltaserve.kernels.moe.triton_moe_route import moe_route

    x = torch.randn(tokens, MOE_HIDDEN, device=DEV, dtype=BF16)
    w13 = torch.randn(EXPERTS, 2 * MOE_INTER, MOE_HIDDEN, device=DEV, dtype=BF16) * 0.03
    w2 = torch.randn(EXPERTS, MOE_HIDDEN, MOE_INTER, device=DEV, dtype=BF16) * 0.03
    weights, ids = moe_route(torch.randn(tokens, EXPERTS, device=DEV), TOP_K, True)
    floor_us = ids.unique().numel() * 3 * MOE_INTER * MOE_HIDDEN * 2 / 4.24e6
    return x, w13, w2, weights, ids, floor_us


def moe_sweep(tokens: int, path: str, configs, partial: bool = False, per_kernel: bool = False):
    """Tile configs of one MoE path: error and time of each, against the weight-read floor. partial:
    the direct path's PartialSums (checked as their total; the add-norm that sums them is not timed).
    per_kernel: also each kernel's own time, from the profiler."""
    from deltaserve.kernels.moe.triton_moe_experts import moe_experts

    def body():
        x, w13, w2, weights, ids, floor_us = moe_inputs(tokens)
        expected = moe_ref.moe_experts(*f32(x, w13, w2), weights, ids)
        res = {"shape": f"T={tokens}", "path": path, "floor_us": round(floor_us, 2), "configs": []}
        for tiles in configs[:2] if SMOKE else configs:
            cfg = {"tiles": tiles}
            try:
                fn = lambda: moe_experts(  # noqa: E731
                    x, w13, w2, weights, ids, tiles=tiles, path=path, partial=partial)
                out = fn()
                cfg["rel_err"] = rel_err(out.total() if partial else out, expected)
                if not SMOKE:
                    cfg["kernel_us"] = round(time_graph_us(fn), 2)
                    cfg["floor_ratio"] = round(cfg["kernel_us"] / floor_us, 2)
                    cfg["tflops"] = round(2 * ids.numel() * 3 * MOE_INTER * MOE_HIDDEN / cfg["kernel_us"] / 1e6, 1)
                    if per_kernel:
                        cfg["per_kernel_us"] = _per_kernel_us(fn)
            except Exception as exc:
                cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            res["configs"].append(cfg)
        return res
    return body


# triton_moe_direct.DirectTiles: (gate/up BLOCK_N, BLOCK_K, warps, stages, down BLOCK_N, BLOCK_K, warps,
# choices per step, stages); the first is the default.
MOE_DIRECT_TILES = [(16, 256, 4, 3, 8, 512, 4, 2, 2), (16, 256, 4, 1, 8, 512, 4, 2, 1), (16, 256, 4, 4, 8, 512, 4, 2, 3),
                    (16, 128, 4, 4, 8, 256, 4, 4, 2), (8, 512, 4, 3, 8, 512, 4, 1, 3), (8, 256, 4, 3, 8, 256, 4, 4, 2),
                    (16, 512, 8, 2, 16, 512, 8, 2, 2), (32, 128, 4, 3, 16, 128, 4, 2, 2), (8, 128, 2, 4, 4, 512, 2, 2, 2),
                    (16, 256, 4, 3, 16, 256, 4, 4, 2)]
# With PartialSums: the whole-sum default tiles with 1-9 groups of choices, other unroll steps and down
# tiles; the fourth is triton_moe_direct.PARTIAL_TILES.
MOE_DIRECT_PARTIAL_TILES = [(16, 256, 4, 3, 8, 512, 4, 2, 2, 3), (16, 256, 4, 3, 8, 512, 4, 2, 2, 1),
                            (16, 256, 4, 3, 8, 512, 4, 1, 2, 9), (16, 256, 4, 3, 8, 512, 4, 3, 1, 3),
                            (16, 256, 4, 3, 8, 512, 4, 2, 2, 5), (16, 256, 4, 3, 16, 512, 4, 3, 1, 3),
                            (16, 256, 4, 3, 16, 256, 4, 3, 2, 3), (16, 256, 4, 3, 8, 256, 2, 3, 2, 3),
                            (8, 256, 4, 3, 8, 512, 4, 3, 1, 3), (16, 128, 4, 4, 8, 512, 4, 3, 1, 3),
                            (8, 512, 4, 2, 8, 512, 4, 3, 1, 3)]
# triton_moe_experts.SortedTiles: (gate/up BLOCK_N, BLOCK_K, down BLOCK_N, BLOCK_K, BLOCK_M, warps, stages); a
# shorter tuple keeps the defaults of the size for the rest.
MOE_SORTED_TILES = [(16, 128, 32, 128), (32, 128, 64, 128), (16, 64, 32, 64), (32, 64, 32, 128), (64, 64, 64, 64)]
MOE_SORTED_LARGE_TILES = [(64, 64, 64, 64, 64, 4, 3), (64, 64, 64, 64, 128, 8, 3), (128, 64, 128, 64, 128, 8, 3),
                          (64, 64, 128, 64, 128, 4, 4), (128, 64, 128, 64, 64, 4, 3), (64, 128, 64, 128, 128, 8, 3),
                          (128, 64, 128, 64, 128, 8, 4), (64, 64, 128, 64, 64, 4, 4), (64, 64, 64, 64, 32, 4, 4),
                          # the same and others with the column tiles on the grid's fast axis
                          (64, 64, 64, 64, 64, 4, 3, True), (128, 64, 128, 64, 128, 8, 3, True),
                          (128, 64, 128, 64, 64, 4, 3, True), (64, 64, 128, 64, 128, 4, 4, True),
                          (128, 64, 128, 64, 128, 8, 4, True), (128, 64, 256, 64, 128, 8, 3, True),
                          (128, 32, 128, 64, 128, 8, 4, True), (128, 64, 256, 64, 128, 8, 4, True)]
# A long prompt's down kernel under its own warps and stages (K, the 512 intermediate columns, is 8 steps
# of 64: at one program a multiprocessor nothing overlaps a tile's stores; these fit two), gate/up as the
# large tiles.
MOE_SORTED_DOWN_TILES = [(128, 64, 256, 64, 128, 8, 4, True), (128, 64, 128, 64, 128, 8, 4, True, 4, 3),
                         (128, 64, 128, 64, 128, 8, 4, True, 8, 3), (128, 64, 64, 64, 128, 8, 4, True, 4, 3),
                         (128, 64, 256, 64, 128, 8, 4, True, 8, 3), (128, 64, 128, 128, 128, 8, 4, True, 8, 2),
                         (128, 64, 256, 32, 128, 8, 4, True, 8, 4)]
# Through TMA descriptors (SortedTiles.tma), against the same tiles without: the large and medium
# defaults, then other stages and tiles that the descriptors' smaller register need may favour.
MOE_SORTED_TMA_TILES = [(128, 64, 256, 64, 128, 8, 4, True), (128, 64, 256, 64, 128, 8, 4, True, 0, 0, True),
                        (128, 64, 256, 64, 128, 8, 3, True, 0, 0, True), (128, 64, 128, 64, 128, 8, 4, True, 0, 0, True),
                        (128, 128, 256, 64, 128, 8, 2, True, 0, 0, True), (128, 64, 256, 64, 128, 8, 4, True, 8, 3, True),
                        (64, 64, 64, 64, 64, 4, 3, True), (64, 64, 64, 64, 64, 4, 3, True, 0, 0, True),
                        (64, 64, 128, 64, 64, 4, 4, True, 0, 0, True)]
# A prefix-cache hit's tail (~80 rows, ~2.5 pairs per expert): the medium tiles first, then other down
# tiles (its K, the 512 intermediate columns, is short), smaller blocks and the small tiles.
MOE_SORTED_TAIL_TILES = [(64, 64, 64, 64, 64, 4, 3, True), (64, 64, 64, 128, 64, 4, 3, True),
                         (64, 64, 128, 64, 64, 4, 3, True), (64, 64, 128, 128, 64, 4, 3, True),
                         (64, 128, 64, 128, 64, 4, 3, True), (64, 64, 64, 64, 64, 4, 4, True),
                         (64, 64, 64, 64, 32, 4, 3, True), (64, 64, 64, 128, 32, 4, 4, True),
                         (32, 128, 64, 128, 16, 4, 3, False), (64, 128, 128, 128, 16, 4, 3, False),
                         (64, 64, 64, 64, 64, 4, 3, False), (64, 64, 32, 128, 64, 4, 3, True),
                         (64, 64, 64, 256, 64, 4, 3, True), (64, 64, 64, 512, 64, 4, 2, True),
                         (64, 64, 32, 512, 32, 4, 2, True), (64, 64, 128, 256, 32, 4, 3, True)]


def partial_sums_consumers(tokens: int):
    """The MoE router and the residual add-norm reading PartialSums of 1-16 parts (1: a plain bf16
    tensor), at the 35B-A3B shape: time per call, and agreement with the references on the parts' total."""
    from deltaserve.kernels.moe.triton_moe_route import moe_route
    from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm
    from deltaserve.kernels.partial_sums import PartialSums, first_columns

    def body():
        res = {"shape": f"T={tokens} experts={EXPERTS}+1 hidden={MOE_HIDDEN}", "route": [], "add_norm": []}
        for count in (1, 4, 8, 16):
            parts = torch.randn(count, tokens, EXPERTS + 8, device=DEV) * 2 / count ** 0.5
            logits = first_columns(PartialSums(parts, BF16), EXPERTS + 1)
            arg = logits.total() if count == 1 else logits
            fn = lambda: moe_route(arg, TOP_K, True, shared_gate=True)  # noqa: E731
            expected = moe_ref.moe_route(logits.total(), TOP_K, True, shared_gate=True)
            # bf16 logits tie often among 256 experts, and torch.topk orders ties its own way: the choices
            # match when they pick the same logit values
            weights, ids = fn()
            picked = [logits.total().float().gather(1, i[:, :TOP_K]).sort(1).values for i in (ids, expected[1])]
            res["route"].append({"parts": count, "ids_match": bool(torch.equal(ids, expected[1])),
                                 "picks_match_up_to_ties": bool(torch.equal(*picked)),
                                 "weights_err": rel_err(weights, expected[0]), **timing(fn)})
        for count in (1, 3, 4):
            partial = PartialSums(torch.randn(count, tokens, MOE_HIDDEN, device=DEV), BF16)
            residual = torch.randn(tokens, MOE_HIDDEN, device=DEV, dtype=BF16)
            weight = torch.randn(MOE_HIDDEN, device=DEV, dtype=BF16)
            arg = partial.total() if count == 1 else partial
            fn = lambda: add_rms_norm(arg, residual, weight, 1e-6, 1.0)  # noqa: E731
            expected = norm_ref.add_rms_norm(*f32(partial.total(), residual, weight), 1e-6, 1.0)
            res["add_norm"].append({"parts": count, "rel_err": rel_err(fn()[0], expected[0]), **timing(fn)})
        return res
    return body


def store_kv_case(tokens):
    from deltaserve.kernels.attention.triton_store_kv import store_kv

    def body():
        k_cache = torch.zeros(tokens // PAGE + 8, PAGE, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        v_cache = torch.zeros_like(k_cache)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        v = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        slots = torch.randperm(k_cache.shape[0] * PAGE, device=DEV)[:tokens]
        rk, rv = k_cache.clone(), v_cache.clone()
        attn_ref.store_kv(k, v, rk, rv, slots)
        store_kv(k, v, k_cache, v_cache, slots)
        res = {"shape": f"T={tokens}", "exact": bool(torch.equal(rk, k_cache) and torch.equal(rv, v_cache))}
        res.update(timing(lambda: store_kv(k, v, k_cache, v_cache, slots), nbytes=k.numel() * 2 * 2 * 2))
        return res
    return body


def norms(tokens):
    from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm
    from deltaserve.kernels.norm.triton_rms_norm import add_rms_norm, rms_norm

    def body():
        x, r = torch.randn(tokens, HIDDEN, device=DEV, dtype=BF16), torch.randn(tokens, HIDDEN, device=DEV, dtype=BF16)
        w = torch.randn(HIDDEN, device=DEV, dtype=BF16) * 0.1
        normed, summed = add_rms_norm(x, r, w, 1e-6, 1.0)
        exp_normed, exp_summed = norm_ref.add_rms_norm(*f32(x, r, w), 1e-6, 1.0)
        res = {"shape": f"T={tokens} hidden={HIDDEN}",
               "rel_err_add_rms_norm": rel_err(normed, exp_normed), "rel_err_sum": rel_err(summed, exp_summed),
               "rel_err_rms_norm": rel_err(rms_norm(x, w, 1e-6, 0.0), norm_ref.rms_norm(*f32(x, w), 1e-6, 0.0))}
        qk = torch.randn(tokens, HEADS, 2 * HEAD_DIM, device=DEV, dtype=BF16)[..., :HEAD_DIM]
        wq = torch.randn(HEAD_DIM, device=DEV, dtype=BF16)
        res["rel_err_head_norm"] = rel_err(rms_norm(qk, wq, 1e-6, 1.0), norm_ref.rms_norm(*f32(qk, wq), 1e-6, 1.0))
        o = torch.randn(tokens, HV, DV, device=DEV, dtype=BF16)
        z = torch.randn(tokens, HV, DV, device=DEV, dtype=BF16)
        wg = torch.randn(DV, device=DEV, dtype=BF16)
        res["rel_err_gated"] = rel_err(gated_rms_norm(o, z, wg, 1e-6), norm_ref.gated_rms_norm(*f32(o, z, wg), 1e-6))
        t = timing(lambda: add_rms_norm(x, r, w, 1e-6, 1.0), lambda: norm_ref.add_rms_norm(x, r, w, 1e-6, 1.0),
                   nbytes=x.numel() * 2 * 4)
        res.update({f"add_rms_norm_{key}": val for key, val in t.items()})
        t = timing(lambda: gated_rms_norm(o, z, wg, 1e-6), lambda: norm_ref.gated_rms_norm(o, z, wg, 1e-6),
                   nbytes=o.numel() * 2 * 3)
        res.update({f"gated_{key}": val for key, val in t.items()})
        return res
    return body


def norm_row_tiles(tokens):
    """The per-head norms of a prefill (the GDN output norm, the attention q norm) with the default row
    tiles against one row a program and other tiles."""
    from deltaserve.kernels.norm.triton_gated_rms_norm import gated_rms_norm
    from deltaserve.kernels.norm.triton_rms_norm import rms_norm

    def body():
        o = torch.randn(tokens, HV, DV, device=DEV, dtype=BF16)
        z = torch.randn(tokens, CONV_DIM + HV * DV, device=DEV, dtype=BF16)[:, CONV_DIM:].reshape(tokens, HV, DV)
        wg = torch.randn(DV, device=DEV, dtype=BF16)
        q = torch.randn(tokens, HEADS, 2 * HEAD_DIM, device=DEV, dtype=BF16)[..., :HEAD_DIM]
        wq = torch.randn(HEAD_DIM, device=DEV, dtype=BF16)
        expected_gated = norm_ref.gated_rms_norm(*f32(o, z, wg), 1e-6)
        expected_q = norm_ref.rms_norm(*f32(q, wq), 1e-6, 1.0)
        res = {"shape": f"T={tokens} gated [{HV}x{DV}] q [{HEADS}x{HEAD_DIM}]", "configs": []}
        for block_rows in (None, 1, 8, 16, 32):
            cfg = {"block_rows": block_rows or "default"}
            gated = lambda: gated_rms_norm(o, z, wg, 1e-6, block_rows=block_rows)  # noqa: E731
            head = lambda: rms_norm(q, wq, 1e-6, 1.0, block_rows=block_rows)  # noqa: E731
            cfg["rel_err_gated"], cfg["rel_err_q"] = rel_err(gated(), expected_gated), rel_err(head(), expected_q)
            if not SMOKE:
                cfg["gated_us"], cfg["q_us"] = round(time_graph_us(gated), 2), round(time_graph_us(head), 2)
                cfg["gated_tb_s"] = round(o.numel() * 2 * 3 / cfg["gated_us"] / 1e6, 2)
                cfg["q_tb_s"] = round(q.numel() * 2 * 2 / cfg["q_us"] / 1e6, 2)
            res["configs"].append(cfg)
        return res
    return body


def conv_row_tiles(lens, configs):
    """The conv1d row kernel over sequences of `lens` rows by its tiles (None: row_tiles_for's)."""
    from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d, row_tiles_for

    def body():
        tokens = sum(lens)
        w = torch.randn(CONV_DIM, CONV_K, device=DEV, dtype=BF16) * 0.5
        state = torch.randn(len(lens) + 2, CONV_DIM, CONV_K - 1, device=DEV, dtype=BF16)
        slots = torch.arange(len(lens), device=DEV, dtype=torch.int32) + 1
        starts = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
        x = torch.randn(tokens, CONV_DIM + HV * DV + 2 * HV, device=DEV, dtype=BF16)[:, :CONV_DIM]  # in_proj's slice
        expected = conv_ref.causal_conv1d(x.float(), w.float(), state.float().clone(), slots.long(), starts)
        res = {"shape": f"lens={lens} C={CONV_DIM}", "default": list(row_tiles_for(tokens, CONV_DIM)), "configs": []}
        for tiles in configs[:2] if SMOKE else configs:
            cfg = {"tiles": list(tiles) if tiles else "default"}
            try:
                fn = lambda: causal_conv1d(x, w, state.clone(), slots, starts, row_tiles=tiles)  # noqa: E731
                cfg["rel_err"] = rel_err(fn(), expected)
                if not SMOKE:
                    s2 = state.clone()
                    cfg["us"] = round(time_graph_us(lambda: causal_conv1d(x, w, s2, slots, starts, row_tiles=tiles)), 2)
                    cfg["tb_s"] = round(x.numel() * 2 * 2 / cfg["us"] / 1e6, 2)
            except Exception as exc:
                cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            res["configs"].append(cfg)
        return res
    return body


# A graph-replayed short pass (a prefix-cache hit's tail and the padding sequence): the row runs that
# row_tiles_for picks beside longer and shorter ones.
SHORT_PASS_ROW_TILES = [None, (128, 256, 1), (32, 256, 1), (16, 256, 1), (8, 256, 1), (4, 256, 1), (8, 128, 1)]


# (rows, channels, warps) of the conv1d row kernel; the first is the default.
CONV_ROW_TILES = [(128, 256, 1), (64, 256, 1), (256, 256, 1), (128, 128, 1), (64, 128, 1), (128, 512, 2),
                  (128, 512, 1), (32, 256, 1)]


def _decode_case(batch: int, dtype, state_dtype):
    """A decode step's inputs in dtype, a state pool in state_dtype twice the batch's size, and the fp32
    reference's output and pool after the step."""
    slots_total = 2 * batch
    q, k = torch.randn(batch, HK, DK, device=DEV, dtype=dtype), torch.randn(batch, HK, DK, device=DEV, dtype=dtype)
    v = torch.randn(batch, HV, DV, device=DEV, dtype=dtype)
    a, b = torch.randn(batch, HV, device=DEV, dtype=dtype), torch.randn(batch, HV, device=DEV, dtype=dtype)
    A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV)
    pool = (torch.randn(slots_total, HV, DK, DV, device=DEV) * 0.1).to(state_dtype)
    slots = torch.randperm(slots_total, device=DEV)[:batch].to(torch.int32)
    ref_pool = pool.float().clone()  # the reference updates it in place
    expected = gdn_ref.recurrent_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, ref_pool, slots.long())
    return q, k, v, a, b, A_log, dt_bias, pool, slots, ref_pool, expected


def gdn_decode_tiles(batch: int, state_dtype):
    """The decode delta rule's (block_v, warps) at one batch size, the state in state_dtype."""
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent

    def body():
        q, k, v, a, b, A_log, dt_bias, pool, slots, ref_pool, expected = _decode_case(batch, BF16, state_dtype)
        state_bytes = batch * HV * DK * DV * pool.element_size() * 2
        res = {"shape": f"B={batch} state {str(state_dtype).split('.')[-1]}", "configs": []}
        tiles = [(bv, w, None) for bv, w in GDN_DECODE_TILES] + GDN_DECODE_STREAMED_TILES
        for block_v, warps, streamed in [tiles[0], GDN_DECODE_STREAMED_TILES[1]] if SMOKE else tiles:
            cfg = {"block_v": block_v, "warps": warps, "streamed": streamed}
            try:
                p = pool.clone()
                out = gdn_recurrent(q, k, v, a, b, A_log, dt_bias, p, slots, block_v=block_v, num_warps=warps,
                                    streamed=streamed)
                cfg["rel_err_out"], cfg["rel_err_state"] = rel_err(out, expected), rel_err(p, ref_pool)
                if not SMOKE:
                    cfg["us"] = round(time_graph_us(
                        lambda: gdn_recurrent(q, k, v, a, b, A_log, dt_bias, p, slots, block_v=block_v,
                                              num_warps=warps, streamed=streamed)), 2)
                    cfg["tb_s"] = round(state_bytes / cfg["us"] / 1e6, 2)
            except Exception as exc:
                cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            res["configs"].append(cfg)
        return res
    return body


def compiled_registers(jit_fn) -> list | str:
    """Registers and spills of every variant of a Triton kernel compiled so far in this process."""
    try:
        return [{"constants": {str(k): v for k, v in kern.src.constants.items() if isinstance(v, int)},
                 "warps": kern.metadata.num_warps, "regs": kern.n_regs, "spills": kern.n_spills}
                for cache in jit_fn.device_caches.values() for kern in cache[0].values()]
    except Exception as exc:  # the cache's layout is Triton's own, and may change
        return f"{type(exc).__name__}: {exc}"


def gdn_decode_dot(batch: int):
    """A bf16 state's decode delta rule two ways: triton_recurrent's kernel, which widens its tile to fp32
    on the load, at its own tiles, and triton_recurrent_dot's (S^T q and S^T k as one tensor-core dot on
    the bf16 tile) at each (block_v, warps)."""
    from deltaserve.kernels.gdn import triton_recurrent, triton_recurrent_dot

    def body():
        dtype = torch.float16 if SMOKE else torch.bfloat16  # the interpreter's dots take no bf16
        q, k, v, a, b, A_log, dt_bias, pool, slots, ref_pool, expected = _decode_case(batch, dtype, dtype)
        state_bytes = batch * HV * DK * DV * pool.element_size() * 2
        runs = [("widened", triton_recurrent.gdn_recurrent, None, None, None)]
        runs += [("dot", triton_recurrent_dot.gdn_decode_dot, bv, w, streamed)
                 for bv, w, streamed in (GDN_DECODE_DOT_TILES[:3] if SMOKE else GDN_DECODE_DOT_TILES)]
        res = {"shape": f"B={batch} state {str(dtype).split('.')[-1]}", "configs": []}
        widened = None
        for name, fn, block_v, warps, streamed in runs:
            cfg = {"kernel": name, "block_v": block_v, "warps": warps, "streamed": streamed}
            try:
                p = pool.clone()
                out = fn(q, k, v, a, b, A_log, dt_bias, p, slots, block_v=block_v, num_warps=warps, streamed=streamed)
                cfg["rel_err_out"], cfg["rel_err_state"] = rel_err(out, expected), rel_err(p, ref_pool)
                if widened is None:
                    widened = (out, p)
                else:  # how far the dot's order of summation moves it from the widening kernel's bytes
                    cfg["max_diff_out_vs_widened"] = (out.float() - widened[0].float()).abs().max().item()
                    cfg["state_values_differing"] = int((p != widened[1]).sum().item())
                if not SMOKE:
                    cfg["us"] = round(time_graph_us(
                        lambda: fn(q, k, v, a, b, A_log, dt_bias, p, slots, block_v=block_v, num_warps=warps,
                                   streamed=streamed)), 2)
                    cfg["tb_s"] = round(state_bytes / cfg["us"] / 1e6, 2)
            except Exception as exc:
                cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            res["configs"].append(cfg)
        res["registers"] = {"widened": compiled_registers(triton_recurrent._gdn_recurrent_kernel),
                            "dot": compiled_registers(triton_recurrent_dot._gdn_decode_dot_kernel)}
        return res
    return body


# (block_v, warps, streamed): streamed runs the grid head first and marks the state's loads and stores
# evict-first, as decode_dot_tiles does for its 128-column tiles; None, the default's choice. Each pair is
# timed twice, apart.
GDN_DECODE_DOT_TILES = [(None, None, None), (128, 4, False), (128, 4, True), (64, 4, False), (64, 4, True),
                        (128, 8, False), (128, 8, True), (32, 4, False), (16, 2, False), (64, 2, False),
                        (128, 4, False), (128, 4, True)]


GDN_DECODE_TILES = [(None, None), (8, 1), (16, 1), (32, 1), (16, 2), (32, 2), (64, 2), (32, 4), (64, 4), (128, 4),
                    (64, 8), (128, 8)]
# (block_v, warps, streamed): the grid tile, head, sequence first and evict-first state traffic, or not;
# timed twice, apart. decode_tiles streams its 64-column tiles from 64 sequences of 32 heads.
GDN_DECODE_STREAMED_TILES = [(64, 4, False), (64, 4, True), (64, 2, False), (64, 2, True), (32, 4, True),
                             (64, 4, False), (64, 4, True)]


def rotary(tokens):
    from deltaserve.kernels.rotary.triton_rotary import apply_rotary

    def body():
        q = torch.randn(tokens, HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        positions = torch.randint(0, 4096, (tokens,), device=DEV)
        inv = 1.0 / (10000 ** (torch.arange(0, ROTARY, 2, device=DEV).float() / ROTARY))
        freqs = torch.arange(4096, device=DEV).float()[:, None] * inv[None]
        cache = torch.cat([freqs.cos(), freqs.sin()], -1)
        oq, ok = apply_rotary(q, k, positions, cache)
        eq, ek = rot_ref.apply_rotary(*f32(q, k), positions, cache)
        res = {"shape": f"T={tokens} rotary_dim={ROTARY}", "rel_err_q": rel_err(oq, eq), "rel_err_k": rel_err(ok, ek)}
        res.update(timing(lambda: apply_rotary(q, k, positions, cache),
                          lambda: rot_ref.apply_rotary(q, k, positions, cache), nbytes=(q.numel() + k.numel()) * 4))
        return res
    return body


def _rotary_store_inputs(tokens):
    """q (its output gate interleaved), k, v, the q and k norms' weights, positions, the cos/sin cache, the
    KV pages and a slot for each token, for rotary_store_kv."""
    q = torch.randn(tokens, HEADS, 2 * HEAD_DIM, device=DEV, dtype=BF16)[..., :HEAD_DIM]
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
    qw, kw = torch.randn(HEAD_DIM, device=DEV, dtype=BF16) * 0.1, torch.randn(HEAD_DIM, device=DEV, dtype=BF16) * 0.1
    positions = torch.randint(0, 4096, (tokens,), device=DEV)
    inv = 1.0 / (10000 ** (torch.arange(0, ROTARY, 2, device=DEV).float() / ROTARY))
    freqs = torch.arange(4096, device=DEV).float()[:, None] * inv[None]
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    pages = tokens // PAGE + 8
    slots = torch.randperm(pages * PAGE, device=DEV)[:tokens]
    return q, k, v, qw, kw, positions, cache, pages, slots


def rotary_store(tokens):
    """The fused q/k norm + rotary + KV store against the four unfused kernels it replaces."""
    from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv
    from deltaserve.kernels.attention.triton_store_kv import store_kv
    from deltaserve.kernels.norm.triton_rms_norm import rms_norm
    from deltaserve.kernels.rotary.triton_rotary import apply_rotary

    def body():
        q, k, v, qw, kw, positions, cache, pages, slots = _rotary_store_inputs(tokens)
        k_cache = torch.zeros(pages, PAGE, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16)
        v_cache = torch.zeros_like(k_cache)
        rk, rv = k_cache.float(), v_cache.float()
        eq = attn_ref.rotary_store_kv(*f32(q, k, v), positions, cache, rk, rv, slots, *f32(qw, kw), 1e-6, 1.0)
        oq = rotary_store_kv(q, k, v, positions, cache, k_cache, v_cache, slots, qw, kw, 1e-6, 1.0)
        res = {"shape": f"T={tokens} Hq={HEADS} Hk={KV_HEADS} D={HEAD_DIM} rotary_dim={ROTARY}",
               "rel_err_q": rel_err(oq, eq), "rel_err_k_cache": rel_err(k_cache, rk),
               "v_cache_exact": bool(torch.equal(v_cache.float(), rv))}
        t = timing(lambda: rotary_store_kv(q, k, v, positions, cache, k_cache, v_cache, slots, qw, kw, 1e-6, 1.0),
                   nbytes=(q.numel() * 2 + k.numel() * 2 + v.numel() * 2) * 2)
        res.update({f"fused_{key}": val for key, val in t.items()})

        def unfused():
            qn, kn = rms_norm(q, qw, 1e-6, 1.0), rms_norm(k, kw, 1e-6, 1.0)
            qr, kr = apply_rotary(qn, kn, positions, cache)
            store_kv(kr, v, k_cache, v_cache, slots)
        t = timing(unfused)
        res.update({f"unfused_{key}": val for key, val in t.items()})
        return res
    return body


# rotary_store_kv's (tokens a program, warps) on a long prompt's first chunk (k_out); (1, 2) is the kernel
# before token tiles, (LONG_BLOCK_T, LONG_WARPS) its long-pass default.
ROTARY_STORE_TILES = [(1, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8), (16, 4), (16, 8), (32, 8)]


def rotary_store_tiles(tokens, configs):
    """The fused q/k norm + rotary + KV store in token tiles: the bytes out against a token a program's,
    the error against the fp32 reference, and the time against the floor of its bytes (q, k and v read;
    q, k, the k and v caches written)."""
    from deltaserve.kernels.attention.triton_rotary_store_kv import rotary_store_kv

    def body():
        q, k, v, qw, kw, positions, cache, pages, slots = _rotary_store_inputs(tokens)
        ref_k_cache = torch.zeros(pages, PAGE, KV_HEADS, HEAD_DIM, device=DEV, dtype=torch.float32)
        ref_q = attn_ref.rotary_store_kv(*f32(q, k, v), positions, cache, ref_k_cache, torch.zeros_like(ref_k_cache),
                                         slots, *f32(qw, kw), 1e-6, 1.0)

        def run(block_t, warps, caches):
            return rotary_store_kv(q, k, v, positions, cache, *caches, slots, qw, kw, 1e-6, 1.0, k_out=True,
                                   block_t=block_t, num_warps=warps)
        new_caches = lambda: [torch.zeros(pages, PAGE, KV_HEADS, HEAD_DIM, device=DEV, dtype=BF16) for _ in "kv"]  # noqa: E731
        one = new_caches()
        expected = (*run(1, 2, one), *one)
        nbytes = (q.numel() * 2 + k.numel() * 4 + v.numel() * 2) * 2
        res = {"shape": f"T={tokens} Hq={HEADS} Hk={KV_HEADS} D={HEAD_DIM} rotary_dim={ROTARY}",
               "floor_us": round(nbytes / 4.24e6, 1), "configs": []}
        for block_t, warps in configs[:2] if SMOKE else configs:
            caches = new_caches()
            out = (*run(block_t, warps, caches), *caches)
            cfg = {"block_t": block_t, "warps": warps,
                   "same_bytes": all(torch.equal(a, b) for a, b in zip(out, expected)),
                   "max_abs_diff": max((a.float() - b.float()).abs().max().item() for a, b in zip(out, expected)),
                   "rel_err_q": rel_err(out[0], ref_q), "rel_err_k_cache": rel_err(caches[0], ref_k_cache)}
            if not SMOKE:
                cfg["kernel_us"] = round(time_graph_us(lambda: run(block_t, warps, caches)), 1)
            res["configs"].append(cfg)
        return res
    return body


def silu_mul(tokens):
    from deltaserve.kernels.activation.triton_silu_and_mul import silu_and_mul

    def body():
        x = torch.randn(tokens, 2 * INTER, device=DEV, dtype=BF16)
        res = {"shape": f"T={tokens} I={INTER}", "rel_err": rel_err(silu_and_mul(x), act_ref.silu_and_mul(x.float()))}
        res.update(timing(lambda: silu_and_mul(x), lambda: act_ref.silu_and_mul(x), nbytes=x.numel() * 3))
        return res
    return body


def conv(lens, label, tiles=()):
    """tiles: (block_t, block_c) of the per-sequence kernel to time beside the default path."""
    from deltaserve.kernels.conv1d.triton_causal_conv1d import causal_conv1d

    def body():
        tokens = sum(lens)
        w = torch.randn(CONV_DIM, CONV_K, device=DEV, dtype=BF16) * 0.5
        state = torch.randn(len(lens) + 4, CONV_DIM, CONV_K - 1, device=DEV, dtype=BF16)
        slots = torch.randperm(len(lens) + 4, device=DEV)[:len(lens)].to(torch.int32)
        starts = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
        x = torch.randn(tokens, CONV_DIM + 512, device=DEV, dtype=BF16)[:, :CONV_DIM]
        captures = [(lens[0] // 2, 0), (tokens - 1, 1)] if tokens > 2 else None
        snaps, ref_snaps = (torch.zeros(2, CONV_DIM, CONV_K - 1, device=DEV, dtype=BF16) for _ in range(2))
        ref_state, tri_state = state.float().clone(), state.clone()
        expected = conv_ref.causal_conv1d(x.float(), w.float(), ref_state, slots.long(), starts, captures, ref_snaps)
        out = causal_conv1d(x, w, tri_state, slots, starts, captures, snaps)
        state_after = tri_state.clone()
        res = {"shape": label, "rel_err_out": rel_err(out, expected), "rel_err_state": rel_err(tri_state, ref_state)}
        if captures:
            res["rel_err_snapshots"] = rel_err(snaps, ref_snaps)
        res.update(timing(lambda: causal_conv1d(x, w, tri_state, slots, starts), nbytes=x.numel() * 2 * 2))
        if tiles:  # the per-sequence kernel alone (block_t given) against the default, with the captures
            if not SMOKE:
                res["default_with_captures_us"] = round(
                    time_graph_us(lambda: causal_conv1d(x, w, tri_state, slots, starts, captures, snaps)), 2)
            res["configs"] = []
            for block_t, block_c in tiles:
                cfg = {"block_t": block_t, "block_c": block_c}
                s2, sn2 = state.clone(), torch.zeros_like(snaps)
                fn = lambda: causal_conv1d(x, w, s2, slots, starts, captures, sn2, block_c, block_t)  # noqa: E731
                got = fn()
                cfg["same_as_default"] = bool(torch.equal(got, out) and torch.equal(s2, state_after)
                                              and torch.equal(sn2, snaps))
                cfg["rel_err_out"] = rel_err(got, expected)
                if not SMOKE:
                    cfg["kernel_us"] = round(time_graph_us(fn), 2)
                res["configs"].append(cfg)
        return res
    return body


def gdn_prefill_inputs(lens):
    tokens = sum(lens)
    q, k = torch.randn(tokens, HK, DK, device=DEV, dtype=BF16), torch.randn(tokens, HK, DK, device=DEV, dtype=BF16)
    v = torch.randn(tokens, HV, DV, device=DEV, dtype=BF16)
    a, b = torch.randn(tokens, HV, device=DEV, dtype=BF16), torch.randn(tokens, HV, device=DEV, dtype=BF16)
    A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV)
    pool = torch.randn(len(lens) + 2, HV, DK, DV, device=DEV) * 0.1
    slots = torch.arange(len(lens), device=DEV).flip(0).to(torch.int32) + 1
    starts = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
    return q, k, v, a, b, A_log, dt_bias, pool, slots, starts


GDN_PREFILL_IMPLS = {
    "triton": "our chunk kernels, their defaults (bf16 dots on a long pass's state, tf32 on a short one's)",
    "triton_tf32x3": "our chunk kernels (tf32x3 dots on the state)",
    "fla": "fla-core chunk (bf16 inputs)",
    "fla_fp32": "fla-core chunk (fp32 copies of q, k, v)",
    "recurrent": "ragged recurrent loop",
}


def gdn_prefill_fn(impl: str, inputs, tiles: dict | None = None):
    """fn(pool, captures=None, snapshots=None) -> o, for one prefill implementation."""
    from deltaserve.kernels.gdn import fla_chunk, triton_chunk
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent

    q, k, v, a, b, A_log, dt_bias, _, slots, starts = inputs
    if impl.startswith("triton"):
        extra = dict(tiles or {})
        if impl == "triton_tf32x3":
            extra["precision"] = "tf32x3"
        return lambda p, c=None, s=None: triton_chunk.chunk_gdn(q, k, v, a, b, A_log, dt_bias, p, slots, starts, c, s,
                                                                **extra)
    if impl.startswith("fla"):
        fp32 = impl == "fla_fp32"
        return lambda p, c=None, s=None: fla_chunk.chunk_gdn_fla(q, k, v, a, b, A_log, dt_bias, p, slots, starts, c, s,
                                                                 fp32_inputs=fp32)

    def recurrent(p, c=None, s=None):
        return gdn_recurrent(q, k, v, a, b, A_log, dt_bias, p, slots, starts, c, s)
    return recurrent


def gdn_prefill(lens, label, impl: str, check_max_tokens: int = 8192):
    def body():
        inputs = gdn_prefill_inputs(lens)
        q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
        tokens = sum(lens)
        captures = [(lens[0] // 2, 0), (lens[0] - 1, 1)] if lens[0] > 2 else None
        snaps, ref_snaps = (torch.zeros(2, HV, DK, DV, device=DEV) for _ in range(2))
        ref_pool, tri_pool = pool.clone(), pool.clone()
        fn = gdn_prefill_fn(impl, inputs)
        res = {"shape": label, "impl": GDN_PREFILL_IMPLS[impl]}
        if tokens <= check_max_tokens:
            expected = gdn_ref.chunk_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, ref_pool, slots.long(),
                                                      starts, captures, ref_snaps)
            out = fn(tri_pool, captures, snaps)
            res.update(rel_err_out=rel_err(out, expected), rel_err_state=rel_err(tri_pool, ref_pool))
            if captures:
                res["rel_err_snapshots"] = rel_err(snaps, ref_snaps)
        res.update(timing(lambda: fn(tri_pool), graph=False))
        res["us"] = res.pop("eager_us")
        if captures and not SMOKE:
            res["with_captures_us"] = round(time_eager_us(lambda: fn(tri_pool, captures, snaps)), 2)
        if impl.startswith("triton") and not SMOKE:  # no host sync without captures: graph-timed too
            res["kernel_us"] = round(time_graph_us(lambda: fn(tri_pool), calls=2, replays=5), 2)
            # the chunk algorithm's dots per token and value head: k.k, q.k, w, u, w S, q S, Aqk v_new, k^T v_new
            flops = 2 * tokens * HV * (2 * 64 * DK + 64 * (DK + DV) + 3 * DK * DV + 64 * DV)
            res["tflops"] = round(flops / res["kernel_us"] / 1e6, 1)
        return res
    return body


def _per_kernel_us(fn, calls: int = 3) -> dict:
    """Mean device time of each kernel `fn` launches, by the first 40 characters of its name."""
    return {name[:40]: us for name, us in per_kernel_us(fn, calls).items()}


def _gdn_prefill_reference(lens):
    """Fresh inputs over prompts of `lens`, the fp32 reference's output and the state pool it leaves."""
    inputs = gdn_prefill_inputs(lens)
    q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
    ref_pool = pool.clone()
    expected = gdn_ref.chunk_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, ref_pool, slots.long(), starts)
    return inputs, expected, ref_pool


def gdn_prefill_sweep(seq_len: int):
    """State-kernel tiles of our chunk prefill on one prompt: error and time of each."""
    def body():
        inputs, expected, ref_pool = _gdn_prefill_reference([seq_len])
        res = {"shape": f"one {seq_len}-token prompt", "configs": []}
        # ((block_v, warps, stages, precision, output in its own kernel), the prepare kernel's options)
        fast = (32, 8, 3, "bf16", True)  # the fastest state tiles measured (bf16 operands: not the default)
        old = {"precision": "tf32x3", "sub": 16}  # the prepare kernel before it took the long passes' options
        configs = [((32, 4, 2, "tf32", False), old), (fast, old), (fast, {}), (fast, {"sub": 16}),
                   (fast, {"precision": "tf32x3"}), ((32, 8, 3, "tf32", True), {}), ((16, 8, 3, "bf16", True), {}),
                   ((64, 8, 3, "bf16", True), {}), ((32, 8, 2, "tf32", False), {}),
                   # the default state tiles under prepare kernels of more warps and wider w / u column tiles
                   ((32, 4, 2, "tf32", False), {}), ((32, 4, 2, "tf32", False), {"warps": 8}),
                   ((32, 4, 2, "tf32", False), {"bv": 64}), ((32, 4, 2, "tf32", False), {"bv": 64, "warps": 8}),
                   ((32, 4, 2, "tf32", False), {"bv": 128, "warps": 8})]
        for (bv, warps, stages, precision, split), prep in configs[:2] if SMOKE else configs:
            tiles = dict(block_v=bv, num_warps=warps, num_stages=stages, precision=precision, split_output=split,
                         prepare=prep)
            res["configs"].append(_gdn_prefill_config(inputs, expected, ref_pool, tiles))
        return res
    return body


def _gdn_prefill_config(inputs, expected, ref_pool, tiles: dict) -> dict:
    """One set of chunk-kernel options against the reference: errors, time and each kernel's time."""
    cfg = dict(tiles)
    try:
        p = inputs[7].clone()  # the state pool
        fn = gdn_prefill_fn("triton", inputs, tiles)
        cfg["rel_err_out"] = rel_err(fn(p), expected)
        cfg["rel_err_state"] = rel_err(p, ref_pool)
        if not SMOKE:
            cfg["kernel_us"] = round(time_graph_us(lambda: fn(p), calls=2, replays=5), 1)
            cfg["per_kernel_us"] = _per_kernel_us(lambda: fn(p))
    except Exception as exc:
        cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return cfg


# The long passes' state kernel options with the buffers between the kernels in bf16 or fp32 (the same numbers
# under bf16 dots) and the earlier default (tf32 dots, the output in the state kernel): (block_v, warps,
# stages, precision, split, buffer dtype).
GDN_LONG_PASS_STATE = [(32, 4, 2, "tf32", False, None), (32, 8, 3, "bf16", True, torch.float32),
                       (32, 8, 3, "bf16", True, None), (32, 4, 2, "bf16", True, None), (32, 4, 3, "bf16", True, None),
                       (64, 8, 3, "bf16", True, None), (64, 4, 2, "bf16", True, None), (64, 4, 3, "bf16", True, None),
                       (16, 4, 2, "bf16", True, None)]
# The output kernel's (columns, warps, stages) under the long passes' default state options.
GDN_OUTPUT_TILES = [(64, 4, 2), (128, 4, 2), (128, 8, 2), (128, 8, 3), (64, 8, 2), (32, 4, 2)]


def gdn_prefill_long_pass_state(lens, label):
    """The state kernel's options on a long pass, each against the fp32 reference: errors, per-kernel time."""
    def body():
        inputs, expected, ref_pool = _gdn_prefill_reference(lens)
        res = {"shape": label, "configs": []}
        for bv, warps, stages, precision, split, buffers in GDN_LONG_PASS_STATE[:2] if SMOKE else GDN_LONG_PASS_STATE:
            tiles = dict(block_v=bv, num_warps=warps, num_stages=stages, precision=precision, split_output=split,
                         buffer_dtype=buffers)
            cfg = _gdn_prefill_config(inputs, expected, ref_pool, tiles)
            cfg["buffer_dtype"] = str(buffers or "default").replace("torch.", "")
            res["configs"].append(cfg)
        for bv, warps, stages in GDN_OUTPUT_TILES[:2] if SMOKE else GDN_OUTPUT_TILES:
            tiles = dict(output=dict(bv=bv, warps=warps, stages=stages), split_output=True)
            res["configs"].append(_gdn_prefill_config(inputs, expected, ref_pool, tiles))
        # bf16 dots round what they read from a buffer: bf16 buffers should give the bytes of fp32 ones
        outs = []
        for buffers in (torch.float32, None):
            p = inputs[7].clone()  # the state pool
            fn = gdn_prefill_fn("triton", inputs, dict(precision="bf16", split_output=True, buffer_dtype=buffers))
            outs.append((fn(p), p))
        res["bf16_buffers_same_bytes"] = all(torch.equal(x, y) for x, y in zip(*outs))
        return res
    return body


def gdn_prefill_u_dtype(lens, label):
    """u in bf16 against fp32 on a long pass, the kernels' defaults otherwise: errors against the fp32
    reference and per-kernel times (u is the prepare kernel's largest write and the state kernel's largest
    read, and a 16-bit u rounds what no dot rounds)."""
    def body():
        inputs, expected, ref_pool = _gdn_prefill_reference(lens)
        configs = [{}, {"u_dtype": torch.bfloat16}]
        res = {"shape": label, "configs": [_gdn_prefill_config(inputs, expected, ref_pool, c) for c in configs]}
        for cfg in res["configs"]:
            cfg["u_dtype"] = str(cfg.pop("u_dtype", torch.float32)).replace("torch.", "")
        return res
    return body


# (prepare kernel's register cap, state kernel's (block_v, warps, stages)); None: no cap. At 175 registers
# two prepare programs of 4 warps share a multiprocessor, at 168 three (LONG_PASS_PREPARE's cap); the
# state kernel's two stages take 196 KB of shared memory (one program a multiprocessor), one stage 74 KB.
GDN_OCCUPANCY = [(None, (32, 4, 2)), (168, (32, 4, 2)), (160, (32, 4, 2)), (128, (32, 4, 2)),
                 (168, (32, 4, 1)), (168, (64, 4, 2)), (168, (64, 8, 2)), (168, (16, 4, 2))]


def gdn_prefill_occupancy(lens, label):
    """The chunk kernels' occupancy on a long pass: the prepare kernel under register caps, the state
    kernel under tiles that fit more programs a multiprocessor; error and per-kernel time of each."""
    def body():
        inputs, expected, ref_pool = _gdn_prefill_reference(lens)
        res = {"shape": label, "configs": []}
        for maxnreg, (bv, warps, stages) in GDN_OCCUPANCY[:2] if SMOKE else GDN_OCCUPANCY:
            prepare = dict(_uncapped_long_prepare(), **({"maxnreg": maxnreg} if maxnreg else {}))
            tiles = dict(block_v=bv, num_warps=warps, num_stages=stages, prepare=prepare)
            res["configs"].append(_gdn_prefill_config(inputs, expected, ref_pool, tiles))
        return res
    return body


def _uncapped_long_prepare() -> dict:
    from deltaserve.kernels.gdn.triton_chunk import LONG_PASS_PREPARE
    return {k: v for k, v in LONG_PASS_PREPARE.items() if k != "maxnreg"}


def gdn_short_pass(lens):
    """A short prefill pass as a graph replays it (a prefix-cache hit's tail plus the padding sequence,
    four captures from a device table): the chunk kernels against the token loop, over their tiles."""
    from deltaserve.kernels.capture_rows import GraphCaptureRows
    from deltaserve.kernels.gdn import triton_chunk
    from deltaserve.kernels.gdn.triton_recurrent import gdn_recurrent

    def body():
        inputs = gdn_prefill_inputs(lens)
        q, k, v, a, b, A_log, dt_bias, pool, slots, starts = inputs
        rows = [min(r, lens[0] - 1) for r in (lens[0] // 4, lens[0] // 2, lens[0] - 1)] + [sum(lens) - 1]
        rows = sorted(set(rows))
        pairs = [(r, i) for i, r in enumerate(rows)]
        table = GraphCaptureRows(torch.tensor([rows, list(range(len(rows)))] * 2, dtype=torch.int32, device=DEV))
        ref_pool, ref_snaps = pool.clone(), torch.zeros(len(rows), HV, DK, DV, device=DEV)
        expected = gdn_ref.chunk_gated_delta_rule(*f32(q, k, v, a, b), A_log, dt_bias, ref_pool, slots.long(),
                                                  starts, pairs, ref_snaps)
        res = {"shape": f"rows {lens}, captures at {rows}", "configs": []}
        short = dict(chunk=16, block_v=64)  # what the dispatch gives passes of up to 128 rows
        configs = [("chunk", short), ("loop", {}), ("chunk", dict(short, precision="bf16")),
                   ("chunk", dict(short, prepare={"precision": "tf32"})),
                   ("chunk", dict(short, precision="bf16", prepare={"precision": "tf32"})),
                   ("chunk", dict(short, precision="bf16", block_v=32)),
                   ("chunk", dict(short, precision="bf16", num_warps=8, num_stages=3)),
                   ("chunk", dict(short, precision="bf16", split_output=True)),
                   ("chunk", dict(short, prepare={"sub": 8})), ("chunk", dict(short, prepare={"sub": 4})),
                   ("chunk", dict(short, prepare={"warps": 2})), ("chunk", dict(short, prepare={"warps": 8})),
                   ("chunk", dict(short, num_warps=2)), ("chunk", dict(short, num_warps=8)),
                   ("chunk", dict(short, num_stages=1)), ("chunk", dict(short, num_stages=3))]
        for kind, tiles in configs[:3] if SMOKE else configs:
            cfg = {"kernel": kind, **tiles}
            kernel = triton_chunk.chunk_gdn if kind == "chunk" else gdn_recurrent
            p, snaps = pool.clone(), torch.zeros_like(ref_snaps)

            def fn():
                return kernel(q, k, v, a, b, A_log, dt_bias, p, slots, starts, table, snaps, **tiles)
            try:
                cfg["rel_err_out"] = rel_err(fn(), expected)
                cfg["rel_err_state"] = rel_err(p, ref_pool)
                cfg["rel_err_snapshots"] = rel_err(snaps, ref_snaps)
                if not SMOKE:
                    cfg["kernel_us"] = round(time_graph_us(fn), 1)
                    cfg["per_kernel_us"] = _per_kernel_us(fn)
            except Exception as exc:
                cfg["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            res["configs"].append(cfg)
        return res
    return body


def moe_align(tokens: int):
    """Ordering a pass's (token, choice) pairs by expert and laying out the blocks: align_pairs (the one-launch
    counting sort up to COUNTING_SORT_MAX_PAIRS, the block-wise one past it) against the block-wise sort at
    the same size and torch's stable sort alone (what larger batches took before, with an align kernel)."""
    from deltaserve.kernels.moe import triton_moe_experts as experts_mod

    def body():
        choices = TOP_K + 1
        ids = torch.randint(0, EXPERTS + 1, (tokens, choices), device=DEV)
        flat = ids.flatten()
        one_launch = flat.shape[0] <= experts_mod.COUNTING_SORT_MAX_PAIRS
        expected = flat.sort(stable=True).indices
        order, offsets, block_start, _ = experts_mod.align_pairs(ids, EXPERTS + 1, 16)
        res = {"shape": f"{tokens} tokens x {choices} choices over {EXPERTS + 1} experts",
               "align_pairs_path": "one launch" if one_launch else "block-wise",
               "order_is_stable_sort": bool(torch.equal(order, expected))}
        block_sort = lambda: experts_mod._block_counting_sort(flat, EXPERTS + 1, 16)  # noqa: E731
        res["block_sort_same_as_align_pairs"] = all(
            torch.equal(x, y) for x, y in zip(block_sort(), (order, offsets, block_start)))
        if not SMOKE:
            res["align_pairs_us"] = round(time_graph_us(lambda: experts_mod.align_pairs(ids, EXPERTS + 1, 16)), 2)
            res["block_sort_us"] = round(time_graph_us(block_sort), 2)
            res["torch_sort_us"] = round(time_graph_us(lambda: flat.sort(stable=True)), 2)
        res["variants"] = []
        if one_launch:  # (pairs ranked by each program, warps) of the one-launch counting sort
            for block, warps in ((32, 4), (64, 4), (128, 4), (64, 8), (32, 2)):
                run = lambda: experts_mod._count_and_rank(flat, EXPERTS + 1, 16, block, warps)  # noqa: E731
                res["variants"].append(_align_variant(run, (order, offsets, block_start),
                                                      {"rank_block": block, "num_warps": warps}))
        for block, tile, warps in ((256, 64, 4), (512, 64, 4), (512, 128, 4), (1024, 128, 8), (128, 32, 4)):
            run = lambda: experts_mod._block_counting_sort(flat, EXPERTS + 1, 16, block, tile, warps)  # noqa: E731
            res["variants"].append(_align_variant(run, (order, offsets, block_start),
                                                  {"sort_block": block, "rank_tile": tile, "num_warps": warps}))
        return res
    return body


def _align_variant(run, expected: tuple, cfg: dict) -> dict:
    cfg["same_as_align_pairs"] = all(torch.equal(x, y) for x, y in zip(run(), expected))
    if not SMOKE:
        cfg["kernel_us"] = round(time_graph_us(run), 2)
    return cfg


def moe(tokens):
    from deltaserve.kernels.moe.triton_moe_experts import moe_experts
    from deltaserve.kernels.moe.triton_moe_route import moe_route

    def body():
        x, w13, w2, _, _, _ = moe_inputs(tokens)
        logits32 = torch.randn(tokens, EXPERTS, device=DEV)  # fp32 for the check: bf16 logits tie often
        weights, ids = moe_route(logits32, TOP_K, True)
        ew, eids = moe_ref.moe_route(logits32, TOP_K, True)
        res = {"shape": f"T={tokens} E={EXPERTS} k={TOP_K} H={MOE_HIDDEN} I={MOE_INTER}",
               "route_ids_equal": bool(torch.equal(ids, eids)), "rel_err_route": rel_err(weights, ew)}
        logits = logits32.to(BF16)
        weights, ids = moe_route(logits, TOP_K, True)
        touched = ids.unique().numel()
        nbytes = touched * 3 * MOE_INTER * MOE_HIDDEN * 2
        res.update(experts_touched=touched, floor_us=round(nbytes / 4.24e6, 2))
        expected = moe_ref.moe_experts(*f32(x, w13, w2), weights, ids) if tokens <= 256 else None
        out = moe_experts(x, w13, w2, weights, ids)  # the default path for this size
        if expected is not None:
            res["rel_err_out"] = rel_err(out, expected)
        t = timing(lambda: moe_experts(x, w13, w2, weights, ids), nbytes=nbytes)
        res.update({f"experts_{key}": val for key, val in t.items()})
        for path in ("direct", "sorted"):
            if path == "direct" and tokens > 256:
                continue
            fn = lambda: moe_experts(x, w13, w2, weights, ids, path=path)  # noqa: E731
            if expected is not None:
                res[f"{path}_rel_err"] = rel_err(fn(), expected)
                res[f"{path}_reproducible"] = bool(torch.equal(fn(), fn()))
            if not SMOKE:
                res[f"{path}_kernel_us"] = round(time_graph_us(fn), 2)
                res[f"{path}_floor_ratio"] = round(res[f"{path}_kernel_us"] / res["floor_us"], 2)
        t = timing(lambda: moe_route(logits, TOP_K, True))
        res.update({f"route_{key}": val for key, val in t.items()})
        if not SMOKE:
            for warps in (1, 2, 4):
                res[f"route_warps{warps}_kernel_us"] = round(
                    time_graph_us(lambda: moe_route(logits, TOP_K, True, num_warps=warps)), 2)

            def step():  # routing and experts of one MoE layer, as a decode step replays them
                w, i = moe_route(logits, TOP_K, True)
                moe_experts(x, w13, w2, w, i)
            res["route_and_experts_kernel_us"] = round(time_graph_us(step), 2)
        return res
    return body


def moe_shared(tokens):
    """Direct against sorted path with the shared expert stacked as a (k+1)-th choice, as the model runs
    them when its shared expert has the routed experts' size: where DIRECT_MAX_PAIRS should sit."""
    from deltaserve.kernels.moe.triton_moe_experts import DIRECT_MAX_PAIRS, moe_experts
    from deltaserve.kernels.moe.triton_moe_route import moe_route

    def body():
        x, w13, w2, _, _, _ = moe_inputs(tokens)
        shared_w13 = torch.randn(1, 2 * MOE_INTER, MOE_HIDDEN, device=DEV, dtype=BF16) * 0.03
        shared_w2 = torch.randn(1, MOE_HIDDEN, MOE_INTER, device=DEV, dtype=BF16) * 0.03
        w13, w2 = torch.cat([w13, shared_w13]), torch.cat([w2, shared_w2])
        logits = torch.randn(tokens, EXPERTS + 1, device=DEV)
        weights, ids = moe_route(logits, TOP_K, True, shared_gate=True)
        ew, eids = moe_ref.moe_route(logits, TOP_K, True, shared_gate=True)
        expected = moe_ref.moe_experts(*f32(x, w13, w2), weights, ids)
        floor_us = ids.unique().numel() * 3 * MOE_INTER * MOE_HIDDEN * 2 / 4.24e6
        res = {"shape": f"T={tokens} E={EXPERTS}+1 k={TOP_K}+1", "route_ids_equal": bool(torch.equal(ids, eids)),
               "rel_err_route": rel_err(weights, ew), "floor_us": round(floor_us, 2),
               "default_path": "direct" if ids.numel() <= DIRECT_MAX_PAIRS else "sorted"}
        for path in ("direct", "sorted"):
            fn = lambda: moe_experts(x, w13, w2, weights, ids, path=path)  # noqa: E731
            res[f"{path}_rel_err"] = rel_err(fn(), expected)
            if not SMOKE:
                res[f"{path}_kernel_us"] = round(time_graph_us(fn), 2)
        return res
    return body


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", default="benchmarks/results/kernels_check.json")
    parser.add_argument("--skip-fla", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated case-name prefixes")
    args = parser.parse_args()
    global ONLY
    ONLY = tuple(p for p in args.only.split(",") if p)
    torch.manual_seed(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": args.commit, "gpu": "" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }
    import triton
    meta["triton"] = triton.__version__
    if SMOKE:
        meta["gpu"] = "none (SMOKE run on the CPU interpreter)"
    from deltaserve.kernels.gdn.fla_chunk import fla_available
    meta["fla_core"] = fla_available()
    report = Report(args.out, meta)
    t0 = time.time()
    batches = (1, 3) if SMOKE else (1, 32, 128)
    for batch in batches:
        run_case(report, f"gdn_decode_B{batch}", gdn_decode(batch))
    for batch in batches:
        run_case(report, f"gdn_decode_fused_B{batch}", gdn_decode_fused_case(batch))
    for seqs in (2,) if SMOKE else (1, 16, 64):
        run_case(report, f"gdn_verify_commit_B{seqs}", gdn_verify_commit(seqs))
    for batch in (3,) if SMOKE else (32, 64, 128):
        for state_dtype in (torch.float32, BF16):
            run_case(report, f"gdn_decode_tiles_B{batch}_{str(state_dtype).split('.')[-1]}",
                     gdn_decode_tiles(batch, state_dtype))
    for batch in (3,) if SMOKE else (8, 32, 64, 128):
        run_case(report, f"gdn_decode_dot_B{batch}", gdn_decode_dot(batch))
    for batch in batches:
        run_case(report, f"paged_attention_decode_B{batch}_ctx384",
                 attention([384] * batch, [1] * batch, f"B={batch} ctx=384 Hq={HEADS} Hk={KV_HEADS} D={HEAD_DIM}"))
    big, mid = (40, 20) if SMOKE else (8192, 1024)
    run_case(report, f"paged_attention_decode_B1_ctx{big}", attention([big], [1], f"B=1 ctx={big}"))
    for batch, ctx in ((1, 384), (32, 384), (128, 384), (1, big), (32, big)):
        run_case(report, f"paged_attention_key_loop_B{batch}_ctx{ctx}",
                 attention_key_loop([ctx] * batch, [1] * batch, f"decode B={batch} ctx={ctx}"))
    run_case(report, f"paged_attention_prefill_{mid}_plus_decodes",
             attention([mid, 30, 17, 1], [mid, 1, 17, 1], f"prefill {mid} + ragged rows"))
    run_case(report, f"paged_attention_prefill_{big}", attention([big], [big], f"one {big}-token prompt"))
    for length in (40, 64) if SMOKE else (2048, 8192, 32768):
        run_case(report, f"fresh_attention_T{length}", fresh_attention(length))
    run_case(report, "store_kv_T1", store_kv_case(1))
    run_case(report, "store_kv_T128", store_kv_case(128))
    for tokens in (1, 128):
        run_case(report, f"norms_T{tokens}", norms(tokens))
        run_case(report, f"rotary_T{tokens}", rotary(tokens))
        run_case(report, f"rotary_store_kv_T{tokens}", rotary_store(tokens))
        run_case(report, f"silu_and_mul_T{tokens}", silu_mul(tokens))
    for tokens in (40,) if SMOKE else (8192, 32768):
        run_case(report, f"rotary_store_kv_tiles_T{tokens}", rotary_store_tiles(tokens, ROTARY_STORE_TILES))
    long_prompt = 100 if SMOKE else 8192
    run_case(report, f"norm_row_tiles_T{long_prompt}", norm_row_tiles(long_prompt))
    run_case(report, f"conv1d_row_tiles_T{long_prompt}", conv_row_tiles([long_prompt], CONV_ROW_TILES))
    for lens in ([20, 4],) if SMOKE else ([80, 16], [112, 16]):
        run_case(report, f"conv1d_short_pass_row_tiles_{lens[0]}", conv_row_tiles(lens, SHORT_PASS_ROW_TILES))
    run_case(report, "conv1d_decode_B1", conv([1], "B=1 decode"))
    run_case(report, "conv1d_decode_B128", conv([1] * (4 if SMOKE else 128), "B=128 decode"))
    ragged = [10, 1, 7] if SMOKE else [300, 1, 77]
    run_case(report, "conv1d_prefill_ragged", conv(ragged, f"ragged prefill {ragged} with captures"))
    run_case(report, f"conv1d_prefill_{big}", conv([big], f"one {big}-token prompt"))
    for lens in ([12, 4],) if SMOKE else ([80, 16], [112, 16]):  # graph-replayed short passes and padding
        run_case(report, f"conv1d_short_pass_{lens[0]}",
                 conv(lens, f"short pass {lens} with captures", [(32, 64), (32, 128), (16, 128), (16, 256), (64, 64)]))
    for tokens in (1, 5) if SMOKE else (1, 2, 4, 8, 16, 32, 64, 128, 2048):
        run_case(report, f"moe_T{tokens}", moe(tokens))
    for tokens in (1, 5) if SMOKE else (1, 16, 24, 28, 32, 48):
        run_case(report, f"moe_shared_T{tokens}", moe_shared(tokens))
    for tokens in (1, 8, 32):
        run_case(report, f"moe_direct_tiles_T{tokens}", moe_sweep(tokens, "direct", MOE_DIRECT_TILES))
    for tokens in (1, 16):
        run_case(report, f"partial_sums_consumers_T{tokens}", partial_sums_consumers(tokens))
    for tokens in (1, 8, 16, 24):  # a shared expert's graph rungs: 9 choices, the direct path
        run_case(report, f"moe_direct_partial_T{tokens}", moe_sweep(tokens, "direct", MOE_DIRECT_PARTIAL_TILES, True))
    for tokens in (64, 128):
        run_case(report, f"moe_sorted_tiles_T{tokens}", moe_sweep(tokens, "sorted", MOE_SORTED_TILES))
    for tokens in (8, 16) if SMOKE else (64, 2048, 8192):
        run_case(report, f"moe_sorted_large_tiles_T{tokens}", moe_sweep(tokens, "sorted", MOE_SORTED_LARGE_TILES))
    for tokens in (16,) if SMOKE else (80, 144):  # a prefix-cache hit's tail; a 128-sequence decode step's pairs
        run_case(report, f"moe_sorted_tail_tiles_T{tokens}", moe_sweep(tokens, "sorted", MOE_SORTED_TAIL_TILES))
    run_case(report, "paged_attention_prefill_tiles", attention_sweep(40 if SMOKE else 2048))
    for rows in (16,) if SMOKE else (32, 80, 112):
        run_case(report, f"paged_attention_hit_tail_{rows}", attention_tail_sweep(64 if SMOKE else 8240, rows,
                                                                                  1 if SMOKE else 2))
    for lens in ([12, 4],) if SMOKE else ([16, 16], [48, 16], [80, 16], [112, 16]):
        run_case(report, f"gdn_short_pass_{lens[0]}", gdn_short_pass(lens))
    for tokens in (4, 1400) if SMOKE else (80, 96, 128, 2048, 8192):  # short passes; long prompts' chunks
        run_case(report, f"moe_align_T{tokens}", moe_align(tokens))
    for impl in ("triton", "triton_tf32x3", "recurrent"):
        run_case(report, f"gdn_prefill_{impl}_ragged", gdn_prefill(ragged, f"ragged {ragged} with captures", impl))
    for length in (mid, big) if SMOKE else (mid, big, 32768):
        for impl in ("triton", "triton_tf32x3"):
            run_case(report, f"gdn_prefill_{impl}_{length}", gdn_prefill([length], f"one {length}-token prompt", impl))
    run_case(report, f"gdn_prefill_tiles_{big}", gdn_prefill_sweep(big))
    for lens in ([40], [8] * 6) if SMOKE else ([8192], [32768], [128] * 128):
        run_case(report, f"gdn_prefill_long_pass_state_{len(lens)}x{lens[0]}",
                 gdn_prefill_long_pass_state(lens, f"{len(lens)} prompts of {lens[0]} tokens"))
    for lens in ([40],) if SMOKE else ([8192], [32768], [128] * 128):
        run_case(report, f"gdn_prefill_u_dtype_{len(lens)}x{lens[0]}",
                 gdn_prefill_u_dtype(lens, f"{len(lens)} prompts of {lens[0]} tokens"))
    occupancy = ([40], [8] * 6) if SMOKE else ([8192], [32768], [128] * 128, [128] * 32)
    for lens in occupancy:
        run_case(report, f"gdn_prefill_occupancy_{len(lens)}x{lens[0]}",
                 gdn_prefill_occupancy(lens, f"{len(lens)} prompts of {lens[0]} tokens"))
    for tokens in (16,) if SMOKE else (8192, 16384):
        run_case(report, f"moe_sorted_down_tiles_T{tokens}",
                 moe_sweep(tokens, "sorted", MOE_SORTED_DOWN_TILES, per_kernel=True))
    for tokens in (16,) if SMOKE else (2048, 8192, 32768):
        run_case(report, f"moe_sorted_tma_T{tokens}", moe_sweep(tokens, "sorted", MOE_SORTED_TMA_TILES, per_kernel=True))
    if not (args.skip_fla or SMOKE) and fla_available():  # last: fla-core autotunes on first use
        for impl in ("fla", "fla_fp32"):
            run_case(report, f"gdn_prefill_{impl}_ragged", gdn_prefill(ragged, f"ragged {ragged} with captures", impl))
            run_case(report, f"gdn_prefill_{impl}_{big}", gdn_prefill([big], f"one {big}-token prompt", impl))
    print(f"total {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
