"""Sets deltaserve's engine results beside vLLM 0.24.0 on the same H200 and the issue's targets.

    python benchmarks/compare.py   # reads benchmarks/results/engine_*.json, writes comparison.json

The vLLM figures are the ones measured on this card on 2026-11-29 with the same shapes (closed
batches, 128-token prompts, 256 generated tokens; `../shared/peers/vllm/`); where both a run with a
decode warm-up and one without exist, the faster is used. They are compared on their own instrument:
at C=1 the decode step (vLLM's 185.5 tok/s is 5.39 ms per step), above it the generated tokens over
the wall time of the whole closed batch, its prefill included (vLLM's bench.py aggregate), which is
deltaserve's `closed_batch_tok_s` (batch prefill + 255 decode steps for the results written before
that field existed). `side_by_side_<shape>.json` has both engines measured in one command (both shapes).

Each shape's `misses` lists the targets its rows miss, by how much, and what meeting them would take:
for a closed batch the decode step beside that step's floor and the fp32 GDN state's part of it; for a
prefill, from the shape's profile (PREFILL_PROFILE), the kernels' time by family and what all but the
GEMMs and attention would have to fit in.
"""

import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, os.path.join(HERE, ".."))  # benchmarks.shapes

# vLLM 0.24.0's figures that the issue's targets refer to (the H200, 2026-11-29): C=1, 32, 64 and 128 and the
# prefills as the issue gives them; the 9B shape's C=2 to 16, which it does not name, as this comparison first
# listed them.
VLLM = {
    "qwen3.5-9b": {"decode": {1: 185.5, 2: 237.5, 4: 698, 8: 1365, 16: 2596, 32: 4608, 64: 8128, 128: 11953},
                   "prefill": {8192: 0.214, 32768: 0.912}},
    "qwen3.5-35b-a3b": {"decode": {1: 232.7, 32: 1757, 64: 3312, 128: 4512},
                        "prefill": {8192: 0.147, 32768: 0.631}},
}
GENERATED = 256
C1_TARGET = {"qwen3.5-9b": 215.0, "qwen3.5-35b-a3b": 400.0}

