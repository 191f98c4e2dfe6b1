"""Compiles Triton kernels for the H200 (sm_90a) on a machine without a GPU, the way the JIT would on the
card, with the production block sizes: it catches what the interpreter accepts and the compiler
rejects (dot shapes, layouts, shared memory over the 227 KiB a block may use), and ptxas reports
register spills. Run as a script, without TRITON_INTERPRET; prints one JSON line per kernel.

    python tests/kernels/sm90_compile.py [names]   (SM90_DUMP=dir also writes each kernel's TTGIR there)
"""

import json
import os
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90


def compile_sm90(kernel, types: dict, constexprs: dict, num_warps: int, num_stages: int = 1,
                 maxnreg: int | None = None) -> dict:
    """types: pointer / scalar types by argument name; unnamed arguments are i32 (strides, counts),
    fp32 (`scale`) or *fp32. Pointers and strides are marked 16-divisible, as the JIT marks them.
    maxnreg: the launch's cap on registers a thread, where the kernel is launched with one."""
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name in types:
            signature[name] = types[name]
        elif name.startswith(("stride", "num_")):
            signature[name] = "i32"
        else:
            signature[name] = "fp32" if name == "scale" else "*fp32"
        if signature[name].startswith("*") or name.startswith("stride"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages, "maxnreg": maxnreg})
    if os.environ.get("SM90_DUMP"):
        open(os.path.join(os.environ["SM90_DUMP"], kernel.__name__ + ".ttgir"), "w").write(compiled.asm["ttgir"])
    return {"shared": compiled.metadata.shared, **_ptxas_usage(compiled.asm["ptx"])}


def _ptxas_usage(ptx: str) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    finally:
        os.unlink(f.name)
    usage = {}
    for line in out.splitlines():
        if "Used" in line and "registers" in line:  # not ptxas's notes, e.g. C7519 on registers in wgmma
            usage["registers"] = int(line.split("Used")[1].split("registers")[0])
        elif "(C75" in line:  # wgmma notes: the kernel serialises or synchronises its tensor-core ops
            usage.setdefault("wgmma_notes", []).append(line.split("(")[1].split(")")[0])
        if "spill stores" in line:
            usage["spill_bytes"] = int(line.split("bytes spill stores")[0].split(",")[-1])
    return usage


