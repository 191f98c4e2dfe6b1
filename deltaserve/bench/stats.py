"""Per-request measurements of a serving benchmark and their summary per concurrency."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    latency: float = 0.0  # seconds from sending to the last byte
    ttft: float | None = None  # seconds to the first streamed token
    itls: list[float] = field(default_factory=list)  # gaps between streamed token chunks
    error: str | None = None
    sent_prompt_tokens: int | None = None  # the prompt's length as sent (None: the level's input length)
    asked_output_tokens: int | None = None  # the output length it asked for (None: the level's)

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default does."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


DEFAULT_PERCENTILES = (50, 90, 99)


def percentile_key(q: float) -> str:
    return f"p{q:g}"


def distribution_ms(values_s: list[float], percentiles=DEFAULT_PERCENTILES) -> dict[str, float | None]:
    values = [v * 1000.0 for v in values_s]
    return {"mean": sum(values) / len(values) if values else None,
            **{percentile_key(q): percentile(values, q) for q in percentiles}}


def summarize(concurrency: int, results: list[RequestResult], duration: float, expected_output_len: int,
              expected_input_len: int | None = None, percentiles=DEFAULT_PERCENTILES) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    errors = sorted({r.error for r in results if not r.ok and r.error})
    return {
        "concurrency": concurrency,
        "requests_ok": len(ok),
        "requests_failed": len(results) - len(ok),
        "duration_s": duration,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration if duration > 0 else 0.0,
        "total_tok_s": (output_tokens + prompt_tokens) / duration if duration > 0 else 0.0,
        "request_s": len(ok) / duration if duration > 0 else 0.0,
        "output_len_mismatches": sum(1 for r in ok if r.output_tokens != _asked(r.asked_output_tokens,
                                                                                  expected_output_len)),
        "input_len_mismatches": sum(1 for r in ok if _asked(r.sent_prompt_tokens, expected_input_len)
                                    not in (None, r.prompt_tokens)),
        **{f"{ours}_ms": distribution_ms(values, percentiles)
           for ours, values in zip(("ttft", "tpot", "itl", "e2e"), latencies(ok).values())},
        "errors": errors[:10],
        **vllm_fields(results, duration, percentiles),
    }


def latencies(ok: list[RequestResult]) -> dict[str, list[float]]:
    """The successful requests' seconds by vLLM's metric name: ttft, tpot, itl (every gap) and e2el."""
    return {"ttft": [r.ttft for r in ok if r.ttft is not None], "tpot": [r.tpot for r in ok if r.tpot is not None],
            "itl": [gap for r in ok for gap in r.itls], "e2el": [r.latency for r in ok]}


def _asked(own: int | None, level: int | None) -> int | None:
    return own if own is not None else level


def vllm_fields(results: list[RequestResult], duration: float, percentiles=DEFAULT_PERCENTILES) -> dict:
    """The same figures under the names of `vllm bench serve`'s result file, for the scripts that read it:
    counts, throughputs, and mean / median / std / each percentile of ttft, tpot, itl and e2el in ms."""
    ok = [r for r in results if r.ok]
    total_in, total_out = sum(r.prompt_tokens for r in ok), sum(r.output_tokens for r in ok)
    per_second = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    fields = {"duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
              "total_input_tokens": total_in, "total_output_tokens": total_out,
              "request_throughput": per_second(len(ok)), "output_throughput": per_second(total_out),
              "total_token_throughput": per_second(total_in + total_out)}
    for name, values in latencies(ok).items():
        ms = [v * 1000.0 for v in values]
        mean = sum(ms) / len(ms) if ms else 0.0
        fields[f"mean_{name}_ms"] = mean
        fields[f"median_{name}_ms"] = percentile(ms, 50) or 0.0
        fields[f"std_{name}_ms"] = math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms)) if ms else 0.0
        for q in percentiles:
            fields[f"{percentile_key(q)}_{name}_ms"] = percentile(ms, q) or 0.0
    return fields
