"""Decode ladder and prefill of deltaserve's engine on one GPU, random weights in real shapes.

    python benchmarks/engine_bench.py SHAPE --concurrency 1,2,4,8,16,32,64,128 --prefill 1024,8192,32768 \
        --out benchmarks/results/engine_SHAPE.json

Decode: closed batches of C requests, 128-token prompts (`--prompt-len`), 256 generated tokens each
(ignore_eos; greedy, or sampled with `--temperature`, `--top-p` and `--top-k`), after a warm-up batch at the same
concurrency; the step time is the wall time of the decode steps (after the prefill) over their number, so
it includes the engine's own work per step (scheduling, batch building, graph replay, sampling). Its
floor: bytes of weights touched + GDN state read and written + KV read, over 4.24 TB/s.
`aggregate_tok_s` is C over the step time (decode alone); `closed_batch_tok_s` is every generated token
over the wall time of the whole batch, its prefill included: the instrument of the vLLM figures the issue
quotes as aggregate tok/s (the peer's bench.py: tokens / time of the generate call). Prefill: one prompt,
time to first token, and the TFLOP/s it achieves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from benchmarks.shapes import dummy_engine, random_tokens, weight_bytes  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.sampling_params import SamplingParams  # noqa: E402

BANDWIDTH = 4.24e12
PROMPT, GENERATED = 128, 256


def run_batch(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0,
              top_p: float = 1.0, top_k: int = -1, **penalties: float) -> dict:
    """Runs a closed batch (greedy unless a temperature is given); returns prefill time, decode steps and
    their time. `penalties`: SamplingParams' repetition, frequency and presence penalties. The batch prefills
    in one step where the token budget covers it; a prompt past the budget takes a step per chunk, and
    prefill_s runs to the end of the step that samples its first token."""
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                            ignore_eos=True, detokenize=False, **penalties)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt, params)
    prefill_steps = -(-sum(map(len, prompts)) // engine.config.max_num_batched_tokens)
    sync()
    start = time.perf_counter()
    for _ in range(prefill_steps):
        engine.step()
    sync()
    first_token_at, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step(final_only=True)
        steps += 1
    end = time.perf_counter()
    return {"prefill_s": first_token_at - start, "prefill_steps": prefill_steps, "decode_steps": steps,
            "decode_s": end - first_token_at}


def allocator_segments() -> int:
    """How many segments torch's CUDA caching allocator has taken from the driver so far (cudaMalloc calls)."""
    return torch.cuda.memory_stats().get("segment.all.allocated", 0) if torch.cuda.is_available() else 0


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_floor_bytes(engine: LLMEngine, weights: dict, concurrency: int, context: int) -> float:
    mc = engine.model_config
    touched_experts = 0.0
    if mc.num_experts:
        distinct = mc.num_experts * (1 - (1 - mc.num_experts_per_tok / mc.num_experts) ** concurrency)
        touched_experts = weights["experts"] * distinct / mc.num_experts
    state = 0
    pool = engine.runner.state_pool
    state_bytes = pool.h_all.element_size() if pool is not None else 4
    for _ in mc.gdn_layers:  # recurrent state read and written, conv state read and written
        state += 2 * (mc.linear_num_value_heads * mc.linear_key_head_dim * mc.linear_value_head_dim * state_bytes
                      + mc.gdn_conv_dim * (mc.linear_conv_kernel_dim - 1) * 2)
    kv = len(mc.attention_layers) * context * 2 * mc.num_kv_heads * mc.head_dim * 2
    return weights["dense"] + touched_experts + concurrency * (state + kv)


