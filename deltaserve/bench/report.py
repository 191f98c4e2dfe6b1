"""The benchmark report as a terminal table, and one level's figures as `vllm bench serve` prints them."""

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
        f"{report['model']} at {report['base_url']}: {_lengths(report)}, {report['num_prompts']} prompts per "
        "concurrency",
        "  ".join(h.rjust(w) for h, w in zip(header, widths)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    for r in report["results"]:
        for error in r.get("errors", []):
            lines.append(f"concurrency {r['concurrency']}: error: {error}")
    return "\n".join(lines)


def _lengths(report: dict) -> str:
    """What each request sent and asked for: "input 128 tokens, output 256 tokens", with the range ratios and
    the shared prefix where a run drew its lengths."""
    ratios = report.get("random_range_ratio") or {"input": 0, "output": 0}
    prefix = report.get("random_prefix_len") or 0
    spread = lambda r: f" (+/-{r:.0%})" if r else ""  # noqa: E731
    shared = f"{prefix} shared + " if prefix else ""
    return (f"input {shared}{report['input_len']}{spread(ratios['input'])} tokens, "
            f"output {report['output_len']}{spread(ratios['output'])} tokens")


_VLLM_SECTIONS = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                  "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}


def format_vllm_summary(row: dict, metrics=("ttft", "tpot", "itl"), percentiles=DEFAULT_PERCENTILES,
                        max_concurrency: int | None = None, request_rate: float | None = None) -> str:
    """One level's figures in the block that `vllm bench serve` prints, line for line where it has the figure
    (row: a level of the report, with its vLLM-named fields)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             "{:<40} {:<10}".format("Successful requests:", row["completed"]),
             "{:<40} {:<10}".format("Failed requests:", row["failed"])]
    if max_concurrency is not None:
        lines.append("{:<40} {:<10}".format("Maximum request concurrency:", max_concurrency))
    if request_rate is not None:
        lines.append("{:<40} {:<10.2f}".format("Request rate configured (RPS):", request_rate))
    lines += ["{:<40} {:<10.2f}".format("Benchmark duration (s):", row["duration"]),
              "{:<40} {:<10}".format("Total input tokens:", row["total_input_tokens"]),
              "{:<40} {:<10}".format("Total generated tokens:", row["total_output_tokens"]),
              "{:<40} {:<10.2f}".format("Request throughput (req/s):", row["request_throughput"]),
              "{:<40} {:<10.2f}".format("Output token throughput (tok/s):", row["output_throughput"]),
              "{:<40} {:<10.2f}".format("Total token throughput (tok/s):", row["total_token_throughput"])]
    for name in metrics:
        short, long = _VLLM_SECTIONS[name]
        lines.append("{s:{c}^{n}}".format(s=long, n=50, c="-"))
        lines.append("{:<40} {:<10.2f}".format(f"Mean {short} (ms):", row[f"mean_{name}_ms"]))
        lines.append("{:<40} {:<10.2f}".format(f"Median {short} (ms):", row[f"median_{name}_ms"]))
        for q in percentiles:
            lines.append("{:<40} {:<10.2f}".format(f"P{q:g} {short} (ms):", row[f"{percentile_key(q)}_{name}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)
