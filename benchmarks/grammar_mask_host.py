"""The host's part of a grammar's step: filling the constrained rows' bitmasks, on this machine's CPU.

    python benchmarks/grammar_mask_host.py --out benchmarks/results/grammar_mask_host_cpu.json [--rows 1,32,128]

The demo model's tokenizer (49152 tokens) and a JSON schema of a string, an integer and a list of strings. R
matchers walk the tokens of one answer that holds to it; before each token every row's bitmask is filled one row
after another (llguidance's fill_next_token_bitmask, as Sampler._constrained once did), and then by llguidance's
batch fill on its own threads (fill_next_token_bitmask_par, as it does now), checked to give the same bits.
Reported: the median and the longest fill of a step over the answer's tokens, in milliseconds.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve.engine.llm_engine import LLMEngine  # noqa: E402
from deltaserve.engine.grammar import mask_shape  # noqa: E402
from deltaserve.sampling_params import StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
ANSWER = json.dumps({"name": "Alice Wonderland the third", "age": 42, "tags": ["a", "bb", "hello world", "x"]})


def walk(engine: LLMEngine, rows: int, fill) -> list[float]:
    """Seconds of each step's fill over the answer's tokens; fill(grammars, bitmask)."""
    params = StructuredOutputsParams(json=SCHEMA)
    text = engine.grammars.compile(params)
    grammars = [engine.grammars.matcher(params, text) for _ in range(rows)]
    bitmask = torch.empty(mask_shape(rows, engine.model_config.vocab_size), dtype=torch.int32)
    times, masks = [], []
    for token in engine.tokenizer.hf.encode(ANSWER, add_special_tokens=False):
        start = time.perf_counter()
        fill(grammars, bitmask)
        times.append(time.perf_counter() - start)
        masks.append(bitmask.clone())
        assert all(g.accept(token) for g in grammars)
    return times, masks


def one_by_one(grammars, bitmask):
    import llguidance.torch

    for row, grammar in enumerate(grammars):
        llguidance.torch.fill_next_token_bitmask(grammar.matcher, bitmask, row)


def main() -> None:
    import llguidance
    import llguidance.torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,32,128")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    engine = LLMEngine.from_args(None, device="cpu")
    executor = llguidance.LLExecutor()

    def batched(grammars, bitmask):
        llguidance.torch.fill_next_token_bitmask_par(executor, [(g.matcher, r) for r, g in enumerate(grammars)],
                                                     bitmask)

    result = {**results_io.header(), "cpus": os.cpu_count(), "vocab": engine.model_config.vocab_size, "rows": []}
    for rows in (int(r) for r in args.rows.split(",")):
        (serial, serial_masks), (parallel, parallel_masks) = walk(engine, rows, one_by_one), walk(engine, rows, batched)
        ms = lambda ts, f: round(f(ts) * 1e3, 3)  # noqa: E731
        result["rows"].append({"rows": rows, "steps": len(serial), "same_bits": all(map(torch.equal, serial_masks,
                                                                                        parallel_masks)),
                               "one_by_one_median_ms": ms(serial, statistics.median), "one_by_one_max_ms": ms(serial, max),
                               "batch_fill_median_ms": ms(parallel, statistics.median),
                               "batch_fill_max_ms": ms(parallel, max)})
        print(result["rows"][-1], flush=True)
    results_io.write(args.out, result)


if __name__ == "__main__":
    main()
