"""The benchmark report as a terminal table."""

from __future__ import annotations

from deltaserve.bench.stats import DEFAULT_PERCENTILES, percentile_key

COLUMNS = {"ttft": ("TTFT", "ttft_ms"), "tpot": ("TPOT", "tpot_ms"), "itl": ("ITL", "itl_ms"),
           "e2el": ("E2EL", "e2e_ms")}  # vLLM's metric names -> heading, the report's key


def _ms(dist: dict, key: str) -> str:
    value = dist.get(key)
    return "-" if value is None else f"{value:.1f}"


def format_table(report: dict, metrics=("ttft", "tpot", "itl")) -> str:
    percentiles = report.get("percentiles") or DEFAULT_PERCENTILES
    keys = [percentile_key(q) for q in percentiles]
    named = "/".join(keys)
    header = ["conc", "ok", "failed", "out tok/s", "total tok/s"]
    header += [f"{COLUMNS[m][0]} ms {named}" for m in metrics]
    rows = [
        [str(r["concurrency"]), str(r["requests_ok"]), str(r["requests_failed"]), f"{r['output_tok_s']:.1f}",
         f"{r['total_tok_s']:.1f}"]
        + ["/".join(_ms(r[COLUMNS[m][1]], k) for k in keys) for m in metrics]
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
