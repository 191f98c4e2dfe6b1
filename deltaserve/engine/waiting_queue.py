"""The scheduler's queue of waiting requests, in the order they are admitted: by arrival (fcfs), or by priority
and then arrival (priority), as vLLM's scheduling policies order them. Pure Python."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kept light: the command line reads SCHEDULING_POLICIES before anything loads
    from deltaserve.engine.request import Request

SCHEDULING_POLICIES = ("fcfs", "priority")


def served_before(request: Request) -> tuple[int, int]:
    """The key the priority policy serves requests by, smallest first: a lower priority value, then an earlier
    arrival (vLLM's)."""
    return request.priority, request.arrival


class _Queue:
    """What both orders share: membership, length, removal (an aborted request) and iteration in order."""

    _requests: deque[Request] | list[Request]

    def remove(self, request: Request) -> None:
        self._requests.remove(request)

    def __contains__(self, request: Request) -> bool:
        return request in self._requests

    def __len__(self) -> int:
        return len(self._requests)


class FcfsQueue(_Queue):
    """First come, first served; a preempted request goes back to the front, to be the first recomputed."""

    def __init__(self) -> None:
        self._requests: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._requests.append(request)

    def requeue(self, request: Request) -> None:
        self._requests.appendleft(request)

    def peek(self) -> Request:
        return self._requests[0]

    def pop(self) -> Request:
        return self._requests.popleft()

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)


class PriorityQueue(_Queue):
    """By `served_before`; a preempted request takes its place by its key again, as vLLM's priority queue has no
    front. Kept sorted with the first served at the end, so that admitting it is a pop from the list's end."""

    def __init__(self) -> None:
        self._requests: list[Request] = []  # the last is served first

    def add(self, request: Request) -> None:
        bisect.insort(self._requests, request, key=_served_last)

    requeue = add

    def peek(self) -> Request:
        return self._requests[-1]

    def pop(self) -> Request:
        return self._requests.pop()

    def __iter__(self) -> Iterator[Request]:
        return reversed(self._requests)


def _served_last(request: Request) -> tuple[int, int]:
    return -request.priority, -request.arrival


def waiting_queue(policy: str) -> FcfsQueue | PriorityQueue:
    if policy == "priority":
        return PriorityQueue()
    if policy == "fcfs":
        return FcfsQueue()
    raise ValueError(f"scheduling policy {policy!r}: give one of {', '.join(SCHEDULING_POLICIES)}")
