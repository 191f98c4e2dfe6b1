"""A long chunked-GDN pass in segments of chunks, its three kernels overlapped on three streams.

The state kernel walks each sequence's chunks in order: on one or two long prompts it runs a few
programs a head, one chunk after another, and leaves most of the GPU idle, while the prepare and output
kernels, all chunks at once, fill it. Cut into segments of consecutive chunks, the state kernel can start
on the first segment as soon as that segment is prepared, and the output of a segment can run as soon as
its states are known:

    prepare stream (the caller's):  P1 P2 P3 P4
    state stream (high priority):      S1 S2 S3 S4
    output stream:                        O1 O2 O3 O4

Each segment's state launch reads the state the last one wrote to the slot, in fp32, so the pass gives
the same bytes in any number of segments. The state stream has the higher priority: its programs are
the pass's critical path, and they take a multiprocessor as soon as a prepare program leaves one.
"""

from __future__ import annotations

from typing import Callable

import torch

Launch = Callable[[int, int], None]  # the kernel over global chunks [begin, end)

_streams: dict[tuple[int, str], torch.cuda.Stream] = {}


def segment_bounds(chunks: int, segments: int) -> list[tuple[int, int]]:
    """[begin, end) of `segments` runs of consecutive chunks as even as can be, covering 0..chunks."""
    segments = max(1, min(segments, chunks))
    edges = [chunks * i // segments for i in range(segments + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _stream(device: torch.device, role: str) -> torch.cuda.Stream:
    key = (device.index if device.index is not None else torch.cuda.current_device(), role)
    if key not in _streams:
        _streams[key] = torch.cuda.Stream(device, priority=-1 if role == "state" else 0)
    return _streams[key]


def run_segments(bounds: list[tuple[int, int]], prepare: Launch, state: Launch, output: Launch | None,
                 device: torch.device) -> None:
    """Every segment through prepare, state and output (None: the state kernel writes the output). On the
    GPU with more than one segment the three run on their own streams, each segment's kernels after the
    ones before them in the segment; the caller's stream waits for all of them before it goes on."""
    if device.type != "cuda" or len(bounds) == 1:
        for begin, end in bounds:
            prepare(begin, end)
            state(begin, end)
            if output is not None:
                output(begin, end)
        return
    main = torch.cuda.current_stream(device)
    state_stream, output_stream = _stream(device, "state"), _stream(device, "output")
    prepared = []
    for begin, end in bounds:
        prepare(begin, end)
        prepared.append(main.record_event())
    for (begin, end), ready in zip(bounds, prepared):
        state_stream.wait_event(ready)
        with torch.cuda.stream(state_stream):
            state(begin, end)
        if output is not None:
            output_stream.wait_event(state_stream.record_event())
            with torch.cuda.stream(output_stream):
                output(begin, end)
    main.wait_stream(state_stream)
    if output is not None:
        main.wait_stream(output_stream)