def prefill_flops(engine: LLMEngine, weights: dict, tokens: int) -> float:
    mc = engine.model_config
    active = weights["dense"] / 2
    if mc.num_experts:
        active += weights["experts"] / 2 * mc.num_experts_per_tok / mc.num_experts
    attention = len(mc.attention_layers) * 2 * tokens * tokens * mc.num_heads * mc.head_dim  # causal QK^T and PV
    return 2 * active * tokens + attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--prefill", default="1024,8192,32768")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-model-len", type=int, default=33024)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--generated", type=int, default=GENERATED)
    ap.add_argument("--prompt-len", type=int, default=PROMPT, help="the decode batches' prompt length")
    ap.add_argument("--gdn-state-dtype", default="float32", help="the engine's GDN recurrent state dtype")
    ap.add_argument("--temperature", type=float, default=0.0, help="the decode batches' (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="the decode batches' (1: off)")
    ap.add_argument("--top-k", type=int, default=-1, help="the decode batches' (-1: off)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0, help="the decode batches' (1: off)")
    ap.add_argument("--frequency-penalty", type=float, default=0.0, help="the decode batches' (0: off)")
    ap.add_argument("--presence-penalty", type=float, default=0.0, help="the decode batches' (0: off)")
    ap.add_argument("--prefill-passes", type=int, default=1,
                    help="prefill passes timed at each length after its warm-up; ttft_s is the first (vLLM's "
                         "instrument), later_ttft_s the others, new_segments the allocator's segments each took")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="the step's token budget (default: the longest prompt, or a closed batch's prompts): "
                         "a longer prompt's prefill takes several steps, timed to its first token")
    ap.add_argument("--no-prefill-warm-up", action="store_true",
                    help="time each prefill length's first pass (none of its length before it), as a server meets a "
                         "prompt length it has not seen")
    args = ap.parse_args()
    ladder = [int(c) for c in args.concurrency.split(",") if c]
    prefills = [int(p) for p in args.prefill.split(",") if p]
    started = time.perf_counter()
    widest = max(ladder, default=1)  # an empty ladder: prefill only
    budget = args.max_num_batched_tokens or max(prefills + [args.prompt_len * widest])
    engine = dummy_engine(args.shape, device=args.device, max_num_seqs=widest, max_num_batched_tokens=budget,
                          max_model_len=args.max_model_len, enable_prefix_caching=False,
                          gdn_state_dtype=args.gdn_state_dtype)
    weights = weight_bytes(engine.runner.model)
    result = {**results_io.header(), "shape": args.shape, "gdn_state_dtype": args.gdn_state_dtype,
              "max_num_batched_tokens": budget,
              "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
              "repetition_penalty": args.repetition_penalty, "frequency_penalty": args.frequency_penalty,
              "presence_penalty": args.presence_penalty,
              "startup_s": round(time.perf_counter() - started, 1),
              "weights_gb": {k: round(v / 1e9, 3) for k, v in weights.items()}, "decode": [], "prefill": []}
    tokens = random_tokens(engine.model_config.vocab_size)
    prompts = lambda n, length: [tokens(length) for _ in range(n)]  # noqa: E731
    for c in ladder:
        sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                    "repetition_penalty": args.repetition_penalty, "frequency_penalty": args.frequency_penalty,
                    "presence_penalty": args.presence_penalty}
        run_batch(engine, prompts(c, args.prompt_len), 16, **sampling)  # warm-up at this concurrency
        r = run_batch(engine, prompts(c, args.prompt_len), args.generated, **sampling)
        step = r["decode_s"] / r["decode_steps"]
        floor = decode_floor_bytes(engine, weights, c, args.prompt_len + args.generated // 2) / BANDWIDTH
        row = {"concurrency": c, "prompt_len": args.prompt_len, "step_ms": round(step * 1e3, 3),
               "per_seq_tok_s": round(1 / step, 1),
               "aggregate_tok_s": round(c / step, 1), "floor_ms": round(floor * 1e3, 3),
               "floor_ratio": round(floor / step, 3), "prefill_s": round(r["prefill_s"], 4),
               "closed_batch_tok_s": round(c * args.generated / (r["prefill_s"] + r["decode_s"]), 1)}
        result["decode"].append(row)
        print(row, flush=True)
        results_io.write(args.out, result)
    for length in prefills:
        if not args.no_prefill_warm_up:
            run_batch(engine, prompts(1, length), 1)  # warm-up (kernels for this length)
        segments = allocator_segments()
        r = run_batch(engine, prompts(1, length), 1)
        ttft = r["prefill_s"]
        row = {"tokens": length, "ttft_s": round(ttft, 4),
               "tflops": round(prefill_flops(engine, weights, length) / ttft / 1e12, 1)}
        if r["prefill_steps"] > 1:
            row["prefill_steps"] = r["prefill_steps"]
        if args.prefill_passes > 1:  # the passes after the measured one, and the device memory each allocated
            row["new_segments"] = [allocator_segments() - segments]
            row["later_ttft_s"] = []
            for _ in range(args.prefill_passes - 1):
                segments = allocator_segments()
                row["later_ttft_s"].append(round(run_batch(engine, prompts(1, length), 1)["prefill_s"], 4))
                row["new_segments"].append(allocator_segments() - segments)
        result["prefill"].append(row)
        print(row, flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