# Where the time goes, from benchmarks/results: profile_steps.py (kernels of the decode graphs, per step),
# kernels_check*.json and skinny_gemm.json (per-kernel times), and the step times above.
NOTES = {
    "qwen3.5-9b": [
        "At b28e199 on an H200 (engine_qwen3.5-9b_closed_at_b28e199.json; one warm machine, three runs in a row), "
        "the closed batches stepped in 5.858 / 5.859 ms at C=32 (5145.4 / 5139.1 tok/s), 6.987 at C=64 (8293.7) "
        "and 9.357 at C=128 (11754.1): C=32 is 1.115-1.117x the issue's 4608 tok/s (set against 4777, the figure this "
        "comparison listed at first, it was 2.1-2.2% short), C=64 and C=128 stand 7.2% / 10.6% short of 1.1x "
        "vLLM's figures in those runs.",
        "At 3aeb417 on an H100 (not set against the H200 rows or vLLM's figures; the device path is b28e199's, the "
        "commits since touch the host alone): gpu_correctness_at_3aeb417_h100.json passes on all seven "
        "architectures, and two rounds of the rows (engine_qwen3.5-9b_rows_at_3aeb417_h100.json) stepped in "
        "5.937-5.939 / 7.625-7.627 / 9.025-9.027 / 11.976-11.984 ms at C=1 / 32 / 64 / 128 (closed batches "
        "4005-4007 / 6545-6549 / 9467-9468 tok/s) and prefilled 8k in 0.1973-0.2007 s and 32k in 0.8549-0.8604.",
        "At eb1c8ea on an H100 (these rows do not replace the H200 rows above), against 6d753a5 alternated "
        "twice in one command. A prompt prefilled in steps of the server's default 2048 tokens "
        "(engine_qwen3.5-9b_chunked_prefill_6d753a5_vs_eb1c8ea_h100.json, first passes): 32768 tokens 1.0454 "
        "/ 1.0375 s against 1.6174 / 1.6223, 8192 0.2052 / 0.2061 against 0.2331 / 0.2370, 2048 0.0504 / "
        "0.0489 against 0.0523 / 0.0501: the long-chunk paged-attention tiles and the LM head run only for a "
        "chunk that samples (under 10 ms of the 32k difference). Closed batches "
        "(engine_qwen3.5-9b_decode_6d753a5_vs_eb1c8ea_h100.json): C=32 / 128 steps 7.883-7.884 / "
        "12.239-12.243 ms in both trees; C=1 6.148-6.149 against 6.091-6.093 ms in that ladder run (its step "
        "budget the C=128 batch's 16384 tokens), but 6.140-6.144 ms in all of 6d753a5, 9ebe693, 1d51251 and "
        "eb1c8ea run at C=1 alone (engine_qwen3.5-9b_c1_four_trees_h100.json), so no change to the decode "
        "step is seen at the budget a C=1 run takes. The step budget itself "
        "(engine_qwen3.5-9b_step_budget_2048_same_machine_h100.json): 2048 against the batch's prompts, "
        "alternated twice, C=32 steps 7.896 / 7.898 against 7.881 / 7.881 ms and C=128 12.229 / 12.230 "
        "against 12.240 / 12.239, closed batches 3850 / 3842 against 3874 / 3876 and 9094 / 9087 against 9270 "
        "/ 9279 tok/s (the batch's prefill then takes several steps): on this card the warm-up's cuDNN start "
        "costs the decode step nothing measurable, so the 2048 budget would not move the C=32 row here.",
        "At a4c2d03, measured per kernel only (the engine rows above predate it): paged attention takes a "
        "sequence's chunk of 512 rows or more (tokens times the GQA group) in 128 x 64 tiles, and from 1024 tokens "
        "walks the key tiles that every row of a query tile attends to without masks, the last row tiles first. At "
        "this shape's attention on one H200 (paged_attention_prefill.json): a chunk of 2048 tokens took 89.3 us a "
        "layer fresh, as cuDNN's sdpa (89.2), and 234.9 / 577.0 / 2489.7 over 2048 / 6144 / 30720 cached keys "
        "(428 TFLOP/s at the last), against 307.7 / 783.9 / 1917.4 / 8649.8 in the masked 64 x 32 tiles before; "
        "128 prompts of 128 tokens 190.9 against 300.3. So the later chunks of a long prompt under the server's "
        "2048-token step attend 3.3-3.5x faster; the single-pass 8k and 32k rows take cuDNN as before. First chunks "
        "of up to 2048 tokens no longer take cuDNN in eager passes either (FRESH_PREFILL_MIN_TOKENS is 2049), so "
        "under the default step budget cuDNN, which builds a plan for each new prompt length and slows the decode "
        "steps once started, never starts.",
        "At 0a85c66 one sequence's prefill passes replay graphs up to 2048 rows (every 128 rows past 1024; a pass may "
        "fill its rung, beside a padding sequence of no rows), so every chunk of a long prompt under the server's "
        "default 2048-token step replays one; longer single passes (the 8k and 32k rows) run eagerly as before. "
        "Beside 929dea4 in one command (engine_prefill_graphs_to_2048_same_machine.json), on a host whose eager "
        "passes were fast: 1024 / 1500 / 2048 tokens 25.2-26.5 / 38.0-38.6 / 50.2-50.7 ms against 24.7-25.2 / "
        "34.9-37.3 / 46.5-48.5 eagerly (the rows above at 0a85c66: engine_qwen3.5-9b_prefill_rows_at_0a85c66.json). "
        "A graph attends through the pages where an eager first prompt of 1024 rows or more takes cuDNN: the fresh "
        "prompt's attention took about 2.4 ms more over 2048 rows (profile_prefill_4096_in_2048_chunks_same_machine."
        "json). But cuDNN builds a plan for each prompt length it has not seen (54-57 ms, fresh_attention_new_lengths_"
        "at_1c13f5a.json): at lengths seen for the first time, 1100 to 2000 tokens, the graphs took 28.3-50.4 ms "
        "against 94.6-387.8 eagerly (engine_new_prompt_lengths_same_machine.json). While a pass still needed a "
        "padding row (1c13f5a), 2048 rows took rung 2176, whose GEMMs took 39.1 ms against 34.2 over 2048 rows "
        "(profile_prefill_qwen3.5-9b_2048_rows_same_machine.json), and the 2048-token pass 56.1-56.5 ms against "
        "47.9-49.1 eagerly (engine_prefill_graphs_to_2176_same_machine.json); hence the empty padding sequence. "
        "gpu_correctness_at_0a85c66.json: all seven "
        "architectures pass, with prompts of 128 and 2048 tokens alone filling their rungs.",
        "Measured, not kept (5dcf59e, reverted in b64abb4): the GDN prepare kernel with the two value heads of a "
        "key head in one program, q.k and k.k computed once for both. It compiled to 255 registers a thread, two "
        "programs a multiprocessor against three, and took 471.6-472.1 against 306.6-307.5 us at 8192 tokens and "
        "1945.6-1952.4 against 1235.4-1236.5 at 32768 (gdn_prefill_prepare_heads_same_machine.json); the 9B 32k "
        "prefill took 0.870-0.876 against 0.860-0.865 s (engine_qwen3.5-9b_prefill_prepare_heads_same_machine.json).",
        "At a23b328 (the rows of C=1, C=32 and the prefill; engine_qwen3.5-9b_decode_rows_at_a23b328.json, "
        "_prefill_rows_at_a23b328.json, each from an A/B where it was the base tree) the measured 8k pass is no "
        "slower than the passes after it in its process: 0.1903-0.2144 s over three to six passes a run on three "
        "cards, no allocator segment taken (engine_qwen3.5-9b_prefill_passes_at_a23b328.json), so the profiled "
        "pass's 190.3 ms was within that spread. Measured, not kept: the long passes' GDN layers in four segments "
        "of chunks, each segment's state kernel on a high-priority stream beside the other segments' prepare and "
        "output kernels; the same bytes, 8k 0.1972 against 0.1989 s and 32k 0.8659 against 0.8710 (means of six "
        "passes; engine_qwen3.5-9b_prefill_gdn_segments_same_machine.json, gdn_segments_same_machine.json), but "
        "with the other streams' work in the process the decode steps at C=32 took 5.971-5.974 ms against "
        "5.858-5.859 (engine_qwen3.5-9b_decode_after_gdn_segments_same_machine.json).",
        "At d06855f the last layer computes only the rows a pass samples (OutputRows): every row's keys and "
        "values are still projected and stored, but the q projection, attention (one row over the sequence's "
        "paged keys), output projection and feed-forward block run for the last row of each chunk that samples, "
        "in eager passes and prefill graphs alike (none for a chunk that samples nothing). Alternated twice "
        "against 1655d1c (engine_qwen3.5-9b_prefill_rows_at_d06855f.json): 8k 0.1962 / 0.1961 s against "
        "0.2002 / 0.2020, 32k 0.8643 / 0.8718 against 0.9010 / 0.9042, the closed batch at C=32 within its "
        "rounds' spread (5104.3 / 5117.3 against 5132.5 / 5111.8 tok/s); on two other cards in the same way "
        "(engine_qwen3.5-9b_prefill_output_rows_same_machine.json, _q_split_same_machine.json) 8k 0.1949 / "
        "0.1941 against 0.1975 / 0.1981 and 32k about 30 ms faster. 0.9x vLLM's 8k is 0.1926 s: this card's "
        "0.1962 is 0.917x. The eager pass's metadata now travels in one copy (2 copies before the first GEMM "
        "against 9, gaps over 50 us 1.27 ms against 1.48; profile_prefill_qwen3.5-9b_8192_gaps_31f5fbe.json), "
        "not resolved by the engine rows. The GDN output norm in the chunk output kernel's store (4da217d) was "
        "backed out: that kernel took 5.16 ms of the pass with it against 2.94 plus the norm kernel's 1.28 "
        "(engine_qwen3.5-9b_prefill_norm_in_output_and_one_copy_same_machine.json). In the profile at 0baaacb "
        "the pass's kernels took 188.1 ms, its GEMMs 149.5 of them; the host's lead, gaps over 50 us and tail "
        "0.39 + 1.48 + 0.68 ms (profile_prefill_qwen3.5-9b_8192_gaps_0baaacb.json).",
        "At a017bd4 two prefill kernels take less time. The conv1d row kernel runs 2 warps a program, in runs "
        "short enough for 2048 programs (one warp keeps one row's load in flight, so the kernel wants many "
        "warps): 101.4 against 105.7 us at 8192 tokens, 30.7 against 69.2 at 2048 (the server's default step), "
        "54.3 against 81.7 at 4096 and 199.0 against 209.4 over 128 prompts of 128 (conv1d_row_tiles_same_"
        "machine.json). Aqk is stored in bf16, the operand dtype of the dot that reads it, so the output is "
        "unchanged: the chunk kernels 623.7-624.2 against 644.8-647.1 us at 8192 tokens and 2471.5-2471.8 "
        "against 2547.4-2548.6 at 32768, with the same errors against the fp32 reference (gdn_prefill_kernels_"
        "aqk_narrow_same_machine.json). In the engine, alternated twice against 487fc5e (engine_qwen3.5-9b_"
        "prefill_rows_at_a017bd4.json), the 8k pass took 0.2005 / 0.2006 s against 0.2015 / 0.1989 and 2048 "
        "tokens 0.0484 / 0.0491 against 0.0491 / 0.0503: the expected 0.6 ms at 8k is inside the spread of two "
        "rounds. The pass's GEMMs run power-capped: through prefill_gemms.py the card drew a median 692 W with "
        "the SM clock at a median 1470 MHz, the projections at 653-731 TFLOP/s on cuBLAS and cuBLASLt alike, "
        "and W X^T no faster (prefill_gemms.json); in the 8k pass they took 154.5 of 193.9 ms of kernels "
        "(profile_prefill_qwen3.5-9b_8192_gaps_487fc5e.json), so the 0.1926 s that 0.9x vLLM needs leaves the "
        "other kernels and the host about 38 ms where they take some 44.",
        "At e73044f the GDN prefill's prepare kernel also writes kd, k normalised and decayed to its chunk's "
        "end, where the state kernel's programs are few (one or two prompts in the pass), and the state "
        "kernel's serial chunk loop loads it rather than normalising k in each program at every chunk. Against "
        "4d1d46e on the same inputs, alternated twice in one command (gdn_prefill_kernels_decayed_k_same_"
        "machine.json): the chunk kernels 644.5-645.1 against 678.2-678.3 us at 8192 tokens and 2546-2549 "
        "against 2693-2695 at 32768 (the state kernel 202-204 against 258 and 783-786 against 1014, the prepare "
        "kernel 311 against 290 and 1258 against 1175), with the same errors against the fp32 reference (output "
        "4.74e-3, state 4.62e-3 at 8192). Over 128 prompts of 128 tokens, and 4 of 2048, the wide tiles fill the "
        "GPU and the loop normalises k as before (1404-1405 and 582-583 us in both trees); kd there too "
        "(20da48d) took the prepare kernel from 597 to 639 us and the state kernel from 510 to 479 "
        "(gdn_prefill_kernels_decayed_k_everywhere_same_machine.json). In the engine, alternated twice "
        "(engine_qwen3.5-9b_prefill_rows_at_e73044f.json, the prefill rows): 8k 0.2007 / 0.2006 against "
        "0.2030 / 0.2026 s, 32k 0.8938 / 0.8924 against 0.8985 / 0.9051; on another card, with kd in every "
        "pass, 0.2020 / 0.2029 against 0.2056 / 0.2068 and 0.9083 / 0.9079 against 0.9204 / 0.9207 "
        "(engine_prefill_decayed_k_everywhere_same_machine.json). The 8k pass gained 2.0-3.9 ms where its "
        "chunk kernels alone gain 0.8 (24 layers of 34 us): in the pass the state kernel ran slower than "
        "alone (the notes on edcc4d4 below), and no longer does. Profiled on two cards "
        "(profile_prefill_qwen3.5-9b_8192_4d1d46e.json, _e4e9885.json), the pass's state kernels took 5.23 ms "
        "against 9.56 (218 us a layer against 398; alone 203 against 258), its prepare kernels 8.87 against "
        "8.33, and all its kernels 196.7 ms against 198.2, the GEMMs 1.3% slower on the newer tree's card "
        "(156.6 against 154.6 ms). 0.9x vLLM's 8k is 0.1926 s.",
        "With kd, the state kernel's narrow tiles at 16 columns (two programs a multiprocessor, 3 stages; not "
        "kept): alone 193.5-193.7 against 204.1-204.7 us at 8192 tokens and 754-766 against 783-784 at 32768, "
        "at 2 stages 234-235 and 919-934 (gdn_prefill_kernels_state_bv16_same_machine.json), but the 8k pass "
        "took 0.2006 / 0.2023 against 0.2002 / 0.1997 s, alternated twice against ed914df "
        "(engine_prefill_state_bv16_same_machine.json).",
        "The rows' tree against the newest, alternated twice in one command with the default fp32 state "
        "(engine_qwen3.5-9b_0f66749_against_58293a2_same_machine.json): 58293a2 steps 5.862-5.864 / 6.957 / "
        "9.259-9.263 ms at C=32 / 64 / 128 against 0f66749's 5.797-5.798 / 6.872 / 9.198-9.204, closed batches "
        "5136-5141 / 8310-8316 / 11814-11829 tok/s against 5190-5192 / 8406-8407 / 11877-11897: the newer tree "
        "is 0.6-1.2% slower a step at every concurrency, with the same batch prefill. The start-up warm-up "
        "(3884358) costs it: alternated twice in one command on another H200 (engine_qwen3.5-9b_bisect_same_"
        "machine.json), 0f66749 stepped in 5.907 / 9.464-9.466 ms at C=32 / 128, 22fcb60 (the warm-up added) "
        "6.011-6.014 / 9.552-9.556, b14b51f and f00d81c within 0.06 ms of it, 059c92f 5.970 / 9.501-9.508, "
        "and 059c92f without the warm-up 5.866-5.867 / 9.441-9.446: without it the newest tree is 0.7% / 0.2% "
        "faster than the rows' tree, so the kernel changes between them gained and the warm-up takes about "
        "0.1 ms a step. Its allocator order is not the cause: 059c92f handing out KV blocks, state slots or "
        "both from the start of their pools again after the warm-up stepped as 059c92f did (5.968-5.970 ms "
        "at C=32) while 059c92f without the warm-up took 5.867-5.869 "
        "(engine_qwen3.5-9b_warm_up_reset_same_machine.json). Nor are the caches it fills: e6e5aa2 ending "
        "its warm-up with gc.collect() and gc.freeze(), with torch.cuda.empty_cache(), or with the pinned "
        "host blocks emptied stepped in 5.965-5.970 ms at C=32, as e6e5aa2 did (5.966-5.967), against "
        "5.864-5.865 without the warm-up (engine_qwen3.5-9b_after_warm_up_same_machine.json). What costs it "
        "is cuDNN, which the warm-up's long fresh passes start (torch's sdpa picks cuDNN on the H200). "
        "Timed in one process (warm_up_cost.py, C=32), the steps went from 5.865 to 5.972 ms after the "
        "whole warm-up and after its 8 one-sequence groups of 96-2040 rows alone, the only ones with a pass "
        "of 1024 rows or more, and stayed at 5.864-5.874 after each other slice of its groups "
        "(warm_up_cost_qwen3.5-9b_groups_*.json); 20 s idle did not win them back, and the kernels' own time "
        "a step did not grow. One sdpa call at 2048 rows outside the engine did the same on another H200 "
        "(5.775 -> 5.887 ms; warm_up_cost_qwen3.5-9b_sdpa_default.json), with FlashAttention pinned it did "
        "not (5.774 -> 5.780; _sdpa_flash), and on a stream of its own it still did (5.845 -> 5.949; "
        "_cudnn_side_stream). A cuDNN call before the engine starts makes its steps slow from the first "
        "(_sdpa_first_groups_15_23), so the cost is the process's, not the graphs', and any server pays it "
        "after its first long prompt. It is cuDNN's start-up: cudnnCreate alone, no kernel of it run, took the "
        "steps from 5.855 to 5.963 ms and the graph replayed back to back from 5.884 to 5.993 "
        "(warm_up_cost_qwen3.5-9b_cudnn_handle.json; one cuDNN convolution did the same, _cudnn_conv). At 16 "
        "rows, where the skinny GEMM runs the output and down projections, the graph went from 5.139 to 5.146 "
        "ms, at 24 rows from 5.574 to 5.686 (_cudnn_handle_c16, _c24); with DELTASERVE_PDL=0 the steps were "
        "5.967 before it and after (_cudnn_conv_no_pdl), so it takes what dependent launch gained at those "
        "steps. A CUPTI trace of the 24-row graph (_cudnn_handle_c24_trace, 327 kernels; replayed in 5.663 "
        "then 5.766 ms) has the gaps between its kernels summing to -215 us before cudnnCreate and -35 after: "
        "at every boundary with a cuBLAS GEMM the next kernel starts about 0.4-0.5 us later (from a cuBLAS "
        "GEMM to a Triton kernel -0.03 -> +0.47 us, 128 of them; from Triton to cuBLAS +0.08 -> +0.46, 128), "
        "and between Triton kernels it overlaps 1 us less (-3.57 -> -2.54, 64, most of it the GDN decode's "
        "tail under the gated norm). The graph's edges are the same before and after (graph_edges.py, "
        "_cudnn_handle_c24_edges): the 128 into cuBLAS's GEMMs are plain edges, cuBLAS launching without "
        "dependent launch. Chains of the same kernels (pdl_after_cudnn.py: the 9B MLP as the engine runs it "
        "at 24 rows, cuBLAS whole or split with the add-norm, the skinny GEMM, the add-norm alone) in a process "
        "of their own replay as fast after cudnnCreate, after cuDNN's libraries loaded without a call and "
        "after a second cuBLASLt handle as before, also beside 110 GiB held (pdl_after_cudnn_*.json), with a "
        "GEMM never starting early (0.44-0.47 us, both states), as in the engine after cuDNN; replayed in the "
        "engine's process they start early until cudnnCreate (the MLP chain 1311 -> 1335 us, its GEMM "
        "boundaries 0.02-0.04 -> 0.45-0.47 us; _cudnn_handle_c24_edges). In a process of their own their "
        "Triton kernels at the largest shared-memory carveout give them the early start, cudnnCreate or not, "
        "also beside 110 GiB held (MLP chain 1308 us, 0.02-0.04 us; pdl_after_cudnn_carveout_100*.json), "
        "but in the engine that carveout on every Triton kernel (034fd0d, backed out) made the 32-row steps "
        "5.975 -> 6.088 ms across cudnnCreate against 5.865 -> 5.971 (_cudnn_handle_carveout1, _carveout0; "
        "traced at 24 rows the GDN decode took 0.040 ms a step more and the GEMM boundaries changed as "
        "without it, _cudnn_handle_c24_trace_carveout*). cudnnCreate's CUDA calls (_cudnn_handle_calls_c24: "
        "16 streams, two cudaMalloc buffers and their memsets, a mapped pinned host buffer, device queries) "
        "made one by one in the engine's process cost nothing: 24-row steps 5.545 -> 5.542 ms after 16 "
        "streams, 5.544 -> 5.548 after a mapped host buffer, 5.545 -> 5.550 and 5.544 -> 5.546 after two "
        "4 MiB or 256 MiB cudaMalloc buffers, 5.550 -> 5.552 after cuDNN's libraries loaded without a call "
        "(_streams_c24, _mapped_host_c24, _malloc_*_c24, _cudnn_libraries_c24), while cudnnCreate took them "
        "5.547 -> 5.655 with CUDA_DEVICE_MAX_CONNECTIONS=32 (_cudnn_handle_connections32_c24). Nor did other "
        "libraries that torch brings up on first use: one cuFFT call 5.626 -> 5.632 ms, one cuSOLVER call "
        "5.629 -> 5.634 (_cufft_c24, _cusolver_c24). One small torch kernel on a stream of its own did: "
        "5.517 -> 5.634 ms, against 5.517 -> 5.629 for cudnnCreate on that host with "
        "CUDA_DEVICE_MAX_CONNECTIONS=1 (_side_stream_c24, _cudnn_handle_connections1_c24). Any work on a "
        "second stream does it, and no stream of the engine's avoids it (on another H200, 24-row steps): "
        "one cudaMemsetAsync on a stream of its own 5.623 -> 5.730 ms (_side_memset_c24), a kernel on a "
        "stream destroyed once it was done 5.622 -> 5.733 (_destroyed_stream_c24), a kernel on another "
        "stream with CUDA_DEVICE_MAX_CONNECTIONS=1 5.620 -> 5.732 (_side_stream_connections1_c24), against "
        "5.629 -> 5.738 on the default stream (_side_stream_default_c24); with the engine on a stream of its "
        "own a kernel on another stream took 5.636 -> 5.742 (_side_stream_own_stream_c24; 5.627 -> 5.734 at "
        "the highest priority, _side_stream_own_stream_high_priority_c24) and cudnnCreate 5.635 -> 5.739 "
        "(_cudnn_handle_own_stream_c24). cuDNN makes 16 streams as it starts, so the engine keeps its steps "
        "on the default stream. The context's limits, flags and cache config "
        "stayed as they were (_cudnn_handle_context, "
        "_cudnn_limits); a 16 KiB stack cost nothing (_stack_16k); eager module loading and "
        "CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY did not avoid it (_cudnn_eager_loading, _cudnn_graph_jit_only, "
        "engine_qwen3.5-9b_cudnn_graph_jit_only_same_machine.json); without the split GEMM the steps were "
        "slower still with cuDNN started (C=32 6.020-6.022 against 5.973-5.974 ms; "
        "engine_qwen3.5-9b_split_gemm_after_cudnn_same_machine.json). Without cuDNN (e8ba57d) the closed "
        "batches stepped 5.847-5.848 / 9.407-9.421 ms at C=32 / 128 against 5.950-5.952 / 9.506-9.512, but the 8k / 32k prompts' first "
        "token took 0.2205-0.2262 / 1.048-1.054 s against 0.2056-0.2151 / 0.925-0.926 "
        "(engine_qwen3.5-9b_fresh_attention_backend_same_machine.json; the 35B-A3B shape 0.137-0.139 s "
        "against 0.122-0.123 at 8k for 0.9% shorter steps at C=64): FlashAttention takes twice cuDNN's time "
        "at head dim 256 (1895 against 878 us at 8k, kernels_check_fresh_attention.json), so cuDNN stays. "
        "The rows above ran their decode before any cuDNN call (engine_bench.py times the ladder before the "
        "prefill, and 0f66749 had no warm-up); the newest tree's closed batches step about 0.1 ms slower.",
        "Where a C=32 closed batch goes at 142795c (profile_qwen3.5-9b_c32_142795c.json, "
        "profile_prefill_qwen3.5-9b_32x128_142795c.json): its decode graph replays in 5.866 ms, 5.984 ms of "
        "kernels a step of which cuBLAS's GEMMs take 4.378 (gate/up 1.698, the down and output projections "
        "split along K 1.306, the GDN input and qkv projections 0.884, the LM head 0.490; about 3.76 ms is their "
        "weights' floor), the GDN decode 0.841 (35 us a layer, 0.90 of its fp32 states' floor), RMSNorm 0.199, "
        "attention and its split merge 0.223, the gated norm 0.141, conv 0.097; the batch's prefill "
        "(ttft 98.5 ms) is 90.8 ms of kernels, 74.7 of them cuBLAS GEMMs.",
        "At 0f68ecf beside vLLM in one command with vLLM's GDN state in fp32 as well (benchmarks/vllm_peer.py "
        "hands its engine mamba_ssm_cache_dtype=float32, what the released Qwen3.5 checkpoints' configs ask "
        "through mamba_ssm_dtype; side_by_side_qwen3.5-9b_fp32_state.json): closed batches 1.212x / 1.123x / "
        "1.120x / 1.118x vLLM's tok/s at C=1 / 32 / 64 / 128, steps 4.405 / 5.931 / 7.012 / 9.348 ms against "
        "5.313 / 6.358 / 7.645 / 10.295, the batches' prefill 0.038 / 0.097 / 0.192 / 0.408 s against 0.059 / "
        "0.193 / 0.275 / 0.507. At one precision the 9B shape decodes at 1.1x vLLM's rate or more at every "
        "concurrency; the misses in the rows above set deltaserve's fp32 state against vLLM's bf16 one.",
        "At 336b764 a bf16 state's decode step takes S^T q and S^T k as one tensor-core dot on the tile as "
        "loaded (triton_recurrent_dot), and only the update widens the tile, value by value on its way to the "
        "store: no fp32 copy of it is held, 80 registers a thread for a 128 x 64 tile at 4 warps where the "
        "widening kernel takes 128, so a multiprocessor keeps more of the state in flight. "
        "kernels_check_gdn_decode_dot.json (9B GDN shape, bf16 state): 5.9 / 16.9 / 42.3 / 78.6 us at 8 / 32 / "
        "64 / 128 sequences against 7.8 / 18.8 / 50.8 / 96.2 (3.42 against 2.79 TB/s at 128), the same error "
        "against the fp32 reference. In the engine with --gdn-state-dtype bfloat16, against b42e599 alternated "
        "twice in one command (engine_qwen3.5-9b_bf16_state_dot_same_machine.json): steps 4.86 / 5.67 / 6.39 / "
        "8.08 ms at C=8 / 32 / 64 / 128 against 4.91 / 5.76 / 6.54 / 8.43-8.45, C=1 unchanged (4.47); closed "
        "batches 5292-5305 / 8962-8964 / 13264-13267 tok/s, 1.108x / 1.103x / 1.110x the issue's vLLM figures, "
        "whose state is bf16 too (bf16_gdn_state below): at vLLM's precision the 9B shape meets 1.1x those "
        "figures at every concurrency. A second command, two rounds alternated (_second.json, the same engine "
        "code at 7e85760): steps 5.67-5.68 / 6.39 / 8.05-8.06 ms against 5.76 / 6.55 / 8.41-8.43, closed batches "
        "5275-5289 / 8945-8967 / 13314-13320 tok/s, C=64 at 1.101x: on the line. gpu_correctness with a "
        "bf16 state at d718aad (gpu_correctness_bf16_state_at_d718aad.json), on the tiny Qwen3.5 and "
        "Qwen3.5-MoE checkpoints: greedy tokens on the GPU in fp32 identical to the CPU reference's, graph "
        "replay identical to eager (greedy and mixed sampling), a prefix-cache hit byte-identical to a miss.",
        "Both engines with a bf16 state in one command at e346f5e (side_by_side_qwen3.5-9b_bf16_state.json; "
        "vLLM through vllm_peer.py, which logged its mamba_ssm_cache_dtype as bfloat16): closed batches "
        "1.198x / 1.124x / 1.090x / 1.098x vLLM's tok/s at C=1 / 32 / 64 / 128, steps 4.469 / 5.674 / 6.399 / "
        "8.104 ms against 5.330 / 6.146 / 6.716 / 8.781, the batches' prefill 0.023 / 0.098 / 0.193 / 0.401 s "
        "against 0.039 / 0.175 / 0.282 / 0.480. vLLM ran 8213 and 12051 tok/s at C=64 and C=128 here, above "
        "the issue's 8128 and 11953: against the same command's vLLM the bf16 state misses 1.1x at C=64 and "
        "C=128, by 0.9% and 0.2%. Then (e654cad) the 128-column tiles of the bf16 decode kernel, from 64 "
        "sequences, run their grid head first (the programs that run together read one sequence's "
        "neighbouring heads) with evict-first loads and stores of the state: 75.3-75.8 against 77.4-77.5 us "
        "at 128 sequences, 40.3-40.5 against 42.0-42.1 at 64, in two commands (kernels_check_gdn_decode_dot_"
        "order.json, _second.json; alone, the head-first grid took 78.8-79.0 at 128 and evict-first 77.9, "
        "40.8-41.0 at 64); in the engine against fe9128e, "
        "alternated twice (engine_qwen3.5-9b_bf16_state_dot_streamed_same_machine.json), steps 6.366-6.369 / "
        "8.041-8.046 ms at C=64 / 128 against 6.392-6.400 / 8.102-8.103, closed batches 8990-9002 / "
        "13299-13325 tok/s against 8946-8950 / 13235-13250, C=32 unchanged; set against the vLLM run above, "
        "from another command, 1.095-1.096x and 1.104-1.106x. The fp32 state's decode kernel streams its "
        "64-column tiles the same way from 64 sequences (7150341; kernels_check_gdn_decode_streamed_fp32.json, "
        "each form twice: 138.5-138.7 against 141.9 us at 128 sequences, 70.4-70.5 against 72.4 at 64); the "
        "default engine against b14b51f, alternated twice (engine_qwen3.5-9b_fp32_state_streamed_same_machine"
        ".json): steps 7.058-7.061 / 9.408-9.425 ms at C=64 / 128 against 7.071-7.074 / 9.459-9.469, closed "
        "batches 8199-8201 / 11637-11659 tok/s against 8184-8197 / 11610-11618, C=32 unchanged: 0.3% at "
        "C=128, short of what the fp32 rows above miss by.",
        "At 5778793 paged attention splits the keys of single-tile rows (decode, short verify rows) up to about "
        "four programs an SM (key_splits), where it split them only when the programs left SMs idle: one "
        "program an SM walked its keys at about a quarter of the bandwidth. Timed with the K/V out of L2 "
        "(paged_attention_decode.json; floor: the K/V bytes over 4.24 TB/s): 32 sequences 16.7 against 20.6 us "
        "over 256 keys (floor 7.9) and 72.3 against 134.7 over 2048 (floor 63.3) with 4 splits; 64 sequences "
        "26.1 against 26.8 over 256 and 132.8 against 172.8 over 2048 with 2; 128 sequences fastest unsplit. "
        "In the engine against f00d81c, alternated twice in one command: with a bf16 state and 128-token "
        "prompts (engine_qwen3.5-9b_bf16_state_decode_splits_same_machine.json) steps 5.630-5.633 against "
        "5.673-5.674 ms at C=32 (closed batches 5320-5326 against 5291-5293 tok/s), 6.377-6.379 against "
        "6.360-6.368 at C=64 (8962 against 8974-8989: over about 256 keys the merge kernel's launch costs more "
        "than the split gains), C=128 unsplit and unchanged (8.045-8.079 against 8.054-8.062); with the "
        "default fp32 state and 2048-token prompts (engine_qwen3.5-9b_decode_splits_prompt2048_same_machine"
        ".json) 6.575-6.578 against 7.251-7.252 ms at C=32 (closed batches 2495-2500 against 2371-2373 "
        "tok/s) and 8.319-8.325 against 8.426-8.429 at C=64. Then (6bd4e36) rows that fill the SMs once but "
        "not twice (133-264 programs: 9B at C=48 and 64, 35B-A3B at C=96 and 128) take 64-key tiles unsplit "
        "instead of two splits, as many bytes in flight a program without the merge kernel's launch: against "
        "5778793 alternated twice in one command on another host, 9B at C=64 6.272-6.276 against 6.302-6.303 "
        "ms a step with a bf16 state over 128-token prompts (closed batches 9105-9108 against 9068-9075 tok/s; "
        "engine_qwen3.5-9b_bf16_state_decode_bn64_same_machine.json, its tree labelled 5778793+bn64) and "
        "8.115-8.123 against 8.253 with the fp32 state over 2048-token prompts (engine_qwen3.5-9b_decode_bn64_"
        "prompt2048_same_machine.json), though alone the attention timed 141.8 against 132.8 us at 2048 keys. "
        "The 35B-A3B shape's C=128 with those tiles (alone, 27.0 against 26.7 us unsplit in 32-key tiles over "
        "256 keys, 150.9 against 171.7 over 2048): the 35B-A3B notes. gpu_correctness_at_5778793.json (and "
        "_at_93e765a.json, gpu_correctness_bf16_state_at_93e765a.json, the streamed decode kernels' tree): the "
        "tiny Qwen3.5 and Qwen3.5-MoE checkpoints pass.",
        "The gated output norm in the decode kernel's epilogue, each program's tile spanning its head (f82a1a1, "
        "reverted in 6452822), measured slower from 32 sequences with either state dtype "
        "(kernels_check_gdn_decode_norm.json, the 9B GDN shape): fp32 state 164.3 against 144.4 us at 128 "
        "sequences and 84.2 against 75.7 at 64, bf16 87.6 against 80.2 and 46.3 against 44.2. The kernel and "
        "gated_rms_norm launched apart, in one graph, take 2-3 us more than the kernel alone did in other "
        "commands (78.1 / 42.0 us bf16, 141.8 / 72.5 fp32, at 128 / 64 sequences), so the norm's "
        "launch was never where the step's time went; below 32 sequences the fused form gains about 1 us a "
        "layer, under 0.6% of those steps. The bf16 state's tile through a TMA descriptor in the decode dot "
        "kernel (09419d8, reverted in 153bca3) was slower at every batch from 32 sequences "
        "(kernels_check_gdn_decode_dot_tma.json): 115.6 against 77.9 us at 128, 58.4 against 42.3 at 64. "
        "More of its programs on a multiprocessor did not pay either (63cc19c, reverted; "
        "kernels_check_gdn_decode_dot_registers.json, 128 sequences): the 128-column tile at 4 warps takes 168 "
        "registers a thread, so three programs share a multiprocessor already; capped at 144 (still three) "
        "77.9 us against 77.6, at 128 (four, 18 bytes spilled) 82.3; the tile read again for the update "
        "instead of kept in registers through the dot, 83.1, and so capped at 128, 85.6; 8 warps capped at 80 "
        "registers, 83.5 against 80.0 uncapped.",
        "Two more ways of taking time off a decode step measured no better, each against b277e5c in one command "
        "on the H200, and were not kept. The GDN decode step in one launch, a program per (sequence, value head) "
        "holding the head's whole state, its conv on a state kept as a ring of the last 4 inputs (41dc2c8): "
        "kernels_check_gdn_decode_one_launch.json has it faster than the conv, the delta rule and the gated norm "
        "below 32 sequences (9.6 against 12.7 us at 8) and level above (160.7 against 160.7 us at 128), a full "
        "row of state a program holding 254 registers a thread; the engine's steps, with it below 32 sequences "
        "and the three kernels (the conv on the ring) from 32 (engine_qwen3.5-9b_decode_dispatch_same_machine"
        ".json, alternated twice): 4.42 / 4.81 / 5.87 / 9.40 ms at C=1 / 8 / 32 / 128 against 4.41 / 4.83 / "
        "5.80 / 9.25. Prefetching into L2 the first bytes of each row of the next GEMM's weight from the small "
        "kernel before it (l2_prefetch.json): the 9B MLP layer took 85-95 us at 32-128 rows against 82-92 "
        "without (its floor 71.2 us).",
        "Between decode graphs, at 669afae and 5f5aba9 (graph_gaps_qwen3.5-9b_669afae.json, _timeline_669afae, "
        "_5f5aba9): the engine's step is its graph. With prefix caching off, as engine_bench.py and vLLM's "
        "bench.py run, every figure above already had it so; the 0.23 ms by which profile_steps found the engine's "
        "C=128 step longer than its graph replayed came from its engine, which had prefix caching on. There the "
        "decode-time snapshot captures, at every 16-token block, put one gap every 16 steps between two graphs "
        "(0.99 ms at C=32, 3.96 ms at C=128) and nothing else stood between them (0.014 ms at the median, no "
        "graph launched after the one before had finished). 5f5aba9 captures every 256 decode tokens: between "
        "graphs 0.014 ms on average and 0.022 at most at C=32 and C=128, the engine's step within 0.016 ms of "
        "its graph replayed. Replayed alone and in turn with a second capture of the rung, the graph takes the "
        "same time; the copies in and out and the depth-1 wait add at most 0.09 ms; copying the step's inputs "
        "with a kernel that reads the pinned mirror over the bus instead of the copy engine made the engine's "
        "steps slower, 6.012 / 9.50 ms against 5.911 / 9.41 at C=32 / 128, and two captures a rung in the "
        "engine gave 5.909 / 9.40 (engine_qwen3.5-9b_between_graphs_same_machine.json). gpu_correctness_at_"
        "5f5aba9.json: all seven architectures pass.",
        "At b9f4b93, with profile_prefill --gaps fixed (profile_prefill_qwen3.5-9b_8192_gaps_b9f4b93.json): the "
        "8k prefilling step took 195.0 ms on the host's clock under the profiler (198.9 timed without it), its GPU "
        "work 189.7 ms busy in a 191.7 ms span; 2.74 ms passed from the call to its first GPU work, and 1.16 ms "
        "in gaps over 50 us, all around the pass's first copies and the state reset. Of the lead, the profiler's "
        "request for its first activity buffer took 1.9 ms of host time in the same file's kernel-table run: "
        "profile_prefill now makes that request before the call. On the CPU, the engine's host work for one "
        "8192-token prompt (scheduling with the prefix cache, the batch, its device tensors, the step's end) "
        "took about 1 ms under cProfile. The pass is its kernels: 194.0 ms of them in that run. Decode at 128 "
        "rows (profile_qwen3.5-9b_c128_b9f4b93.json): 9.574 ms a step in the engine against 9.34 for its graph "
        "replayed back to back; between two graphs the GPU waits 82.8 us a step from the input copy's end to "
        "the graph's first kernel (the copies themselves take 4.2 us), and 0.265 ms pass between graphs on "
        "CUDA events. benchmarks/graph_gaps.py (new) replays the graph alone and with each thing the engine's "
        "loop adds around it, to find that difference (its findings: the note above).",
        "At 0f66749 beside vLLM in one command (side_by_side_qwen3.5-9b.json, vLLM with its decode warm-up): "
        "closed batches 1.203x / 1.095x / 1.014x / 1.002x vLLM's tok/s at C=1 / 32 / 64 / 128 (steps 4.467 / "
        "5.873 / 6.946 / 9.303 ms against 5.313 / 6.218 / 6.844 / 9.071); prefill 0.2016 s against 0.2126 at 8k "
        "(0.948x; 0.1989 s, 0.935x, run again after vLLM) and 0.9012 against 0.9280 at 32k (0.971x; 0.8975, "
        "0.967x). The same run against the issue's figures: C=32 / 64 / 128 1.073x / 1.024x / 0.986x, 8k "
        "0.942x, 32k 0.988x. Why the GDN chunk kernels run 1.3-1.5x slower inside a pass than alone "
        "(gdn_state_tiles_heat.json): the card's power limit. With 40 GEMMs of the MLP's shape before each call "
        "the card draws up to 700 W, nvidia-smi samples its SM clock at 1260-1500 MHz (1980 idle), and the "
        "state kernel takes 339.7 us at 8k against 258.2 alone (1399.6 against 1058.7 at 32k, where the pass "
        "took 1439), the prepare kernel 368.8 against 292.2; one GEMM before each call changes nothing "
        "(258.8). Over the 9B prefills of engine_prefill_rotary_tiles_same_machine_9b.json the samples drawn "
        "over 400 W have a median SM clock of 1560 MHz (1245 the lowest). The chunk kernels' time follows the "
        "clock the GEMMs leave them, and the GEMMs run at that limit (in edcc4d4's profiled 8k pass 152 of 196.5 "
        "ms of kernels, the MLP's at 749 and 765 TFLOP/s): 0.9x vLLM's 8k time on that card is 0.191 s. In "
        "that command 0f66749 (rotary_store_kv's token tiles: 63 against 202 us a layer at 8k alone, kernels_check_rotary_store_kv."
        "json) against 938b7ae: 8k 0.2018 / 0.1995 against 0.1989 / 0.1999 s, 32k 0.9022 / 0.9003 against "
        "0.9034 / 0.8965, within the spread (eight layers of 1.1 ms in all at 8k). The 8k pass's kernels at "
        "645b574 (profile_prefill_qwen3.5-9b_8192_gaps_645b574.json): 193.9 ms, the cuBLAS GEMMs 150.9 of them, "
        "the GDN chunk kernels 21.0 (state 9.4, prepare 8.2, output 3.4), sdpa 7.9, SiLU-and-mul 4.6, RMSNorm "
        "4.1, conv 2.6, gated norm 1.3, rotary with the KV store 0.53 (1.59 at edcc4d4). Its idle figures are "
        "void (see the file's idle_note); profile_prefill.py --gaps now profiles the prefilling step alone. "
        "gpu_correctness.json at 4b88ed1: all seven architectures pass.",
        "At 938b7ae (a long chunk's host batch built as numpy runs, bc7563b; the MoE tiles change nothing here), "
        "against f753d9b in one command, alternated base, new, new, base "
        "(engine_prefill_host_and_moe_tma_same_machine.json): 8k 0.2058 / 0.2057 against 0.2074 / 0.2066 s, "
        "0.96x vLLM's time. That card ran f753d9b, whose GPU path is edcc4d4's, 2-3% slower than the card of "
        "edcc4d4's run, whose 0.2015 s (8k) and 0.9087 s (32k) stay the comparison's prefill row. On the host "
        "(timeit, CPU) one 32768-token prompt's batch took 0.11 ms to build against 3.7 and 0.15 ms to become "
        "device tensors against 2.1; 8192 tokens 0.04 and 0.05 against 0.53 and 0.52. The GDN state kernel's "
        "tiles (gdn_state_tiles.json): 16-column tiles, two programs a multiprocessor, took 393-425 us at 8k "
        "against 258 for the default 32 columns at 3 stages, and a GEMM of the MLP's shape before each call "
        "did not slow it, so that alone does not reproduce the pass's 393.",
        "At edcc4d4 the long prefill passes' GDN state kernel takes bf16 dots (the state stays fp32) with the "
        "output in a kernel of its own, the buffers that only feed dots are bf16 (the same bytes as fp32 ones "
        "under those dots), the prepare kernel sums its inverse's series as a product and the output kernel "
        "takes 128-column tiles: the chunk kernels took 681 against 1057 us a layer at 8k, 2701 against 4205 at "
        "32k and 1412 against 1714 over 128 prompts of 128 tokens, alternated twice in one command on the "
        "engine's input layout (gdn_prefill_kernels_same_machine.json), with relative errors 6.8e-3 (output) and "
        "3.1e-3 (state) against 4.1e-3 and 1.3e-3 (kernels_check_gdn_long_pass_state.json). In the engine, "
        "against 19d5b97 alternated twice (engine_gdn_prefill_same_machine.json): 8k 0.2025 / 0.2015 against "
        "0.2052 / 0.2066 s (0.94-0.95x vLLM's), 32k 0.9084 / 0.9087 against 0.9135 / 0.9276 (1.00x). The pass "
        "gains less than the kernels alone: in the 8k pass the GDN kernels took 21.1 against 25.5 ms "
        "(profile_prefill_qwen3.5-9b_8192_gaps_edcc4d4.json, _19d5b97.json), the new state kernel 393 us a "
        "layer where it takes 258 alone, the old 705 where it takes 740: why is not found yet (the clocks under "
        "the GEMMs' power are a suspect). The closed batches at edcc4d4 (engine_qwen3.5-9b_closed.json; decode "
        "steps unchanged, their batch prefill 0.404 s at C=128 where 83c41b9's ladder took 0.424): 1.066x / "
        "1.019x / 0.974x vLLM's at C=32 / 64 / 128. gpu_correctness_at_edcc4d4.json: all seven architectures "
        "pass. 0.9x at 8k is 0.193 s: in the profiled pass the cuBLAS GEMMs take 152.2 of its 195.0 ms of "
        "kernels, and the GPU waits 3.6 ms in gaps over 50 us, 3.0 of them around the pass's first copies.",
        "At 83c41b9 (engine_qwen3.5-9b.json; its kernels are d844645's): C=1 223.0 tok/s (4.485 ms a step, 0.84 "
        "of its floor); closed batches 1.067x / 1.014x / 0.968x vLLM's figures at C=32 / 64 / 128 (1.106x the "
        "issue's 4608 at C=32; steps 5.91 / 6.98 / 9.41 ms); prefill 0.2101 s at 8k (0.98x) and 0.9425 s at 32k "
        "(1.03x). gpu_correctness_at_da1d946.json (and _at_83c41b9.json): all seven architectures pass. "
        "With the state in bf16 and the "
        "same kernels (the base runs of kernels_check_conv1d_decode_kernel.json): 5320 / 8913 / 12879 tok/s, "
        "1.114x / 1.097x / 1.077x. Three ways of taking time off a large batch's decode step measured slower, "
        "each against the running kernels in one command, and were not kept. The GDN decode in two passes over "
        "each state tile, the second reading its chunks back from L2 (kernels_check_gdn_decode_two_pass.json): "
        "at 128 sequences 151.5 against 141.6 us a layer with fp32 states and 131.6 against 95.9 with bf16, the "
        "step at C=128 9.87 against 9.43 ms. The same on a persistent grid whose programs prefetch their next "
        "tiles through shared memory (kernels_check_gdn_decode_persistent.json): 166.2 against 141.6 and 115.8 "
        "against 95.6 us, 9.86 against 9.40 ms. A conv1d decode kernel of its own "
        "(kernels_check_conv1d_decode_kernel.json): 9.98-18.77 against 10.45 us at 128 sequences, slower at 32 "
        "and 64, 9.53 against 9.40 ms. The bf16 state moves at 2.8 TB/s in the running kernel where fp32 moves "
        "at 3.8: what a multiprocessor holds in flight is bound by its registers, and neither way of walking the "
        "state raised it. torch's cuBLASLt backend and fp32 reductions move no projection of the step by more "
        "than 1 us at 64 and 128 rows but for the LM head at 128 rows, which each setting makes slower "
        "(gemm_backends.json: cuBLASLt 673, fp32 reductions 615 and 586, against 583 us). 1b37803 builds a step's "
        "host lists faster (KV slots by block runs, tensors through numpy): against 9593884 in one command on "
        "a faster host (engine_host_batch_same_machine.json), 32k prompts took 0.9191 / 0.9193 against 0.923 / "
        "0.9307 s; 8k prompts (0.206 both) and the closed batches' prefill did not move beyond the spread; the "
        "profiled pass of 128 prompts of 128 tokens waits 4.68 ms in gaps over 50 us "
        "(profile_prefill_qwen3.5-9b_128x128_gaps_1b37803.json).",
        "At d844645 (engine_qwen3.5-9b_at_d844645.json, on a host 1-2% slower than 2ddc3ef's: 4.484 against 4.398 ms a "
        "step at C=1): C=1 223.0 tok/s; closed batches 1.064x / 1.012x / 0.963x the issue's figures at C=32 / 64 "
        "/ 128 (steps 5.90 / 7.01 / 9.45 ms); prefill 0.2114 s at 8k (0.99x) and 0.944 s at 32k (1.04x). Beside "
        "vLLM in one command on that host (side_by_side_qwen3.5-9b.json): closed batches 1.209x / 1.074x / "
        "1.018x / 0.916x vLLM's at C=1 / 32 / 64 / 128; steps 4.48 against 5.31 ms, 5.91 / 6.15, 7.00 / 6.89, "
        "9.44 / 8.22; the batches' prefills 0.100 / 0.200 / 0.420 s against 0.164 / 0.271 / 0.503; one prompt "
        "0.2107 against 0.2104 s at 8k and 0.9455 against 0.9493 at 32k. That vLLM run, with its decode "
        "warm-up, gave 12602 tok/s at C=128 where the issue quotes 11953. What d844645 changed is the prefill "
        "of many short prompts (a closed batch's first step). Over 128 prompts of 128 tokens the pass's kernels "
        "took 389.4 against 423.9 ms (profile_prefill_qwen3.5-9b_128x128_d844645.json against _f3df3cd.json): the "
        "GDN state kernel 29.0 against 42.6 ms in 64-column tiles, the prepare kernel 18.6 against 22.6 under "
        "its register cap, paged attention 4.0 against 14.6 with its grid sized by the longest prompt, the state "
        "slots' clearing 1.6 against 5.8. The batch's first token moved less: 0.4153-0.4165 against 0.4281-0.4305 "
        "s at C=128, 0.196-0.197 against 0.205-0.208 at C=64 and 0.098-0.099 against 0.100-0.104 at C=32, "
        "alternated twice in one command (engine_qwen3.5-9b_occupancy_same_machine.json). Part of the gain went to "
        "the host: the step's first launch clears the state slots, and while index_fill took 5.8 ms the host "
        "built the pass's input tensors behind it; now the GPU waits 8.4 ms in gaps over 50 us, nearly all "
        "between the first copies of those tensors (profile_prefill_qwen3.5-9b_128x128_gaps_461ac63.json: 390.0 "
        "ms busy over a 398.9 ms span, 405.9 ms to the first token, 3.2 ms waiting after the clearing). The "
        "closed batches moved 0.3-0.5%. One long prompt did not move beyond the spread of runs (8k 0.2075-0.2090 "
        "against 0.2063-0.2102 s, 32k 0.925-0.928 against 0.925-0.927), though the prepare kernel alone took 313 "
        "against 385 us at 8k and 1255 against 1491 at 32k (kernels_check_occupancy.json).",
        "C=1: 4.398 ms per step (227.4 tok/s, 0.86 of the 3.77 ms floor) at 2ddc3ef; 4.485 ms (223.0 tok/s) on "
        "a second host (engine_qwen3.5-9b_at_2ddc3ef_second_host.json). In one command 52dc02c took 4.532 / "
        "4.531 ms and 2ddc3ef 4.477 / 4.480, alternated (engine_qwen3.5-9b_graph_inputs_same_machine.json): "
        "the decode graph completes its own inputs and takes its greedy tokens itself. Before: 4.552 ms "
        "(219.7 tok/s) at 4df8766, on a host where e8a1633 took 4.550 ms and 4df8766 4.547 / 4.548 in two alternated runs (engine_qwen3.5-9b_c1_same_machine_"
        "4df8766_vs_e8a1633.json); c2bd54a took 4.462 ms (224.1 tok/s, 0.845) on another host "
        "(engine_qwen3.5-9b_at_c2bd54a.json), 4.534 ms at 095568f on a third. Programmatic dependent launch "
        "took it from 4.63 to 4.52 ms on the same code (engine_qwen3.5-9b_pdl.json, commit 56b9c1e). Beside "
        "vLLM in one command at 0015780: 4.62 against 5.31 ms per step (1.15x). The projections are most of the "
        "step; the host's work is hidden by asynchronous scheduling.",
        "C=2-16: 1.12-1.78x the issue's vLLM figures on closed batches at 2c5926b (engine_qwen3.5-9b_at_2c5926b"
        ".json). Their decode steps run the same kernels since; their batch prefill is faster (not measured).",
        "C=32-128, on vLLM's instrument (closed batches, prefill included), at 2ddc3ef: 1.077x, 1.023x and "
        "0.978x of the issue's figures, steps 5.82 / 6.89 / 9.24 ms; 1.061x, 1.013x and 0.965x on a second "
        "host (5.91 / 6.97 / 9.40 ms). In one command 52dc02c took 6.02 / 7.09 / 9.52-9.55 ms and 2ddc3ef "
        "5.90-5.91 / 6.98-6.99 / 9.42-9.44, alternated twice (engine_qwen3.5-9b_graph_inputs_same_machine.json). At 52dc02c two "
        "graphs at 128 rows lay 0.355 ms apart in the engine's loop (0.041 at one row) while the host waited "
        "7.2 ms a step for tokens (profile_qwen3.5-9b_c1_c128_between_graphs_52dc02c.json): between them ran "
        "the argmax, three copies in and one out, and three small kernels completing the input ids and block "
        "tables. Now the graph starts by completing its inputs and ends with the argmax (9.35 -> 9.43 ms "
        "replayed alone), and between graphs there is one copy in and one out, 4 us of GPU time "
        "(profile_qwen3.5-9b_c128_between_graphs_2ddc3ef.json). At 4df8766: 1.045x, 0.997x and 0.951x (1.05x, "
        "1.00x, 0.96x at c2bd54a on another host); steps 6.02 / 7.09 / 9.55 ms. In one command e8a1633 took 6.09 / 7.13 / 9.61 ms and 4df8766 6.02 / 7.09 / 9.52 "
        "(engine_qwen3.5-9b_split_gemm_same_machine.json): from 17 to 128 rows the out and down projections "
        "run as two K slices of one batched cuBLAS GEMM whose fp32 parts the add-norm sums (split_gemm.json: "
        "the down projection 29.9 against 33.5 us at 128 rows, the out projection 12.3 against 13.6), and the "
        "LM head writes fp32 itself (540 against 608 us with the cast). Where a C=128 step goes "
        "(profile_qwen3.5-9b_c64_c128_4df8766.json, 9.40 ms of graph replay on that host): the GDN decode "
        "3.33 ms (139 us a layer, 0.91 of its fp32 state's floor); the GEMMs 4.88 ms against the weights' 3.74 "
        "ms floor, all cuBLAS (gate/up 1.88 ms, 58.7 us a call against 47.5; the split out and down "
        "projections 1.49 ms for their 64 calls, where 3374b95's took 1.59 with cuBLAS's split-K reductions; "
        "the GDN input projection 0.74, the LM head 0.56, qkv 0.21); paged attention 0.37, conv1d 0.30, the "
        "norms 0.44, SiLU-and-mul 0.09; the host added 0.29 ms a step then (the work between graphs, above). 1.1x needs the closed batch in 2.49 s, "
        "a step of about 8.0 ms after its 0.44 s prefill: 0.89 of the step's 7.11 ms floor, of which the fp32 "
        "states' reading and writing alone is 3.04 ms. vLLM beside deltaserve at fe99c3f took 6.61 and 8.99 ms "
        "a step at C=64 and C=128 (side_by_side_qwen3.5-9b_at_fe99c3f.json). The Triton skinny GEMM measured slower than "
        "cuBLAS at 64 and 128 rows on 19 of the 20 projections (skinny_gemm_tall.json); a split of the wider "
        "projections (gate/up, qkv, the GDN input) measured slower than cuBLAS whole (split_gemm.json).",
        "The vLLM runs keep the GDN recurrent state in bf16 (the shapes' configs name no mamba_ssm_dtype, so "
        "vLLM takes the model dtype, as its Qwen3.5 config hook reads); deltaserve keeps fp32 unless "
        "--gdn-state-dtype bfloat16. At that precision (engine_qwen3.5-9b_bf16_state.json, 2ddc3ef) the closed "
        "batches reach 1.125x / 1.099x / 1.085x of the issue's figures at C=32 / 64 / 128, steps 5.56 / 6.35 / "
        "8.18 ms (1.09x / 1.07x / 1.05x at 4df8766 on another host; 1.08x / 1.06x / 1.04x at d4e0e1f): the bf16 "
        "state's decode tiles took 96.5 against 147.7 us a layer at 128 sequences. 1.1x is met at C=32 only.",
        "Prefill at 2ddc3ef: 0.2131 s at 8k and 0.939 s at 32k, 1.00x and 1.03x the issue's vLLM times against "
        "the 0.9x target; 0.2056 / 0.930 s on the second host (0.96x, 1.02x), 0.2083 / 0.940 at 4df8766. The "
        "prefill's kernels are those of c2bd54a (the K split and the fp32 logits reach "
        "passes of at most 128 rows and the last row's logits), which took 0.2057 and 0.918 s on another host "
        "(0.96x, 1.01x). Where 8k goes (profile_prefill_qwen3.5-9b.json, 3374b95, 200.7 ms of kernels): cuBLAS "
        "GEMMs 149.6 ms, the GDN chunked prefill 26.0 (its state kernel 717 us a layer, the prepare kernel 367), "
        "attention 7.9, SiLU-and-mul 4.5, norms 5.8, conv1d 2.6. At 68332f1 on another machine "
        "(profile_prefill_qwen3.5-9b_68332f1.json) the attention layers' q/k preparation and output gate take "
        "1.97 ms (rotary_store_kv 1.59, the gate 0.38) where 3374b95's copies, rotary, norms, sigmoid and "
        "product took about 4.1; the GEMMs there ran 1% slower, so the pass's kernels total the same 200 ms. "
        "0.9x is 0.193 s: at cuBLAS's rate the GEMMs leave 43 ms for everything else, which takes about 51. The "
        "GDN state kernel at 8 warps took 781 against 740 us (kernels_check_gdn_state_warps.json); the prepare "
        "kernel at 8 warps 708 against 385 us, with w and u in 64-column tiles 393 "
        "(kernels_check_gdn_prepare_tiles.json); rounding the state kernel's dot operands to bf16, with the "
        "output in its own kernel, 547 us with 2.4x the state's error: not taken. One long sequence's chunk "
        "kernels cut into pieces on three streams, so that other pieces' prepare and output kernels run beside "
        "the state kernel, measured slower (a change not kept: 1.37-3.25 ms against 1.20 at 8k for pieces of "
        "2048-512 rows, the shorter the slower; 4.01 against 4.46 ms at 32k at best; the 35B-A3B prefill 0.141 "
        "/ 0.615 s against 0.133 / 0.600 with 1024-row pieces).",
        "SiLU-and-multiply launched as a dependent grid (86158c8; it was the decode step's one Triton kernel "
        "launched plainly), the down projection's launch still waiting for its end: against d1afe56 alternated "
        "twice in one command, with the warm-up and so with cuDNN's cost "
        "(engine_qwen3.5-9b_silu_pdl_wait_only_same_machine.json), C=32 steps 5.871-5.874 against 5.970-5.974 ms, "
        "closed batches 5115-5116 against 5044 tok/s, and C=1 4.477 against 4.484 ms. Releasing the down "
        "projection at the SiLU's start (a64fafe) gave C=32 the same but C=1 4.651-4.661 ms "
        "(engine_qwen3.5-9b_silu_pdl_same_machine.json): traced, the down projection's skinny GEMM took "
        "32.5-34.0 against 26.7 us (warm_up_cost_qwen3.5-9b_cudnn_handle_c1_trace_at_*.json).",
        "Where a step at one sequence goes, from that trace at d1afe56 (4.501 ms of kernels end to end, "
        "graph_timeline.effective_by_pair; weight floors at 4.24 TB/s): the gate/up projections (cuBLAS) add "
        "50.0 us a layer (floor 47.5), the GDN input projections 26.1 (23.9), the down projections 26.6 (23.7), "
        "the attention qkv projections (cuBLAS) 22.4 (19.8), the LM head 453 (480); the 4096 x 4096 output "
        "projections, skinny GEMMs of one block a multiprocessor, add 10.7 us after the gated norm and 13.3 "
        "after the split merge (floor 7.9), both of which release them at their start; the other kernels "
        "add 0.9-4.9 us each (the greedy argmax 10.4), 0.43 ms a step in all.",
        "The gated norm and the split merge then released the output projections at their end instead "
        "(cc65afe): against 58f1857, three trees alternated twice (engine_qwen3.5-9b_skinny_gemm_predecessors_"
        "same_machine.json), C=1 4.466-4.468 against 4.482 ms, C=32 5.868-5.869 against 5.872; asking for the "
        "largest shared-memory carveout in those two kernels instead (98eb379) gave 4.461-4.465 and "
        "5.873-5.874. With the race kernel's greedy argmax in the graphs too (2002ad6), 4.454-4.456 against "
        "4.479-4.481 ms at C=1 and 5.860-5.861 against 5.872-5.873 at C=32 (engine_qwen3.5-9b_race_kernel_"
        "greedy_same_machine.json; SmolLM2-135M 0.720-0.722 / 0.822 / 1.084-1.087 against 0.730-0.733 / "
        "0.832-0.834 / 1.091-1.095 ms at C=1 / 16 / 64). The rows at C=32 / 64 / 128 come from 2002ad6 "
        "(engine_qwen3.5-9b_decode_rows_at_2002ad6.json, two rounds): 5.860 / 6.986-6.987 / 9.384 ms, closed "
        "batches 5131-5134 / 8260-8264 / 11674-11678 tok/s; C=64 and C=128 step slower than 0f66749's rows "
        "(6.946 / 9.303), which ran before cuDNN's start-up, and C=32 faster.",
    ],
    "qwen3.5-35b-a3b": [
        "At a4c2d03, measured per kernel only (the engine rows above predate it): paged attention's long-chunk tiles "
        "(the 9B notes' first paragraph). At this shape's attention (2 KV heads) on one H200 "
        "(paged_attention_prefill.json): a chunk of 2048 tokens took 89.0 us a layer fresh, as cuDNN's sdpa (88.8), "
        "and 222.9 / 560.5 / 2534.4 over 2048 / 6144 / 30720 cached keys, against 297.0 / 758.1 / 1707.4 / 8395.6 "
        "in the masked 64 x 32 tiles before; 128 prompts of 128 tokens 192.1 against 281.5.",
        "At 0a85c66 (prefill graphs to 2048 rows, the 9B notes' first paragraph) beside 929dea4 in one command "
        "(engine_prefill_graphs_to_2048_same_machine.json): 1024 / 1500 / 2048 tokens 28.7-28.8 / 35.0-35.8 / "
        "42.3-42.5 ms against 34.7-40.2 / 34.1-34.8 / 40.9-41.3 eagerly, on a fast host; on two slower ones the "
        "eager 1024- and 2048-token passes took 56-78 ms (engine_qwen3.5-35b-a3b_prompts_to_2048_at_929dea4.json, "
        "engine_prefill_graphs_to_2176_same_machine.json: 562 kernels launched a pass, eager_host_qwen3.5-35b-a3b_"
        "at_929dea4.json). At prompt lengths seen for the first time, 1100 to 2000 tokens, 31.3-43.0 ms against "
        "121.7-172.8 (engine_new_prompt_lengths_same_machine.json). A 4096-token prompt in two 2048-token chunks: "
        "86.4 ms of kernels as graphs against 83.5, the fresh chunk's paged attention about 3.4 ms against cuDNN's "
        "0.8 (profile_prefill_4096_in_2048_chunks_same_machine.json); an 8192-token prompt in four chunks "
        "206.2-215.1 ms against 197.2-197.3 on the fast host, 212.2-217.8 against 237.5-259.7 on a slower one.",
        "At e73044f (the GDN prefill's kd, the 9B notes' first paragraph) against 4d1d46e in one command, one "
        "round (engine_qwen3.5-35b-a3b_prefill_rows_at_e73044f.json, the prefill rows): 8k 0.1186 against "
        "0.1208 s, 32k 0.5534 against 0.5630 (0.807x and 0.877x the issue's vLLM times).",
        "At 5778793 (paged attention's decode splits, the 9B notes), against f00d81c alternated twice in one "
        "command with the default fp32 state (engine_qwen3.5-35b-a3b_decode_splits_same_machine.json): C=64, "
        "its 128 programs now in 4 key splits, steps 17.868-17.869 against 17.917-17.919 ms, closed batches "
        "3497-3498 against 3488 tok/s (1.056x the issue's 3312); C=32 split 4 ways before and after (13.229-"
        "13.230 against 13.227-13.233 ms); C=128 in 2 splits 22.203-22.212 against 22.178-22.182. Since "
        "6bd4e36 C=128 takes 64-key tiles unsplit: against its parent 3a4e664 (two splits), alternated twice "
        "in one command on a slower host (engine_qwen3.5-35b-a3b_decode_bn64_same_machine.json), steps "
        "22.450-22.451 against 22.493 ms, closed batches 5490-5492 against 5482-5487 tok/s.",
        "At 0f68ecf beside vLLM in one command with vLLM's GDN state in fp32 as well (vllm_peer.py; "
        "side_by_side_qwen3.5-35b-a3b_fp32_state.json): closed batches 1.810x / 1.159x / 1.110x / 1.094x vLLM's "
        "tok/s at C=1 / 32 / 64 / 128, steps 2.399 / 13.233 / 17.946 / 22.244 ms against 4.388 / 14.640 / "
        "19.699 / 23.854. At one precision C=64 meets 1.1x and C=128 misses it by 0.6% (against the issue's "
        "figure, whose state is bf16, 1.23x). The bf16 state's decode on the tensor cores (336b764, the 9B "
        "notes) runs for this shape's bf16 state too (the same GDN heads). With --gdn-state-dtype bfloat16, "
        "d718aad against b42e599 in one command, one run each (engine_qwen3.5-35b-a3b_bf16_state_dot_same_"
        "machine.json): steps 12.89 / 17.07 / 20.48 ms at C=32 / 64 / 128 against 12.99 / 17.26 / 20.96, "
        "closed batches 2438 / 3658 / 6010 tok/s against 2418 / 3618 / 5879: 1.387x / 1.104x / 1.332x the "
        "issue's vLLM figures, whose state is bf16 too. A second command, two rounds alternated (_second.json, "
        "the same engine code at a37d25c): steps 12.99 / 17.29 / 20.61-20.62 ms against 13.10 / 17.49 / "
        "21.10-21.11, closed batches 2405-2415 / 3612 / 5970-5972 tok/s, so C=64 at 1.090x: at vLLM's state "
        "precision this shape's C=64 sits at the 1.1x line, 1.09x-1.10x from host to host. bf16_gdn_state "
        "below takes the slowest of all these runs.",
        "Both engines with a bf16 state in one command at e346f5e (side_by_side_qwen3.5-35b-a3b_bf16_state.json): "
        "closed batches 1.776x / 1.173x / 1.137x / 1.099x vLLM's tok/s at C=1 / 32 / 64 / 128, steps 2.392 / "
        "12.987 / 17.290 / 20.682 ms against 4.366 / 14.758 / 19.364 / 22.005; vLLM ran 3177 and 5413 tok/s at "
        "C=64 and C=128 here (the issue's figures: 3312 and 4512). C=128 misses 1.1x by 0.1%, C=64 meets it.",
        "Between decode graphs at C=64 (graph_gaps_qwen3.5-35b-a3b_669afae.json and _5f5aba9.json): with "
        "prefix caching on and decode captures at every block the engine's step was 0.19 ms longer than its "
        "graph replayed; with them every 256 tokens, 0.005 ms (0.014 ms between graphs on average, 0.021 at "
        "most). The closed-batch figures, with prefix caching off, are unchanged: the miss at C=64 is the "
        "graph's own 18.0 ms.",
        "At b9f4b93 (profile_prefill_qwen3.5-35b-a3b_32768_gaps_b9f4b93.json): the 32k prefilling step took "
        "533.8 ms under the profiler (550.2 timed without it), its GPU work 526.1 ms busy in a 529.2 ms span, "
        "3.59 ms from the call to its first GPU work (the profiler's first activity buffer took 2.8 ms of host "
        "time in the kernel-table run) and 2.13 ms in gaps over 50 us, around the pass's first copies.",
        "At 891831d beside vLLM in one command (side_by_side_qwen3.5-35b-a3b.json): closed batches 1.782x / "
        "1.137x / 1.072x / 1.012x vLLM's tok/s at C=1 / 32 / 64 / 128 (steps 2.414 / 13.225 / 18.049 / 22.369 "
        "ms against 4.442 / 14.012 / 18.743 / 22.232); prefill 0.1218 s against 0.1472 at 8k (0.827x; 0.1213, "
        "0.824x, run again after vLLM) and 0.5567 against 0.6609 at 32k (0.842x; 0.5582, 0.845x). The same run "
        "against the issue's figures: C=1 414.3 tok/s, C=32 / 64 / 128 1.352x / 1.045x / 1.223x, 8k 0.829x, "
        "32k 0.882x: both prefills meet 0.9x on both comparisons. What took 32k there: rotary_store_kv in token "
        "tiles (8 tokens a program at 2 warps from 512 tokens on; kernels_check_rotary_store_kv.json): 243 us "
        "a layer at 32768 tokens against 807 a token a program (floor 222), 63 against 202 at 8192, the same "
        "error against the fp32 reference (4.8e-3 for q, 5.0e-3 for the k cache) and at most one bf16 step "
        "(0.0156) from a token a program's bytes. In one command, 108055d (4 warps) against 938b7ae "
        "(engine_prefill_rotary_tiles_same_machine.json): 32k 0.5616 / 0.5664 against 0.5649 / 0.5682 s, 8k "
        "0.1222 / 0.1211 against 0.1222 / 0.1231; that card ran 938b7ae 2% faster than the card of its first "
        "runs (0.5756 / 0.5751). u in bf16 (chunk_gdn's u_dtype, kernels_check_rotary_tiles_u_dtype.json): the "
        "chunk kernels 652 against 676 us at 8k and 2578 against 2678 at 32k, the output's error 5.7e-3 "
        "against 5.6e-3 and 5.9e-3 against 5.2e-3: left off. C=64 misses 1.1x: 1.1x the issue's 3312 tok/s is "
        "the closed batch in 4.50 s, a step of about 17.2 ms, 0.94 of its 16.14 ms floor, where it takes 18.05 "
        "(the experts' GEMMs are at their floor; the GDN decode's fp32 states are 2.1 ms of the step). Where a C=64 "
        "step goes at 645b574 (profile_qwen3.5-35b-a3b_c64_645b574.json, 18.34 ms a step, 18.18 of graph "
        "replay): 18.23 ms of kernels, the expert GEMMs 13.30 (gate/up 8.82, down 4.49), the GDN decode 2.07, "
        "the other cuBLAS GEMMs 1.43 (0.49 in 30 calls a step, 0.33 and 0.22 in 40 each, the LM head 0.27, "
        "0.12 in 10), paged attention 0.25, the counting sort 0.23, gated norm 0.21, conv1d 0.20, RMSNorm 0.18, combine 0.16, route "
        "0.13; the GPU idles 0.38 ms a step, 0.25 between the graph's kernels and 0.13 between the input copy "
        "and the graph's first kernel.",
        "At 938b7ae against f753d9b in one command, alternated base, new, new, base "
        "(engine_prefill_host_and_moe_tma_same_machine.json): 8k 0.1236 / 0.1238 against 0.1290 / 0.1279 s "
        "(0.84x vLLM's time), 32k 0.5756 / 0.5751 against 0.5916 / 0.5963 (0.911x: 0.9x is 0.568 s, missed by "
        "7 ms). Two changes: a long chunk's host batch as numpy runs (bc7563b), and the sorted MoE's large "
        "tiles through TMA descriptors (938b7ae: 3775 against 4145 us at 32768 tokens, gate/up 2005 against "
        "2507 and down 1466 against 1665, the same output; kernels_check_moe_tma.json). Where the 32k pass "
        "went before them (profile_prefill_qwen3.5-35b-a3b_32768_gaps_571e85c.json, 556.7 ms of kernels, 2.85 "
        "in idle gaps): cuDNN attention 126.7 ms, the MoE's gate/up 97.9 and down 65.9, the dense GEMMs 111.1, "
        "the GDN chunk kernels 99.0 (state 43.2, prepare 39.0, output 16.8), the MoE's combine 12.5, conv 12.2, "
        "RMSNorm 10.1, rotary with the KV store 7.1 (711 us a layer, some 4x its bytes' time), the gated norm "
        "6.0. The rotary and KV store in 8-token tiles (55a4a2b) is checked in the interpreter (the same bytes "
        "as a token a program) and compiled for sm_90, and not yet timed on the GPU. The GDN state kernel took "
        "1439 us a layer inside that pass against 1014 timed alone at 32k.",
        "At edcc4d4 (the GDN prefill kernels of the 9B notes' first paragraph), against 19d5b97 alternated twice "
        "in one command (engine_gdn_prefill_same_machine.json): 8k 0.1250 / 0.1258 against 0.1312 / 0.1303 s "
        "(0.85-0.86x vLLM's time, the 0.9x target met), 32k 0.5779 / 0.5773 against 0.5928 / 0.5984 (0.92x; "
        "0.9x is 0.568 s). The closed batches (engine_qwen3.5-35b-a3b_closed.json): 1.352x / 1.044x / 1.223x "
        "at C=32 / 64 / 128. The inverse's series as a product, not kept at c2bd54a (below) because the "
        "prefill did not move beyond the spread, is in: it takes 3.5% off the prepare kernel "
        "(302.5 -> 292.0 us at 8k) and nothing else.",
        "At 83c41b9 (engine_qwen3.5-35b-a3b.json; its kernels are d844645's): C=1 414.5 tok/s (2.413 ms a step); "
        "closed batches 1.344x / 1.042x / 1.219x the issue's figures at C=32 / 64 / 128 (steps 13.23 / 18.06 / "
        "22.34 ms); prefill 0.0598 s at 1k, 0.1338 s at 8k (0.910x) and 0.606 s at 32k (0.960x). On a faster "
        "host, 1b37803 (its host lists built faster) against 9593884 in one command, alternated twice "
        "(engine_host_batch_same_machine.json): 8k 0.1318 / 0.1297 against 0.1315 / 0.1304 s (0.88-0.90x "
        "either way), 32k 0.5952 / 0.5929 against 0.602 / 0.5987 (0.94x).",
        "At d844645 (engine_qwen3.5-35b-a3b_at_d844645.json): C=1 414.8 tok/s (2.411 ms a step); closed batches 1.351x / "
        "1.043x / 1.216x the issue's figures at C=32 / 64 / 128 (steps 13.21 / 18.04 / 22.40 ms); prefill 0.1368 "
        "s at 8k (0.931x) and 0.611 s at 32k (0.968x). In one command, alternated twice "
        "(engine_qwen3.5-35b-a3b_occupancy_same_machine.json), the batch prefill took 0.1258-0.1262 against "
        "0.1317-0.1323 s at C=64 and 0.2348-0.2373 against 0.2542-0.2576 at C=128; at C=32 0.082-0.088 against "
        "0.072-0.074, and 0.069 in the ladder run: that pass is bound by the host's launches "
        "(profile_prefill_qwen3.5-35b-a3b_32x128_d844645.json: 64.1 ms of kernels, 72.4 ms to the first token, "
        "the host never waiting for the GPU), so its time follows the host's. One prompt: 8k 0.1344 / 0.1362 "
        "against 0.1344 / 0.1353 s, 32k 0.601 / 0.602 against 0.600 / 0.607, not moved beyond the spread; 0.9x "
        "at 8k (0.1323 s) is met on some hosts and runs and missed on others. The sorted MoE's down kernel "
        "under its own warps and stages (tiles that fit two programs a multiprocessor) measured 447-543 us "
        "against 454 at 8192 tokens and 811-1286 against 807 at 16384 (kernels_check_occupancy.json, "
        "moe_sorted_down_tiles_*): kept as it was.",
        "C=1: 416.7 tok/s (2.400 ms a step, 2ddc3ef; 410.3 at 4df8766, 409.7 at c2bd54a) against the 400 tok/s "
        "target and a 1.42 ms floor (0.59 of it), 1.79x the issue's vLLM figure (4.30 ms). In one command "
        "52dc02c took 2.435 / 2.433 ms and 2ddc3ef 2.400 / 2.401 (engine_qwen3.5-35b-a3b_graph_inputs_same_"
        "machine.json: the decode graph completes its own inputs and takes its greedy tokens itself). In one command the "
        "graph replayed in 2.427 ms at fd21be1 and 2.428 ms at 095568f (profile_qwen3.5-35b-a3b_c1_fd21be1_vs_"
        "095568f.json). A step is about 440 short kernels; partial sums (2.94 to 2.68 ms) and programmatic "
        "dependent launch (2.68 to 2.45 ms) got it there.",
        "On vLLM's instrument (closed batches, prefill included), at 2ddc3ef: C=32 1.364x, C=64 1.053x, C=128 "
        "1.226x of the issue's figures; steps 13.06 / 17.83 / 22.12 ms, where 52dc02c took 13.26 / 17.97 / "
        "22.32 in the same command (the graph's own inputs and greedy tokens, as for 9B). At 4df8766: 1.35x, "
        "1.05x, 1.22x (1.34x, 1.04x, 1.21x at c2bd54a); steps 13.23 / 17.95 / 22.25 ms. In one command e8a1633 took 18.04 / 22.36 ms a step at C=64 / 128 and 4df8766 17.95 / 22.25 "
        "(engine_qwen3.5-35b-a3b_split_gemm_same_machine.json: the 2048 x 4096 output projections split on "
        "cuBLAS, 7.2 against 10.0 us at 64 rows, split_gemm.json; the logits in fp32). Beside vLLM in one "
        "command at 9263d26 (side_by_side_qwen3.5-35b-a3b.json), where vLLM with its decode warm-up ran faster "
        "than the issue's figures at C=128 (5448 against 4512 tok/s): C=32 1.07x, C=64 1.00x (18.47 against "
        "18.34 ms per step), C=128 0.94x (23.86 against 22.24 ms). At C=64 the step is at 0.905 of its 16.1 ms "
        "floor: 64 tokens touch most of the experts, whose reading takes about 13 ms at the bandwidth, and the "
        "GDN decode reads and writes 64 fp32 states per layer. Where a C=64 step goes at 835588f "
        "(profile_qwen3.5-35b-a3b_c64_835588f.json, 17.9 ms of graph replay): the expert GEMMs 13.07 ms "
        "(gate/up 8.66, down 4.41), the GDN decode 2.08 (69 us a layer, 0.91 of its fp32 states' floor), the "
        "dense GEMMs 1.42 (the GDN input projection 0.49, the split output projections 0.33, the LM head 0.26, "
        "the MoE input projection 0.22, qkv 0.12), the MoE's counting sort 0.23, combine 0.16 and route 0.13, "
        "the norms 0.39, conv1d 0.20, paged attention 0.20. 1.1x at C=64 needs the closed batch in 4.50 s, a "
        "step of about 17.1 ms, 0.94 of the floor. With the state in bf16, as the vLLM runs keep it "
        "(engine_qwen3.5-35b-a3b_bf16_state.json, d4e0e1f): C=64 1.07x (17.60 ms a step), C=128 1.27x.",
        "Prefill at 2ddc3ef: 0.1333 and 0.1348 s at 8k in two runs on one host (0.907x and 0.917x the issue's "
        "vLLM time) and 0.606 / 0.608 s at 32k (0.96x; 0.9x is 0.568); 4df8766 took 0.1333 / 0.6055 s. The "
        "prefill's kernels are those of c2bd54a, which took 0.1321 s (0.899x) and 0.1317 / 0.1315 in "
        "two more runs on another host (engine_qwen3.5-35b-a3b_at_c2bd54a.json, prefill_same_machine_3374b95_vs_"
        "c2bd54a.json), and 0.592 s at 32k; e8a1633 took 0.133 / 0.600 s on a third, and 02947bb 0.1349 / 0.1313 "
        "/ 0.1315 s at 8k in three runs on a fourth (prefill_same_machine_02947bb_vs_5a53253.json): whether 8k "
        "meets the 0.9x target (0.1323 s) is decided within the spread of runs and hosts. On that host the "
        "prepare kernel's triangular inverse as the product (I - M)(I + M^2)(I + M^4) took the kernel from 388 "
        "to 371 us at 8k, but the prefill 0.1322 / 0.1329 / 0.1333 s, alternated with the runs above: not "
        "kept. What made 8k faster at c2bd54a: past 4096 (token, "
        "choice) pairs the MoE sorts them by a three-launch block counting sort, 22.7 us for an 8192-token "
        "prompt's 73728 pairs against 66.7 for torch's sort alone, before its 21 us align kernel "
        "(kernels_check_moe_block_sort.json); the fresh-prefill attention reads each key head for its query "
        "group (enable_gqa: 869 against 1023 us a layer, the same output bit for bit), gates its output in one "
        "kernel (56 against 185 us for the copy, sigmoid and product; fresh_attention.json) and normalises, "
        "rotates and stores q and k in one launch; the sorted MoE's large tiles load four steps ahead (1197 "
        "against 1209 us for the 8192-token MoE). Where 8k went before (profile_prefill_qwen3.5-35b-a3b.json, "
        "3374b95, 131.4 ms of kernels): the expert GEMMs 46.0 ms (gate/up 693 us a layer, 454 TFLOP/s counting "
        "the stacked shared expert; down 458 us, 341 TFLOP/s), the GDN chunked prefill 29.4 (state kernel 652 "
        "us a layer, prepare 327), dense GEMMs 27.3, attention 8.6, the experts' combine 3.3, conv1d 3.1, norms "
        "4.5, torch's sort and the align kernel 3.0.",
        "The rows at C=1 and C=64 come from 2002ad6 with the start-up warm-up (engine_qwen3.5-35b-a3b_decode_"
        "rows_at_2002ad6.json, two rounds): steps 2.436-2.437 / 18.076-18.085 ms against 891831d's 2.414 / "
        "18.049 (which ran before cuDNN's start-up), C=64's closed batch 3455-3458 tok/s.",
    ],
}


