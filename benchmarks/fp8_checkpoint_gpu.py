"""FP8 checkpoints on the GPU: a tiny checkpoint whose projections are stored as float8 blocks with their scales
loads (each weight dequantized as it is read) and generates, on CUDA, what the same checkpoint stored with the
dequantized weights generates: greedy tokens and their logprobs identical, in fp32 and in bf16, with graphs
and eagerly.

    python benchmarks/fp8_checkpoint_gpu.py --out benchmarks/results/fp8_checkpoint_gpu.json
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io  # noqa: E402
from deltaserve import LLM, SamplingParams  # noqa: E402
from tests.checkpoints import make_checkpoint  # noqa: E402
from tests.fp8_checkpoints import write_fp8_pair  # noqa: E402

ARCHS = "qwen3.5,qwen3.5-moe,qwen3-next,llama"
MODES = {"fp32_graphs": dict(dtype="float32"), "bf16_graphs": dict(dtype="bfloat16"),
         "bf16_eager": dict(dtype="bfloat16", enforce_eager=True)}


def generated(path: str, prompts: list[list[int]], device: str, **options) -> list[tuple]:
    """Each prompt's greedy tokens and their logprobs."""
    llm = LLM(path, device=device, max_num_seqs=8, **options)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob) for o in outputs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default=ARCHS)
    ap.add_argument("--device", default="cuda", help="cpu runs the same comparison without a GPU")
    args = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (1, 17, 90, 33)]
    result = {**results_io.header(), "fp8_vs_dequantized": {}}
    for arch in args.archs.split(","):
        block = (rng.randint(3, 16), rng.randint(3, 16))  # rarely a whole number of blocks along either side
        fp8, plain = write_fp8_pair(make_checkpoint(arch, tempfile.mkdtemp()), tempfile.mkdtemp(), block)
        rows = {}
        for mode, options in MODES.items():
            got, want = (generated(path, prompts, args.device, **options) for path in (fp8, plain))
            rows[mode] = {"identical": got == want, "tokens": sum(len(t) for t, _ in want)}
        result["fp8_vs_dequantized"][arch] = {"block": list(block), **rows}
        print(arch, result["fp8_vs_dequantized"][arch], flush=True)
        results_io.write(args.out, result)


if __name__ == "__main__":
    main()
