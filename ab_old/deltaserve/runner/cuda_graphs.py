"""Decode steps as CUDA graphs: captured once per rung of a ladder of batch sizes over StepBuffers,
then replayed after the step's metadata has been written into those buffers."""

from __future__ import annotations

import logging
import time

import torch

from deltaserve.models.decoder import DecoderLM
from deltaserve.runner.batch_builder import HostBatch
from deltaserve.runner.step_buffers import StepBuffers

log = logging.getLogger(__name__)

BASE_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def batch_size_ladder(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, then steps of 64, up to max_num_seqs."""
    sizes = [b for b in BASE_LADDER if b < max_num_seqs]
    size = 192
    while size < max_num_seqs:
        sizes.append(size)
        size += 64
    return sizes + [max_num_seqs]


def capture_graph(forward, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Runs `forward` twice (every kernel compiled and tuned outside the capture), then captures it
    into the memory pool `pool`; returns the graph and the output it writes at each replay."""
    for _ in range(2):
        forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    torch.cuda.synchronize()
    return graph, output


class DecodeGraphs:
    def __init__(self, model: DecoderLM, buffers: StepBuffers, max_num_seqs: int):
        self.model = model
        self.buffers = buffers
        self.sizes = batch_size_ladder(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def capture(self, pool) -> None:
        started, before = time.perf_counter(), torch.cuda.memory_allocated()
        empty = HostBatch([], [], [0], [], [], [], [], [])
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory
            self.buffers.load_decode(empty, size)
            batch = self.buffers.view(size)
            self.graphs[size], self.logits[size] = capture_graph(
                lambda: self.model.compute_logits(self.model(batch.input_ids, batch)), pool)
        log.info("captured %d decode graphs (batch %d..%d) in %.1f s using %.0f MiB", len(self.sizes), self.sizes[0],
                 self.sizes[-1], time.perf_counter() - started, (torch.cuda.memory_allocated() - before) / 2**20)

    def rung(self, batch: int) -> int | None:
        return next((s for s in self.sizes if s >= batch), None)

    def run(self, host: HostBatch, fill_inputs=None) -> torch.Tensor:
        """Replays the graph of the smallest rung that fits; returns the logits of the real rows.
        fill_inputs(input_ids), when given, completes the input ids on the device before the replay."""
        n = len(host.input_ids)
        size = self.rung(n)
        self.buffers.load_decode(host, size)
        if fill_inputs is not None:
            fill_inputs(self.buffers.input_ids[:n])
        self.graphs[size].replay()
        return self.logits[size][:n]