def peer_instrument_tok_s(row: dict) -> float:
    """A decode row on the instrument of the vLLM figures: the step rate at C=1, else the closed batch."""
    if row["concurrency"] == 1:
        return row["aggregate_tok_s"]
    if "closed_batch_tok_s" in row:
        return row["closed_batch_tok_s"]
    seconds = row["prefill_s"] + (GENERATED - 1) * row["step_ms"] / 1e3
    return round(row["concurrency"] * GENERATED / seconds, 1)


def later_runs(shape: str) -> list[dict]:
    """Engine runs after the ladder's: a closed-batch run (engine_<shape>_closed.json), a prefill-only run
    (engine_<shape>_prefill.json), deltaserve's run beside vLLM (side_by_side_<shape>.json) and the rows
    measured again at a later tree (DECODE_ROWS_AB, PREFILL_ROWS_AB)."""
    runs = []
    for name in (f"engine_{shape}_closed.json", f"engine_{shape}_prefill.json"):
        path = os.path.join(RESULTS, name)
        if os.path.exists(path):
            runs.append(json.load(open(path)))
    path = os.path.join(RESULTS, f"side_by_side_{shape}.json")
    if os.path.exists(path):
        together = json.load(open(path))
        runs.append({**together["deltaserve_raw"], "commit": together["commit"]})
    return (runs + slowest_of_newest_trees(DECODE_ROWS_AB.format(shape=shape))
            + slowest_of_newest_trees(PREFILL_ROWS_AB.format(shape=shape)))


