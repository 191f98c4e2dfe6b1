"""CUDA events around each replay of one decode graph while the engine runs its own loop."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def replay_events(graph):
    """Yields (marks, late): marks gets (begin, end) events recorded just before and after each replay of
    `graph`; late gets, for each replay after the first, whether the previous replay had already ended
    on the GPU when this one was launched (the host fell behind)."""
    marks, late = [], []
    inner = graph.replay

    def replay():
        if marks:
            late.append(marks[-1][1].query())
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        inner()
        end.record()
        marks.append((begin, end))

    graph.replay = replay
    try:
        yield marks, late
    finally:
        del graph.replay
