"""Two versions of `deltaserve bench serve`'s client against one server, alternated: what the client
itself costs a closed batch.

    python benchmarks/bench_client_ab.py qwen3.5-9b --base-client .base/deltaserve/bench/serve.py \
        --concurrency 32,128 --rounds 2 --out benchmarks/results/bench_client_ab.json

The server (server_bench.py's: random weights in the shape, prefix caching off) starts once; each round
runs, at each level, a warm-up batch and a measured one through the base client (the module file
given, loaded under its own name) and through this tree's, in turn (A B, then B A).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import results_io, server_bench  # noqa: E402
from benchmarks.shapes import write_shape  # noqa: E402
from deltaserve.bench import serve as this_client  # noqa: E402


def load_client(path: str):
    spec = importlib.util.spec_from_file_location("base_bench_serve", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--base-client", required=True, help="the other client's bench/serve.py")
    ap.add_argument("--concurrency", default="32,128")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    clients = [("base", load_client(args.base_client)), ("this", this_client)]
    result = {**results_io.header(), "shape": args.shape, "base_client": args.base_client, "rows": []}
    url = "http://127.0.0.1:8123"
    with tempfile.TemporaryDirectory() as scratch, open(os.path.join(scratch, "server.log"), "w+") as log:
        directory = write_shape(args.shape, os.path.join(scratch, "model"), every_id_a_word=True)
        server = server_bench.start_server(directory, 8123, max(levels), False, log)
        try:
            result["server_ready_s"] = round(server_bench.wait_until_ready(server, url, 900), 1)
            for round_ in range(1, args.rounds + 1):
                for name, client in clients if round_ % 2 else clients[::-1]:
                    for level in levels:
                        server_bench.one_batch(url, level, level + 7919, bench_client=client)  # warm-up
                        row = server_bench.one_batch(url, level, level, bench_client=client)
                        keep = ("concurrency", "requests_ok", "output_tok_s", "ttft_ms", "tpot_ms", "itl_ms")
                        result["rows"].append({"round": round_, "client": name, **{k: row[k] for k in keep}})
                        print(name, round_, level, round(row["output_tok_s"]), "ttft p50/p99",
                              round(row["ttft_ms"]["p50"]), round(row["ttft_ms"]["p99"]), "tpot",
                              round(row["tpot_ms"]["mean"], 2), flush=True)
                        results_io.write(args.out, result)
        finally:
            server_bench.stop_server(server, log, result, args.out, tail=1500)


if __name__ == "__main__":
    main()
