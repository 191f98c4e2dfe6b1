"""What one level of `bench serve` sends: prompts of random token ids and the output length each asks for.

As `vllm bench serve`'s random dataset draws them: with a range ratio r in [0, 1) a length L becomes a draw
from the integers in [floor(L (1 - r)), ceil(L (1 + r))] (outputs at least 1), one r for both or
{"input": r1, "output": r2}; every prompt opens with the same `prefix_len` random ids, the rest its own.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass


class WorkloadError(ValueError):
    """Lengths or ratios that leave no request to send."""


@dataclass(frozen=True)
class BenchRequest:
    prompt: list[int]
    output_len: int


def parse_range_ratio(text: str | float) -> tuple[float, float]:
    """(input, output) ratios of a --random-range-ratio: a number for both, or a JSON object of the two."""
    try:
        ratios = (float(text),) * 2
    except (TypeError, ValueError):
        try:
            value = json.loads(text)
            ratios = (float(value["input"]), float(value["output"]))
        except (ValueError, TypeError, KeyError):
            raise WorkloadError(f"--random-range-ratio {text}: a number, or a JSON object with 'input' and "
                                "'output' numbers") from None
    if not all(0 <= r < 1 for r in ratios):
        raise WorkloadError(f"--random-range-ratio {text}: each ratio must be in [0, 1)")
    return ratios


def length_range(length: int, ratio: float, at_least: int = 0) -> tuple[int, int]:
    """The lengths a draw around `length` may take (both ends included)."""
    low, high = math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))
    return max(low, at_least), max(high, at_least)


def check_workload(input_len: int, output_len: int, ratios: tuple[float, float], prefix_len: int) -> None:
    if prefix_len < 0 or input_len < 0 or output_len < 1:
        raise WorkloadError("--random-input-len and --random-prefix-len must be at least 0, --random-output-len "
                            "at least 1")
    if prefix_len + length_range(input_len, ratios[0])[0] < 1:
        raise WorkloadError(f"--random-input-len {input_len}: with --random-prefix-len {prefix_len} and input range "
                            f"ratio {ratios[0]:g} a prompt could have no token")


def make_requests(n: int, input_len: int, output_len: int, ratios: tuple[float, float], prefix_len: int,
                  low: int, high: int, seed: int) -> list[BenchRequest]:
    """n requests drawn from one seeded stream: token ids uniform in [low, high)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(low, high) for _ in range(prefix_len)]
    inputs, outputs = length_range(input_len, ratios[0]), length_range(output_len, ratios[1], at_least=1)
    requests = []
    for _ in range(n):
        own = rng.randint(*inputs)
        requests.append(BenchRequest(prefix + [rng.randrange(low, high) for _ in range(own)], rng.randint(*outputs)))
    return requests