def cases():
    """(name, kernel, types, constexprs, num_warps, num_stages[, maxnreg]) at the Qwen3.5 shapes, bf16."""
    from deltaserve.kernels.gdn import triton_chunk as gdn
    from deltaserve.kernels.moe import triton_moe_direct as direct
    from deltaserve.kernels.moe import triton_moe_experts as sorted_moe
    from deltaserve.kernels.moe import triton_moe_route as route

    bf16 = "*bf16"
    moe = dict(TOP_K=9, HIDDEN=2048, INTER=512)  # top-8 and the stacked shared expert
    tiles = direct.DEFAULT_TILES
    yield ("moe_route", route._moe_route_kernel, {"logits": bf16, "ids": "*i64", "live_rows": "*i64"},
           dict(EXPERTS=256, TOP_K=8, CHOICES=9, BLOCK_E=256, BLOCK_K=16, RENORMALIZE=True, SHARED_GATE=True,
                HAS_LIVE_ROWS=True, UNROUTED=257, PARTS=1, BLOCK_P=1, LOGIT_DTYPE=tl.bfloat16), 2, 1)
    yield ("moe_route_partial_sums", route._moe_route_kernel, {"ids": "*i64", "live_rows": "*i64"},
           dict(EXPERTS=256, TOP_K=8, CHOICES=9, BLOCK_E=256, BLOCK_K=16, RENORMALIZE=True, SHARED_GATE=True,
                HAS_LIVE_ROWS=True, UNROUTED=257, PARTS=16, BLOCK_P=16, LOGIT_DTYPE=tl.bfloat16), 2, 1)
    yield ("moe_direct_gate_up", direct._direct_gate_up_kernel, {"x": bf16, "w13": bf16, "ids": "*i64"},
           dict(moe, BLOCK_N=tiles.gate_n, BLOCK_K=tiles.gate_k, STAGES=tiles.gate_stages, EXPERTS=257),
           tiles.gate_warps, tiles.gate_stages)
    for group, out, t in ((9, bf16, tiles), (3, "*fp32", direct.PARTIAL_TILES)):  # whole; PartialSums of 3 choices
        yield (f"moe_direct_down_group{group}", direct._direct_down_kernel, {"w2": bf16, "ids": "*i64", "out": out},
               dict(moe, BLOCK_N=t.down_n, BLOCK_K=t.down_k, UNROLL=t.down_unroll, STAGES=t.down_stages, EXPERTS=257,
                    GROUP=group), t.down_warps, t.down_stages)
    yield ("moe_combine", sorted_moe._combine_kernel, {"y": bf16, "ids": "*i64", "out": bf16},
           dict(TOP_K=9, HIDDEN=2048, EXPERTS=257, BLOCK=sorted_moe.COMBINE_BLOCK), 4, 1)
    yield ("moe_count_and_rank", sorted_moe._count_and_rank_kernel,
           {"ids": "*i64", "order": "*i64", "offsets": "*i32", "block_start": "*i32", "num_pairs": "i32"},
           dict(EXPERTS=257, BLOCK_E=512, BLOCK_M=16, ALL=1024, BLOCK=sorted_moe.RANK_BLOCK), 4, 1)
    yield from _block_sort_cases()
    yield from _sorted_moe_cases(moe)

    from deltaserve.kernels.sampling import triton_race as race

    for all_greedy, floors in ((False, False), (True, False), (False, True)):
        yield (f"race_slices{'_all_greedy' if all_greedy else ''}{'_floors' if floors else ''}",
               race._race_slices_kernel,
               {"seeds": "*i64", "greedy": "*i32", "floors": "*i32", "best_index": "*i32", "vocab": "i32",
                "slices": "i32"},
               dict(BLOCK=race.BLOCK, SLICE_BLOCKS=race.SLICE_BLOCKS, ALL_GREEDY=all_greedy, HAS_FLOORS=floors,
                    USE_PDL=True), 8, 1)
    from deltaserve.kernels.sampling import triton_nucleus as nucleus

    counts = {"vocab": "i32", "slices": "i32"}
    for pass_ in (0, nucleus.PASSES - 1):
        yield (f"nucleus_pivot_mass_{pass_}", nucleus._pivot_mass_kernel, dict(counts, lows="*i64"),
               dict(PASS=pass_, SLICE=nucleus.SLICE, BLOCK_S=32, PIVOTS=nucleus.PIVOTS), nucleus.NUM_WARPS, 1)
    yield ("nucleus_floor", nucleus._floor_kernel, dict(counts, lows="*i64", floors="*i32"),
           dict(PASSES=nucleus.PASSES, BLOCK_S=32, PIVOTS=nucleus.PIVOTS), 1, 1)
    yield ("race_rows", race._race_rows_kernel, {"best_index": "*i32", "tokens": "*i64", "slices": "i32"},
           dict(BLOCK_S=32, USE_PDL=True), 1, 1)

    from deltaserve.kernels.sampling import triton_top_k as top_k

    rows_in = {"vocab": "i32", "stride_x": "i64", "blocks": "i32", "length": "i32", "threshold": "*fp32",
               "counts": "*i32", "starts": "*i32", "above_total": "*i32", "indices": "*i64", "block_max": "*fp32"}
    yield ("top_k_block_max", top_k._block_max_kernel, rows_in, dict(SLICE=top_k.SLICE, BLOCK=top_k.BLOCK), 8, 1)
    yield ("top_k_count", top_k._count_kernel, rows_in, dict(SLICE=top_k.SLICE), 8, 1)
    yield ("top_k_place", top_k._place_kernel, rows_in, dict(SLICE=top_k.SLICE), 8, 1)
    yield ("race_candidates", race._race_candidates_kernel, {"indices": "*i64", "seeds": "*i64", "tokens": "*i64",
                                                             "count": "i32"}, dict(BLOCK_K=32), 4, 1)
    from deltaserve.kernels.sampling import triton_penalties as penalties

    lists = {"counts": "*i32", "tokens": "*i32", "offsets": "*i32", "vocab": "i32",
             "prompt_tokens": "*i32", "prompt_offsets": "*i32", "output_tokens": "*i32", "output_offsets": "*i32"}
    yield ("penalties_count", penalties._count_outputs, lists, dict(BLOCK=penalties.BLOCK), 4, 1)
    yield ("penalties_lists", penalties._penalise_kernel, dict(lists, logits_row_stride="i64"),
           dict(BLOCK=penalties.BLOCK), 4, 1)

    from deltaserve.kernels.norm import triton_gated_rms_norm as gated_norm
    from deltaserve.kernels.norm import triton_rms_norm as norm
    from deltaserve.kernels.norm.rows_per_program import rows_per_program, warps_for

    norm_types = {"residual": bf16, "weight": bf16, "out": bf16, "summed": bf16, "rows": "i32", "inner": "i32",
                  "eps": "fp32", "offset": "fp32"}
    for parts, x in ((1, bf16), (4, "*fp32"), (3, "*fp32")):  # x as a tensor; PartialSums of 4 and 3 parts
        yield (f"add_rms_norm_parts{parts}", norm._rms_norm_kernel, dict(norm_types, x=x),
               dict(N=2048, BLOCK=2048, BLOCK_R=1, HAS_RESIDUAL=True, PARTS=parts,
                    BLOCK_P=triton.next_power_of_2(parts)), 8, 1)
    head_rows = rows_per_program(8192 * 16, 256)  # an 8k-token prompt's per-head q norm
    yield ("rms_norm_head_tiles", norm._rms_norm_kernel, dict(norm_types, x=bf16),
           dict(N=256, BLOCK=256, BLOCK_R=head_rows, HAS_RESIDUAL=False, PARTS=1, BLOCK_P=1),
           warps_for(head_rows, 256), 1)
    gdn_rows = rows_per_program(8192 * 32, 128)
    yield ("gated_rms_norm_tiles", gated_norm._gated_rms_norm_kernel,
           {"x": bf16, "gate": bf16, "weight": bf16, "out": bf16, "rows": "i32", "inner": "i32", "eps": "fp32"},
           dict(N=128, BLOCK=128, BLOCK_R=gdn_rows), warps_for(gdn_rows, 128), 1)
    yield from _skinny_gemm_cases()

    from deltaserve.kernels.slot_copy import triton_slot_copy as slot_copy

    pools = {}  # a conv pool (bf16) and a recurrent one (fp32); offsets and layer strides of a many-GiB pool
    for part, dtype in (("a", bf16), ("b", "*fp32")):
        pools |= {f"src_{part}": dtype, f"dst_{part}": dtype, f"src_offset_{part}": "i64", f"dst_offset_{part}": "i64",
                  f"stride_src_layer_{part}": "i64", f"stride_dst_layer_{part}": "i64", f"numel_{part}": "i32"}
    yield ("slot_copy", slot_copy._copy_slot_kernel, pools, dict(BLOCK=slot_copy.BLOCK), 8, 1)
    pools_at = {"slots": "*i64"}
    for part, dtype in (("a", bf16), ("b", "*fp32")):
        pools_at |= {f"src_{part}": dtype, f"dst_{part}": dtype, f"stride_src_slot_{part}": "i64",
                     f"stride_dst_slot_{part}": "i64", f"stride_src_layer_{part}": "i64",
                     f"stride_dst_layer_{part}": "i64", f"numel_{part}": "i32"}
    yield ("slot_copy_at", slot_copy._copy_slot_at_kernel, pools_at, dict(BLOCK=slot_copy.BLOCK), 8, 1)
    zero = {"slots": "*i64"}
    for part, dtype in (("a", bf16), ("b", "*fp32")):
        zero |= {f"pool_{part}": dtype, f"stride_slot_{part}": "i64", f"stride_layer_{part}": "i64",
                 f"numel_{part}": "i32"}
    yield ("slot_zero", slot_copy._zero_slots_kernel, zero, dict(BLOCK=slot_copy.BLOCK), 8, 1)

    from deltaserve.kernels.attention import triton_rotary_store_kv as rotary_kv

    # decode and paged prefill; a long prompt's first chunk, in the long passes' token tiles; a long pass's last
    # layer, with q of its sampled rows
    long_t, long_warps = rotary_kv.LONG_BLOCK_T, rotary_kv.LONG_WARPS
    for k_out, q_rows, block_t, warps in ((False, False, 1, 2), (True, False, 1, 2), (True, False, long_t, long_warps),
                                          (False, True, long_t, long_warps)):
        name = f"rotary_store_kv{'_k_out' if k_out else ''}{'_q_rows' if q_rows else ''}"
        yield (name + ("_long" if block_t > 1 else ""),
               rotary_kv._rotary_store_kv_kernel,
               {n: bf16 for n in ("q", "k", "v", "q_out", "k_out", "k_cache", "v_cache", "q_norm", "k_norm")}
               | {"positions": "*i64", "slot_mapping": "*i64", "q_rows": "*i64", "eps": "fp32", "offset": "fp32"},
               dict(Q_HEADS=16, HEAD_DIM=256, HALF=32, PAGE=16, BLOCK_D=256, BLOCK_HALF=32, HAS_NORM=True,
                    HAS_K_OUT=k_out, BLOCK_T=block_t, HAS_Q_ROWS=q_rows), warps, 1)

    from deltaserve.kernels.attention import triton_output_gate as output_gate

    yield ("output_gate", output_gate._output_gate_kernel, {"out": bf16, "gate": bf16, "y": bf16},
           dict(HEADS=16, HEAD_DIM=256, BLOCK_H=16, BLOCK_D=256), 4, 1)

    from deltaserve.kernels.attention import triton_paged_attention as paged

    # decode (split; filling the SMs once, in 64-key tiles); short prefill chunks; a short chunk over a long cached
    # prefix; long prefill chunks, masked and with their interior walked unmasked
    for name, block_m, block_n, splits, warps, interior in (
            ("m16", 16, 32, 16, 4, False), ("m16_n64", 16, 64, 1, 4, False), ("m64", 64, 32, 1, 8, False),
            ("m128", 128, 64, 11, 8, False), ("m128_long", 128, 64, 1, 8, False),
            ("m128_interior", 128, 64, 1, 8, True)):
        yield (f"paged_attention_{name}", paged._paged_attention_kernel,
               {"q": bf16, "k_cache": bf16, "v_cache": bf16, "gate": bf16, "query_start_loc": "*i64",
                "seq_lens": "*i64", "block_tables": "*i64", "scale_log2": "fp32", "splits": "i32"},
               dict(GROUP=8, KV_HEADS=2, HEAD_DIM=256, BLOCK_D=256, PAGE=16, BLOCK_M=block_m, BLOCK_N=block_n,
                    SPLIT=splits > 1, PRECISION="tf32", LOOP_FOR=True, HAS_GATE=splits == 1, INTERIOR=interior),
               warps, 2)
    yield ("paged_attention_merge", paged._merge_splits_kernel,
           {"part": "*fp32", "lse": "*fp32", "o": bf16, "gate": bf16, "splits": "i32"},
           dict(Q_HEADS=16, HEAD_DIM=256, BLOCK_D=256, BLOCK_S=paged.MAX_SPLITS, HAS_GATE=True), 4, 1)  # as launched

    ints = {n: "*i32" for n in ("state_slots", "query_start_loc", "cap_rows", "cap_snaps")}
    ints["store_flags"] = "*i64"  # as the eager pass's one copy of its host columns carries them
    inputs = {n: bf16 for n in ("q", "k", "v", "a", "b", "o")}
    state = gdn.LONG_PASS_STATE
    # (chunk, block_v, name, split, precision, sub, prepare precision, warps, stages by block_v, buffers between
    # the kernels)
    long = (gdn.CHUNK, 32, "", state["split_output"], state["precision"], gdn.LONG_PASS_PREPARE["sub"],
            gdn.LONG_PASS_PREPARE["precision"], state["num_warps"], gdn.LONG_PASS_STAGES, bf16)
    short = (16, 64, "_short", False, "tf32", gdn.SHORT_PASS_PREPARE["sub"], "tf32x3", 4, {}, "*fp32")
    for chunk, bv, name, split, precision, sub, prepare_precision, warps, stages_of, buffers in (long, short):
        stages = stages_of.get(bv, 2)
        heads = dict(HK=16, HV=32, DK=128, DV=128, BK=128, CHUNK=chunk)
        narrow = ("w_buf", "aqk_buf", "chunk_states", "v_new_buf", "kd_buf")  # the buffers that only feed dots
        types = dict(inputs, **ints, **{n: buffers for n in narrow})
        prepare_cap = gdn.LONG_PASS_PREPARE["maxnreg"] if chunk == gdn.CHUNK else None
        # the prepare kernel with and without kd, k normalised and decayed for the state kernel (DECAYED_K)
        for decayed in (True, False):
            yield (f"gdn_chunk_prepare{name}{'' if decayed else '_own_k'}", gdn._chunk_prepare_kernel, types,
                   dict(heads, BV=32, BLOCK_B=16, SUB=sub, PRECISION=prepare_precision, INVERSE_PRECISION="tf32",
                        DECAYED_K=decayed), 4, 1, prepare_cap)
        # captures keep the narrow tiles however many the programs, so with either k
        for captures, decayed in ((False, True), (True, True), (True, False)):
            yield (f"gdn_chunk_state{name}{'_captures' if captures else ''}{'' if decayed else '_own_k'}",
                   gdn._chunk_state_kernel, types, dict(heads, BV=bv, BLOCK_B=16, BLOCK_CAPS=16, HAS_CAPTURES=captures,
                                                        SPLIT_OUTPUT=split, LOOP_FOR=True, PRECISION=precision,
                                                        DECAYED_K=decayed), warps, stages)
        # with the output split off, the snapshot kernel reads v_new (its u_buf) from the narrow buffer
        snapshot_types = dict(types, u_buf=buffers if split else "*fp32")
        yield (f"gdn_chunk_snapshot{name}", gdn._chunk_snapshot_kernel, snapshot_types,
               dict(heads, BV=bv, BLOCK_B=16, BLOCK_CAPS=16, U_IS_V_NEW=split, PRECISION=precision), 4, 1)
        # verify chunks beside prompt chunks: the states of the prompt chunks alone written back
        yield (f"gdn_chunk_state{name}_store_flags", gdn._chunk_state_kernel, types,
               dict(heads, BV=bv, BLOCK_B=16, BLOCK_CAPS=16, HAS_CAPTURES=True, SPLIT_OUTPUT=split, LOOP_FOR=True,
                    PRECISION=precision, DECAYED_K=True, STORE_FLAGS=True), warps, stages)
        # many sequences at once: the state kernel's wide tiles (never with captures, see STATE_WIDE_BLOCK_V)
        yield (f"gdn_chunk_state_wide{name}", gdn._chunk_state_kernel, types,
               dict(heads, BV=gdn.STATE_WIDE_BLOCK_V, BLOCK_B=16, BLOCK_CAPS=16, HAS_CAPTURES=False,
                    SPLIT_OUTPUT=split, LOOP_FOR=True, PRECISION=precision, DECAYED_K=False), warps,
               stages_of.get(gdn.STATE_WIDE_BLOCK_V, 2))
    output_types = dict(inputs, **ints, aqk_buf=bf16, v_new_buf=bf16, chunk_states=bf16, gate=bf16, norm_weight=bf16,
                        eps="fp32")
    for normed in (False, True):  # the gated norm in its last store, or not
        yield (f"gdn_chunk_output{'_normed' if normed else ''}", gdn._chunk_output_kernel, output_types,
               dict(HK=16, HV=32, DK=128, DV=128, BK=128, CHUNK=gdn.CHUNK, BV=gdn.OUTPUT_BLOCK_V, BLOCK_B=16,
                    PRECISION=gdn.LONG_PASS_STATE["precision"], NORM=normed), 4, 2)

    from deltaserve.kernels.conv1d import triton_causal_conv1d as conv

    conv_types = {"x": bf16, "weight": bf16, "conv_state": bf16, "state_slots": "*i32", "query_start_loc": "*i32",
                  "out": bf16, "tokens": "i32"}
    rows_t, rows_c, rows_warps = conv.ROW_TILES
    for index in ("i32", "i64"):  # the engine's batches hold int64 metadata
        yield (f"conv1d_rows_{index}", conv._conv_rows_kernel,
               dict(conv_types, state_slots=f"*{index}", query_start_loc=f"*{index}"),
               dict(CHANNELS=8192, K=4, BLOCK_T=rows_t, BLOCK_C=rows_c), rows_warps, 1)
    for block_t, block_c, varlen in ((1, 256, False), (32, 64, True)):  # decode; a short prefill pass
        yield (f"conv1d_sequence_t{block_t}", conv._causal_conv1d_kernel,
               dict(conv_types, capture_rows="*i32", capture_slots="*i32", snapshots=bf16),
               dict(CHANNELS=8192, K=4, BLOCK_T=block_t, BLOCK_C=block_c, BLOCK_KM1=4, IS_VARLEN=varlen,
                    DO_CONV=True), 4, 1)

    from deltaserve.kernels.gdn import triton_recurrent as recurrent

    recurrent_ints = {n: "*i32" for n in ("state_slots", "query_start_loc", "cap_rows", "cap_snaps", "cap_first")}
    recurrent_ints["store_flags"] = "*i64"
    for varlen, bv, warps, streamed in ((False, 32, 4, False), (False, 64, 4, False), (False, 64, 4, True),
                                        (True, 16, 1, False)):
        yield (f"gdn_recurrent{'_varlen' if varlen else ''}_bv{bv}{'_streamed' if streamed else ''}",
               recurrent._gdn_recurrent_kernel, dict(inputs, **recurrent_ints),
               dict(HK=16, HV=32, DK=128, DV=128, BK=128, BV=bv, IS_VARLEN=varlen, HAS_CAPTURES=varlen,
                    STREAMED=streamed), warps, 2)
    yield ("gdn_recurrent_varlen_store_flags", recurrent._gdn_recurrent_kernel, dict(inputs, **recurrent_ints),
           dict(HK=16, HV=32, DK=128, DV=128, BK=128, BV=16, IS_VARLEN=True, HAS_CAPTURES=True, STREAMED=False,
                STORE_FLAGS=True),
           1, 2)

    from deltaserve.kernels.gdn import triton_commit as commit

    # the verdicts' commit, every layer at once: the stash's bf16 rows, the fp32 states, the slots and kept-row
    # counts as the host's columns travel (int64); the tiles of a verify step of 64 sequences
    block_v, warps, _ = recurrent.ragged_tiles(64 * 32, 4)
    yield ("gdn_commit", commit._gdn_commit_kernel,
           {"k": bf16, "v": bf16, "a": bf16, "b": bf16, "A_log": "*fp32", "dt_bias": "*fp32", "h_all": "*fp32",
            "state_slots": "*i64", "row_count": "*i64", "rows_per_seq": "i32"},
           dict(HK=16, HV=32, DK=128, DV=128, BK=128, BV=block_v, TILES=128 // block_v), warps, 2)

    from deltaserve.kernels.gdn import triton_recurrent_dot as dot

    for bv, warps, streamed in ((32, 4, False), (128, 8, False), (64, 4, False), (128, 4, True)):  # decode_dot_tiles'
        yield (f"gdn_decode_dot_bv{bv}_w{warps}", dot._gdn_decode_dot_kernel,
               dict(inputs, h_pool=bf16, state_slots="*i32"),
               dict(HK=16, HV=32, DK=128, DV=128, BK=128, BV=bv, ROWS=dot.DOT_ROWS, STREAMED=streamed), warps, 2)

    from deltaserve.kernels.gdn import triton_decode_fused as decode

    yield ("gdn_decode_fused", decode._gdn_decode_fused_kernel,
           {n: bf16 for n in ("mixed", "z", "a", "b", "conv_weight", "conv_state", "norm_weight", "out")}
           | {"state_slots": "*i32", "eps": "fp32"},
           dict(HK=16, HV=32, DK=128, DV=128, K=4, BK=128, BV=128, BLOCK_K=4), 8, 1)


def _skinny_gemm_cases():
    from deltaserve.kernels.linear import triton_skinny_gemm as skinny

    for n, k in ((2048, 4096), (4096, 12288), (12352, 4096), (248320, 4096)):  # each default tile set
        t = skinny.default_tiles(n)
        yield (f"skinny_gemm_{n}x{k}", skinny._skinny_gemm_kernel, {"x": "*bf16", "w": "*bf16", "y": "*bf16",
                                                                     "M": "i32", "N": "i32"},
               dict(K=k, K_PER_SPLIT=k, BLOCK_M=16, BLOCK_N=t.block_n, BLOCK_K=t.block_k, STAGES=t.stages,
                    PRECISION="tf32"), t.warps, 1)
    t = skinny.SPLIT_TILES
    for n, k in ((2048, 4096), (264, 2048)):  # split along K into fp32 parts
        yield (f"skinny_gemm_parts_{n}x{k}", skinny._skinny_gemm_kernel, {"x": "*bf16", "w": "*bf16", "y": "*fp32",
                                                                           "M": "i32", "N": "i32"},
               dict(K=k, K_PER_SPLIT=k // skinny.k_splits(n, k), BLOCK_M=16, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                    STAGES=t.stages, PRECISION="tf32"), t.warps, 1)
    yield ("skinny_gemm_parts_2048x4096_pdl", skinny._skinny_gemm_kernel,  # launched as a dependent grid
           {"x": "*bf16", "w": "*bf16", "y": "*fp32", "M": "i32", "N": "i32"},
           dict(K=4096, K_PER_SPLIT=1024, BLOCK_M=16, BLOCK_N=t.block_n, BLOCK_K=t.block_k, STAGES=t.stages,
                PRECISION="tf32", USE_PDL=True), t.warps, 1)


def _block_sort_cases():
    """The large batches' counting sort, at 257 experts (512 bins), for the engine's int64 ids and int32 ones."""
    from deltaserve.kernels.moe import triton_moe_experts as sorted_moe

    bins, block = 512, sorted_moe.SORT_BLOCK
    for ids, suffix in (("*i64", ""), ("*i32", "_i32")):
        yield (f"moe_block_histogram{suffix}", sorted_moe._block_histogram_kernel, {"ids": ids, "counts": "*i32"},
               dict(BLOCK_E=bins, BLOCK=block), 4, 1)
        yield (f"moe_block_scatter{suffix}", sorted_moe._block_scatter_kernel,
               {"ids": ids, "counts": "*i32", "order": "*i64", "offsets": "*i32", "block_start": "*i32"},
               dict(EXPERTS=257, BLOCK_E=bins, BLOCK_M=16, BLOCK=block, TILE=sorted_moe.RANK_TILE), 4, 1)
    yield ("moe_block_scan", sorted_moe._block_scan_kernel, {"counts": "*i32"},
           dict(BLOCK_E=bins, TILE_E=sorted_moe.SCAN_EXPERTS, ROWS=sorted_moe.SCAN_ROWS), 4, 1)


def _sorted_moe_cases(moe: dict):
    from deltaserve.kernels.moe import triton_moe_experts as sorted_moe

    bf16 = "*bf16"
    ints = {"order": "*i64", "offsets": "*i32", "block_start": "*i32"}
    experts = dict(moe, EXPERTS=257, BLOCK_E=512, PRECISION="tf32")
    for size in ("SMALL", "MEDIUM", "LARGE"):
        t = getattr(sorted_moe, f"{size}_TILES")
        # with TMA the weight tiles (and the down kernel's rows) come through descriptors of these boxes
        desc = (lambda rows, cols: f"tensordesc<bf16[{rows}, {cols}]>") if t.tma else (lambda rows, cols: bf16)
        yield (f"moe_sorted_gate_up_{size.lower()}", sorted_moe._moe_gate_up_kernel,
               dict(ints, x=bf16, w13=bf16, inter=bf16, w13_desc=desc(t.gate_n, t.gate_k)),
               dict(experts, BLOCK_M=t.block_m, BLOCK_N=t.gate_n, BLOCK_K=t.gate_k, COLUMNS_FAST=t.columns_fast,
                    TMA=t.tma), t.warps, t.stages)
        yield (f"moe_sorted_down_{size.lower()}", sorted_moe._moe_down_kernel,
               dict(ints, inter=bf16, w2=bf16, y=bf16, inter_desc=desc(t.block_m, t.down_k),
                    w2_desc=desc(t.down_n, t.down_k)),
               {k: v for k, v in dict(experts, BLOCK_M=t.block_m, BLOCK_N=t.down_n, BLOCK_K=t.down_k,
                                      COLUMNS_FAST=t.columns_fast, TMA=t.tma).items() if k != "TOP_K"},
               t.down_warps or t.warps, t.down_stages or t.stages)


def main():
    only = set(sys.argv[1:])
    for name, kernel, types, constexprs, warps, stages, *maxnreg in cases():
        if only and name not in only:
            continue
        try:
            result = {"name": name, **compile_sm90(kernel, types, constexprs, warps, stages, *maxnreg)}
        except Exception as exc:  # report and go on: one failure must not hide the others
            result = {"name": name, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
