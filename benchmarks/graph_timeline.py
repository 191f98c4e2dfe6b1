"""Where a CUDA graph's replay spends its time between kernels: a CUPTI trace of a few replays, kernel by
kernel in the graph's order, with each kernel's duration and the gap from its end to the next one's start
(negative where programmatic dependent launch let the next one start early)."""

from __future__ import annotations

import torch


def replay_ms(graph: torch.cuda.CUDAGraph, replays: int = 200) -> float:
    """Device ms per replay, replayed back to back with nothing else launched: the graph's own GPU time."""
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def replay_us(graph: torch.cuda.CUDAGraph) -> float:
    """replay_ms in us, to 0.01."""
    return round(replay_ms(graph) * 1000, 2)


def graph_boundaries(graph: torch.cuda.CUDAGraph, replays: int = 5) -> list[dict]:
    """One row per kernel (or copy) of the graph, in order: name, mean duration and mean gap to the next
    one over `replays` replays, in us. The gap after the last kernel is to the next replay's first."""
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    spans = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                    if e.device_type.name == "CUDA"), key=lambda s: s[1])
    per_replay = len(spans) // replays
    assert per_replay * replays == len(spans), (len(spans), replays)
    rows = []
    for i in range(per_replay):
        runs = [spans[r * per_replay + i] for r in range(replays)]
        nexts = [spans[r * per_replay + i + 1] for r in range(replays) if r * per_replay + i + 1 < len(spans)]
        rows.append({"name": runs[0][0][:100], "us": round(sum(e - s for _, s, e in runs) / replays, 3),
                     "gap_us": round(sum(n[1] - r[2] for r, n in zip(runs, nexts)) / max(1, len(nexts)), 3)})
    return rows


def library(kernel_name: str) -> str:
    """cuBLAS's GEMMs, deltaserve's Triton kernels (named _*_kernel), or anything else (torch, copies)."""
    if kernel_name.startswith(("nvjet", "sm90_", "cutlass")):
        return "cublas"
    return "triton" if kernel_name.startswith("_") else "other"


def gaps_by_kind(rows: list[dict]) -> dict:
    """Boundaries grouped by the libraries on their two sides: how many, and their mean gap in us."""
    gaps: dict[str, list[float]] = {}
    for a, b in zip(rows, rows[1:]):
        gaps.setdefault(f"{library(a['name'])}->{library(b['name'])}", []).append(a["gap_us"])
    return {k: {"boundaries": len(v), "mean_gap_us": round(sum(v) / len(v), 3)} for k, v in sorted(gaps.items())}


def effective_by_pair(rows: list[dict]) -> list[dict]:
    """What each kernel adds to the replay, end to end: its end minus the end of the kernel before it. A
    kernel launched early is timed from its launch, waiting included, so its own duration says little; this
    is its share of the step. Grouped by (kernel before, kernel), largest total first, in us."""
    pairs: dict[tuple[str, str], list[float]] = {}
    for before, kernel in zip(rows, rows[1:]):
        pairs.setdefault((before["name"][:40], kernel["name"][:40]), []).append(before["gap_us"] + kernel["us"])
    return [{"after": a, "kernel": k, "count": len(v), "total_us": round(sum(v), 2),
             "mean_us": round(sum(v) / len(v), 3), "min_us": round(min(v), 3), "max_us": round(max(v), 3)}
            for (a, k), v in sorted(pairs.items(), key=lambda kv: -sum(kv[1]))]


def gap_changes(before: list[dict], after: list[dict], top: int = 20) -> dict:
    """The same graph's boundaries traced twice: totals, and the boundaries whose gap grew most."""
    assert [r["name"] for r in before] == [r["name"] for r in after], "not the same graph"
    changed = sorted(range(len(before)), key=lambda i: -(after[i]["gap_us"] - before[i]["gap_us"]))
    names = [r["name"] for r in before]
    return {
        "kernels": len(before),
        "kernel_us": [round(sum(r["us"] for r in rows), 2) for rows in (before, after)],
        "gap_us": [round(sum(r["gap_us"] for r in rows[:-1]), 2) for rows in (before, after)],
        "by_kind": [gaps_by_kind(rows) for rows in (before, after)],
        "largest_gap_growth": [{"at": i, "kernel": names[i][:60], "next": names[(i + 1) % len(names)][:60],
                                "gap_us": [before[i]["gap_us"], after[i]["gap_us"]],
                                "kernel_us": [before[i]["us"], after[i]["us"]]} for i in changed[:top]],
    }
