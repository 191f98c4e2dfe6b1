"""Which Triton kernels compile after the server says it is ready, with an empty Triton cache.

    OUT=dir python benchmarks/jit_after_ready.py        (SHAPE=qwen3.5-9b LEVELS=32,128 by default)

The server runs with TRITON_CACHE_DIR set to a fresh directory, then serves server_bench.py's closed
batches (a warm-up and a measured one per level). Every kernel compiled lands in that directory; the
ones written after the server answered /health were compiled while it served, each stalling every
request in flight. Prints the batches (tok/s, the slowest time to first token) and those kernels, with
the time each was written and the batch it fell in, and the specialization each was compiled for (its
arguments' types, `/16` where Triton took an integer or pointer as a multiple of 16, and the tile sizes
its ranges span); OUT/jit_after_ready.json holds the same.
"""

import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks import results_io, server_bench  # noqa: E402
from benchmarks.shapes import write_shape  # noqa: E402


def serve_batches(shape: str, levels: list[int], log_path: str) -> list[tuple[str, float]]:
    """(what happened, when) marks: the server ready, then each batch's end."""
    marks = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_shape(shape, os.path.join(scratch, "model"), every_id_a_word=True)
        with open(log_path, "w+") as log:
            server = server_bench.start_server(directory, 8123, max(levels), False, log)
            try:
                server_bench.wait_until_ready(server, "http://127.0.0.1:8123", 900)
                marks.append(("ready", time.time()))
                for level in levels:
                    for kind in ("warm-up", "measured"):
                        seed = level + (7919 if kind == "warm-up" else 0)
                        r = server_bench.one_batch("http://127.0.0.1:8123", level, seed)
                        marks.append((f"C={level} {kind} {r['output_tok_s']:.0f} tok/s ttft p99 "
                                      f"{r['ttft_ms']['p99']:.0f}", time.time()))
            finally:
                server.terminate()
                server.wait(timeout=60)
    return marks


def compiled(cache: str) -> list[tuple[float, str, str]]:
    """(time written, kernel name, its specialization) of every kernel in a Triton cache directory."""
    entries = []
    for path in glob.glob(os.path.join(cache, "*", "*.json")):
        if os.path.basename(path).startswith("__grp__"):
            continue
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        name = meta.get("name", os.path.basename(path))
        entries.append((os.path.getmtime(path), name, specialization(os.path.join(os.path.dirname(path), name + ".ttir"))))
    return sorted(entries)


def specialization(ttir_path: str) -> str:
    """The kernel's arguments as `name:type` (`/16`: taken as a multiple of 16) and its ranges' lengths."""
    try:
        with open(ttir_path) as f:
            text = f.read()
    except OSError:
        return ""
    func = next((line for line in text.splitlines() if "tt.func public" in line), "")
    args = re.findall(r"%(\w+): ([^ ,{)]+)( \{tt.divisibility = 16)?", func)
    ranges = sorted({int(n) for n in re.findall(r"tt.make_range \{end = (\d+)", text)})
    return " ".join(f"{n}:{t}{'/16' if d else ''}" for n, t, d in args) + f" ranges={ranges}"


def main() -> None:
    cache = tempfile.mkdtemp(prefix="tcache")
    os.environ["TRITON_CACHE_DIR"] = cache  # the server inherits it
    levels = [int(x) for x in os.environ.get("LEVELS", "32,128").split(",")]
    marks = serve_batches(os.environ.get("SHAPE", "qwen3.5-9b"), levels,
                          os.path.join(os.environ["OUT"], "jit_server.log"))
    ready = marks[0][1]
    counts = collections.Counter()
    print("marks:", [(m[0], round(m[1] - ready, 1)) for m in marks])
    after = []
    for written, name, spec in compiled(cache):
        if written > ready:
            batch = next((m[0] for m in marks if written <= m[1]), "after")
            print(f"{written - ready:8.2f}s  {batch:45s} {name}\n          {spec}")
            after.append({"s_after_ready": round(written - ready, 2), "batch": batch, "kernel": name,
                          "specialization": spec})
        counts["before ready" if written <= ready else "after ready"] += 1
    print(dict(counts))
    results_io.write(os.path.join(os.environ["OUT"], "jit_after_ready.json"), {
        **results_io.header(), "shape": os.environ.get("SHAPE", "qwen3.5-9b"),
        "marks_s_after_ready": [(m[0], round(m[1] - ready, 2)) for m in marks],
        "kernels_compiled": dict(counts), "compiled_after_ready": after})


if __name__ == "__main__":
    main()
