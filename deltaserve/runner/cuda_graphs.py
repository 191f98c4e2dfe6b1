"""Decode steps as CUDA graphs: captured once per rung of a ladder of batch sizes over StepBuffers,
then replayed after the step's metadata has been written into those buffers.

A graph starts by completing its inputs on the device (StepBuffers.unpack_decode) and ends by writing
each row's greedy token (the argmax of its logits, as the sampler takes it) into the buffers'
`sampled_tokens`: a greedy step needs nothing launched around its graph but the copies of its metadata
in and its tokens out, and the next step reads its pending input ids from there. Rows that sample
otherwise take the logits, the argmax unused, and their tokens are copied into `sampled_tokens`."""

from __future__ import annotations

import logging
import time

import torch

from deltaserve import kernels
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


def capture_graph(forward, pool, keep_graph: bool = False) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Runs `forward` twice (every kernel compiled and tuned outside the capture), then captures it
    into the memory pool `pool`; returns the graph and the output it writes at each replay. With
    `keep_graph` the graph also keeps its template, for tools that read its nodes and edges."""
    for _ in range(2):
        forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    if keep_graph:
        graph.instantiate()
    torch.cuda.synchronize()
    return graph, output


class DecodeGraphs:
    def __init__(self, model: DecoderLM, buffers: StepBuffers, max_num_seqs: int, vocab_size: int):
        self.model = model
        self.buffers = buffers
        self.vocab_size = vocab_size  # the logits' columns the sampler reads
        self.sizes = batch_size_ladder(max_num_seqs)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def capture(self, pool) -> None:
        started, before = time.perf_counter(), torch.cuda.memory_allocated()
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory
            self.graphs[size], self.logits[size] = self.capture_size(size, pool)
        log.info("captured %d decode graphs (batch %d..%d) in %.1f s using %.0f MiB", len(self.sizes), self.sizes[0],
                 self.sizes[-1], time.perf_counter() - started, (torch.cuda.memory_allocated() - before) / 2**20)

    def capture_size(self, size: int, pool, keep_graph: bool = False) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The decode step of `size` rows captured over the buffers, loaded with an empty batch first."""
        self.buffers.load_decode(HostBatch([], [], [0], [], [], [], [], []), size)
        return capture_graph(lambda: self._forward(size), pool, keep_graph)

    def rung(self, batch: int) -> int | None:
        return next((s for s in self.sizes if s >= batch), None)

    def _forward(self, size: int) -> torch.Tensor:
        self.buffers.unpack_decode(size)
        batch = self.buffers.view(size)
        logits = self.model.compute_logits(self.model(batch.input_ids, batch))
        kernels.greedy_tokens(logits[:, : self.vocab_size], self.buffers.sampled_tokens[:size])
        return logits

    def run(self, host: HostBatch, token_sources: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Replays the graph of the smallest rung that fits; returns the logits of the real rows and their
        greedy tokens (a view of the buffers' sampled_tokens, until the next replay). token_sources[r] >= 0:
        row r's input id is sampled_tokens[that row] as the step before left it. Without a captured graph
        (CPU) the same padded step runs eagerly."""
        n = len(host.input_ids)
        size = self.rung(n)
        self.buffers.load_decode(host, size, token_sources)
        if size in self.graphs:
            self.graphs[size].replay()
            logits = self.logits[size]
        else:
            logits = self._forward(size)
        return logits[:n], self.buffers.sampled_tokens[:n]