BF16_STATE_AB = "engine_{shape}_bf16_state_*same_machine*.json"  # engine_ab.py runs with a bf16 state
DECODE_ROWS_AB = "engine_{shape}_decode_rows_at_*.json"  # engine_ab.py runs of one tree, the default fp32 state
PREFILL_ROWS_AB = "engine_{shape}_prefill_rows_at_*.json"  # the same for the prefill rows


def slowest_of_newest_trees(pattern: str) -> list[dict]:
    """Each engine_ab.py file matching pattern as one run of its newest tree (the tree named last), whose row at
    each concurrency, and at each prefill length, is the slowest of that tree's rounds. latest_rows then takes
    each row from the latest file that measured it: an older tree's rows give way to a newer one's."""
    runs = []
    for path in sorted(glob.glob(os.path.join(RESULTS, pattern))):
        ab = json.load(open(path))
        newest = list(ab["trees"].values())[-1]
        slowest, slowest_prefill = {}, {}
        for run in ab["runs"]:
            if run["commit"] != newest:
                continue
            for row in run["decode"]:
                kept = slowest.get(row["concurrency"])
                if kept is None or peer_instrument_tok_s(row) < peer_instrument_tok_s(kept):
                    slowest[row["concurrency"]] = row
            for row in run["prefill"]:
                kept = slowest_prefill.get(row["tokens"])
                if kept is None or row["ttft_s"] > kept["ttft_s"]:
                    slowest_prefill[row["tokens"]] = row
        runs.append({"date": ab["date"], "commit": newest, "decode": list(slowest.values()),
                     "prefill": list(slowest_prefill.values())})
    return runs


