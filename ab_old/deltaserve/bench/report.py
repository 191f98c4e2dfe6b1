"""The benchmark report as a terminal table."""

from __future__ import annotations


def _ms(dist: dict, key: str) -> str:
    value = dist.get(key)
    return "-" if value is None else f"{value:.1f}"


def _triple(dist: dict) -> str:
    return "/".join(_ms(dist, k) for k in ("p50", "p90", "p99"))


def format_table(report: dict) -> str:
    header = ["conc", "ok", "failed", "out tok/s", "total tok/s", "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99",
              "ITL ms p50/p90/p99"]
    rows = [
        [
            str(r["concurrency"]),
            str(r["requests_ok"]),
            str(r["requests_failed"]),
            f"{r['output_tok_s']:.1f}",
            f"{r['total_tok_s']:.1f}",
            _triple(r["ttft_ms"]),
            _triple(r["tpot_ms"]),
            _triple(r["itl_ms"]),
        ]
        for r in report["results"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        f"{report['model']} at {report['base_url']}: input {report['input_len']} tokens, "
        f"output {report['output_len']} tokens, {report['num_prompts']} prompts per concurrency",
        "  ".join(h.rjust(w) for h, w in zip(header, widths)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    for r in report["results"]:
        for error in r.get("errors", []):
            lines.append(f"concurrency {r['concurrency']}: error: {error}")
    return "\n".join(lines)