def latest_rows(runs: list[dict], section: str, key: str) -> dict:
    """key value -> (row, commit) from the latest-dated run that measured it."""
    rows = {}
    for run in sorted(runs, key=lambda r: r["date"]):
        for row in run[section]:
            rows[row[key]] = (row, run["commit"])
    return rows


def compare(shape: str, suffix: str = "") -> dict:
    ours = json.load(open(os.path.join(RESULTS, f"engine_{shape}{suffix}.json")))
    peer = VLLM[shape]
    # Each row comes from the latest run that measured it; a bf16-state run (suffix) is followed only by
    # the bf16-state A/B runs' newest tree.
    runs = [ours] + (slowest_of_newest_trees(BF16_STATE_AB.format(shape=shape)) if suffix == "_bf16_state" else [] if suffix else later_runs(shape))
    rows, missed = [], []
    for c, (row, commit) in sorted(latest_rows(runs, "decode", "concurrency").items()):
        entry = {"concurrency": c, "commit": commit, "deltaserve_tok_s": peer_instrument_tok_s(row),
                 "deltaserve_decode_tok_s": row["aggregate_tok_s"], "floor_ratio": row["floor_ratio"]}
        if c in peer["decode"]:
            entry["vllm_tok_s"] = peer["decode"][c]
            entry["ratio_to_vllm"] = round(entry["deltaserve_tok_s"] / peer["decode"][c], 3)
            entry["meets_1_1x"] = entry["ratio_to_vllm"] >= 1.1
            if not entry["meets_1_1x"] and c > 1:
                missed.append(decode_miss(shape, row, entry))
        rows.append(entry)
    prefill = []
    for tokens, (row, commit) in sorted(latest_rows(runs, "prefill", "tokens").items()):
        entry = {"tokens": tokens, "commit": commit, "deltaserve_s": row["ttft_s"]}
        if tokens in peer["prefill"]:
            entry["vllm_s"] = peer["prefill"][tokens]
            entry["ratio_to_vllm"] = round(row["ttft_s"] / peer["prefill"][tokens], 3)
            entry["meets_0_9x"] = entry["ratio_to_vllm"] <= 0.9
        prefill.append(entry)
    out = {"commit": ours["commit"], "date": ours["date"], "decode": rows, "prefill": prefill,
           "where_the_time_goes": NOTES[shape]}
    if not suffix:
        missed += [prefill_miss(shape, entry) for entry in prefill if entry.get("meets_0_9x") is False]
        out["misses"] = missed
    c1 = next((r for r in rows if r["concurrency"] == 1), None)  # a bf16-state run may have none
    if c1 is not None:
        out.update(c1_tok_s=c1["deltaserve_decode_tok_s"], c1_commit=c1["commit"], c1_floor_ratio=c1["floor_ratio"],
                   c1_target=C1_TARGET[shape], c1_meets_target=c1["deltaserve_decode_tok_s"] >= C1_TARGET[shape])
    return out


BANDWIDTH = 4.24e12  # bytes/s, the H200's measured copy bandwidth (engine_bench's floor)


def gdn_state_bytes(shape: str) -> int:
    """One sequence's recurrent GDN state over all GDN layers, in fp32."""
    from benchmarks.shapes import shape_config

    cfg = shape_config(shape)
    per_layer = cfg["linear_num_value_heads"] * cfg["linear_key_head_dim"] * cfg["linear_value_head_dim"] * 4
    return per_layer * cfg["layer_types"].count("linear_attention")


def decode_miss(shape: str, row: dict, entry: dict) -> dict:
    """By how much a closed batch misses 1.1x vLLM's figure, and the step that would meet it beside the
    step's floor and the part of that floor the fp32 GDN state takes (reading and writing it once)."""
    c = entry["concurrency"]
    needed = 1.1 * entry["vllm_tok_s"]
    miss = {"row": f"decode C={c}", "commit": entry["commit"], "tok_s": entry["deltaserve_tok_s"],
            "needed_tok_s": round(needed, 1), "short_by_pct": round(100 * (1 - entry["deltaserve_tok_s"] / needed), 1)}
    state_ms = c * gdn_state_bytes(shape) * 2 / BANDWIDTH * 1e3
    if "prefill_s" in row:  # the closed batch is its prefill and GENERATED - 1 steps
        needed_step = (c * GENERATED / needed - row["prefill_s"]) / (GENERATED - 1) * 1e3
        miss.update(batch_prefill_s=row["prefill_s"], step_ms=row["step_ms"], needed_step_ms=round(needed_step, 3),
                    step_floor_ms=row["floor_ms"], needed_floor_ratio=round(row["floor_ms"] / needed_step, 3),
                    floor_ratio=row["floor_ratio"])
    miss["fp32_gdn_state_floor_ms"] = round(state_ms, 3)  # a bf16 state would take half
    together = side_by_side(shape, "_fp32_state")
    same = next((r for r in (together or {}).get("decode", []) if r["concurrency"] == c), None)
    if same is not None:  # vLLM given the same fp32 state, in one command
        miss["closed_batch_speedup_over_vllm_with_fp32_state"] = same["closed_batch_speedup"]
    return miss


# Each shape's profiles of its long prefills (profile_prefill.py), newest first: a missed prefill target takes
# the first that profiled its length.
PREFILL_PROFILE = {"qwen3.5-9b": ["profile_prefill_qwen3.5-9b_8192_gaps_0baaacb.json",
                                  "profile_prefill_qwen3.5-9b_8192_32768_3a101c3.json"]}


def kernel_family(name: str) -> str:
    """cuBLAS GEMMs, cuDNN's attention, or the rest (deltaserve's Triton kernels, copies)."""
    if name.startswith(("nvjet", "sm90_xmma", "cutlass")):
        return "gemm"
    return "attention" if "sdpa" in name or "flash" in name else "other"


def prefill_miss(shape: str, entry: dict) -> dict:
    """By how much a prefill misses 0.9x vLLM's time; from the shape's profile, its kernels' milliseconds by
    family and what the rest would have to fit in beside the GEMMs and attention as profiled."""
    target_s = 0.9 * entry["vllm_s"]
    miss = {"row": f"prefill {entry['tokens']}", "commit": entry["commit"], "s": entry["deltaserve_s"],
            "needed_s": round(target_s, 4), "over_by_pct": round(100 * (entry["deltaserve_s"] / target_s - 1), 1)}
    for name in PREFILL_PROFILE.get(shape, []):
        profile = json.load(open(os.path.join(RESULTS, name)))
        run = next((r for r in profile["prefill"] if r["tokens"] == entry["tokens"] and r["prompts"] == 1), None)
        if run is not None:
            miss["profile"] = _profile_families(name, profile, run, target_s)
            break
    return miss


def _profile_families(name: str, profile: dict, run: dict, target_s: float) -> dict:
    """A profiled pass's kernel milliseconds by family, and what all but the GEMMs and attention must fit in."""
    families = {"gemm": 0.0, "attention": 0.0}
    for kernel in run["kernels"]:  # the device's kernels, not the host's calls nor the total
        family = kernel_family(kernel["name"])
        if family in families and not kernel["name"].startswith("HOST"):
            families[family] += kernel["ms"]
    every = next(k["ms"] for k in run["kernels"] if k["name"] == "ALL KERNELS")
    families["other"] = every - families["gemm"] - families["attention"]  # the table may stop short
    return {"file": name, "commit": profile["commit"], "ttft_s": run["ttft_s"],
            "kernels_ms": {k: round(v, 1) for k, v in families.items()},
            "other_must_fit_ms": round(target_s * 1e3 - families["gemm"] - families["attention"], 1)}


PREFIX_TARGET = 10.0  # warm follow-up turn at least this many times faster than cold
PREFIX_NOTES = [
    "The warm follow-up turn restores from the tail its first turn left when it finished: the state after "
    "8255 tokens (the 8k history and the reply up to its last token, which was sampled but never computed) "
    "and the 15 rows of the partly filled block holding its end, copied into a block of the new request's own. "
    "It recomputes 65 tokens (the last token of the reply and the new 64-token message) in one pass, replayed "
    "as a CUDA graph (the 80-row rung of the prefill graphs) whose first nodes restore the snapshot and copy "
    "the block. Restoring at the last block boundary instead, 8240, recomputed 80 tokens and took 19.3-19.5 "
    "ms (9.79x and 9.87x at commit 9263d26).",
    "Warm and cold are medians of five runs on fresh prompts. At commit 51610a2 (this file): 9.7x, cold "
    "0.1734 s, warm 17.9 ms; in one command with 095568f on a slower host, 9.7x against 9.3x (warm 18.4 "
    "against 18.9 ms; prefix_cache_qwen3.5-35b-a3b_same_machine_095568f_vs_51610a2.json). The warm turn is "
    "where it was (18.0 ms at 2c5926b, 10.5x, prefix_cache_qwen3.5-35b-a3b_at_2c5926b.json); the cold "
    "turn's 8192-token first pass got faster with the norms' row tiles and the conv1d row walk (0.1895 -> "
    "0.1734 s), so the ratio fell under 10x. At 095568f the conv1d row kernel ran an 80-row pass as 32 "
    "programs walking every row (31.8 us a layer; 5.8 us with the short runs of 51610a2, "
    "kernels_check_conv_short_pass_rows.json) and the warm turn took 18.5 ms (9.5x, _at_095568f.json). "
    "Earlier: 10.40x and 10.35x at 1ce1a2a; 9.85x and 9.97x at 4f7086f, after the GDN prefill's prepare "
    "kernel made the cold turn faster; 10.2x and 10.2x at d6fbe4a; 10.4x at 784cf1f. Runs on different "
    "machines differ by about 3% in the cold time.",
    "Where the warm turn's 18 ms go (profile_qwen3.5-35b-a3b.json, commit 4b0ed87): 17.0 ms of kernels, "
    "12.4 of them the expert GEMMs reading the experts that 65 tokens touch, at about the bandwidth floor "
    "(about 223 of 257 per layer; the graph's padding rows route to none). The rest: dense GEMMs 1.25 ms "
    "(cuBLAS at about half the bandwidth at these row counts; the router's 40 GEMMs are 5.5 us each of "
    "latency), the GDN kernels 1.4 ms, paged attention over the 8k history 0.51 ms, the MoE bookkeeping "
    "0.57 ms (counting sort, combine, route), the LM head 0.23 ms. The host takes about 0.85 ms before "
    "the graph starts (prompt validation 0.17, the lookup and the plan 0.27, loading the step buffers "
    "0.16, the block copy then 0.16 ms, inside the graph since) and 0.25 ms after the token.",
    "same_first_token compares the warm turn's token with the cold turn's, which computes the tail in other "
    "passes (8192, 112 and 16 rows): in bf16 on random weights the top two logits are close and they may "
    "differ. Exactness holds for the same request sent again: gpu_correctness.json checks it byte for byte, "
    "with graphs, on every architecture.",
    "Eight requests sharing a 2k prefix: each restores the prefix and runs its 64-token ending, all eight "
    "in one eager pass, bound by the host's launches, so the warm time follows the machine's host: 0.038 s "
    "(4.8x) at 095568f, 0.046 s (4.0x) at 51610a2 on another machine, 0.076 and 0.087 s for the two "
    "commits on a third (the same-machine file above); 0.040-0.041 s at 2c5926b.",
]


def _prefix_speedups(shape: str) -> list[float]:
    """cold / warm of each recorded run (the main file and a second run where there is one), unrounded."""
    runs = []
    for suffix in ("", "_second_run"):  # a second run at the same commit, where there is one
        path = os.path.join(RESULTS, f"prefix_cache_{shape}{suffix}.json")
        if os.path.exists(path):
            turn = json.load(open(path))["follow_up_turn"]
            runs.append(round(turn["cold_ttft_s"] / turn["warm_ttft_s"], 3))
    return runs


def compare_prefix_cache(shape: str) -> dict:
    ours = json.load(open(os.path.join(RESULTS, f"prefix_cache_{shape}.json")))
    turn = ours["follow_up_turn"]
    return {"commit": ours["commit"], "date": ours["date"], "warm_ttft_s": turn["warm_ttft_s"],
            "cold_ttft_s": turn["cold_ttft_s"], "speedup": turn["speedup"], "target": PREFIX_TARGET,
            "speedup_of_each_run": _prefix_speedups(shape),
            "meets_target": min(_prefix_speedups(shape)) >= PREFIX_TARGET,
            "warm_recomputed_tokens": turn["warm_recomputed_tokens"],
            "shared_prefix_speedup": ours["shared_prefix"]["speedup"], "where_the_time_goes": PREFIX_NOTES}


SIDE_BY_SIDE = ("", "_fp32_state", "_bf16_state")  # side_by_side_<shape><suffix>.json


def side_by_side(shape: str, suffix: str = "") -> dict | None:
    name = f"side_by_side_{shape}{suffix}.json"
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    run = json.load(open(path))
    out = {"commit": run["commit"], "date": run["date"], "decode": run["decode"],
           **{key: row for key, row in run.items() if key.startswith("prefill_")},
           "note": f"both engines in one command on the same H200 ({name})"}
    if "vllm_state_dtype" in run:
        out.update(deltaserve_gdn_state_dtype=run["deltaserve_gdn_state_dtype"],
                   vllm_state_dtype=run["vllm_state_dtype"])
    return out


def main() -> None:
    out = {shape: compare(shape) for shape in VLLM if os.path.exists(os.path.join(RESULTS, f"engine_{shape}.json"))}
    for shape in VLLM:
        if shape in out and os.path.exists(os.path.join(RESULTS, f"engine_{shape}_bf16_state.json")):
            # The vLLM runs keep the GDN state in bf16 (the shapes' configs name no mamba_ssm_dtype, so vLLM
            # takes the model dtype); deltaserve keeps fp32 unless --gdn-state-dtype bfloat16.
            half = compare(shape, "_bf16_state")
            out[shape]["bf16_gdn_state"] = {k: half[k] for k in ("commit", "date", "decode", "prefill")}
        # Each engine at its own default; both with the fp32 GDN state the released checkpoints' configs
        # name (vllm_peer.py); both with a bf16 one, vLLM's default on these shapes' configs.
        for suffix in SIDE_BY_SIDE:
            together = side_by_side(shape, suffix)
            if together is not None and shape in out:
                out[shape][f"side_by_side{suffix}"] = together
    for shape in VLLM:
        if os.path.exists(os.path.join(RESULTS, f"prefix_cache_{shape}.json")):
            out[f"prefix_cache_{shape}"] = compare_prefix_cache(shape)
    with open(os.path.join(RESULTS, "comparison.json"), "w") as f:
        json.dump(out, f, indent=1)
    for shape, data in out.items():
        if shape.startswith("prefix_cache"):
            print(f"{shape}: warm {data['warm_ttft_s']} s, cold {data['cold_ttft_s']} s, x{data['speedup']}")
            continue
        print(f"{shape}: C=1 {data['c1_tok_s']} tok/s (target {data['c1_target']}); C>1 on closed batches")
        for r in data["decode"]:
            print(f"  C={r['concurrency']:>3}  {r['deltaserve_tok_s']:>9}  vLLM {r.get('vllm_tok_s', '-'):>7}  "
                  f"x{r.get('ratio_to_vllm', '-')}  floor {r['floor_ratio']}")
        for r in data["prefill"]:
            print(f"  prefill {r['tokens']:>6}: {r['deltaserve_s']} s  vLLM {r.get('vllm_s', '-')}  x{r.get('ratio_to_vllm', '-')}")
        for r in data.get("bf16_gdn_state", {}).get("decode", []):
            print(f"  bf16 GDN state C={r['concurrency']:>3}: {r['deltaserve_tok_s']} tok/s  x{r.get('ratio_to_vllm', '-')}")
        for key in (f"side_by_side{suffix}" for suffix in SIDE_BY_SIDE):
            for r in data.get(key, {}).get("decode", []):
                print(f"  {key.replace('_', ' ')} C={r['concurrency']:>3}: step {r['deltaserve_step_ms']} vs "
                      f"{r['vllm_step_ms']} ms, closed batch x{r['closed_batch_speedup']}")


if __name__ == "__main__":
    main()
