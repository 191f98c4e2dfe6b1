"""vLLM's scheduling policies as plain Python: under "priority" waiting requests are admitted by (priority,
arrival) and the running request preempted first is the one served last by that order; under "fcfs" (the
default) by arrival and the newest admitted. Pools are small, so that preemption happens."""

import random

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.slot_allocator import SlotAllocator
from deltaserve.cache.snapshot_index import SnapshotIndex
from deltaserve.engine.prefix_cache import PrefixCache
from deltaserve.engine.request import Request
from deltaserve.engine.scheduler import Scheduler
from deltaserve.engine.waiting_queue import PriorityQueue, served_before
from deltaserve.sampling_params import SamplingParams
from tests.test_prefix_cache_units import _step

BS = 4


def _scheduler(policy, num_blocks=64, max_seqs=4, budget=64, cached=False):
    blocks = BlockAllocator(num_blocks)
    cache = PrefixCache(blocks, SnapshotIndex(8), BS, 1024, BS) if cached else None
    return Scheduler(blocks, SlotAllocator(max_seqs), BS, max_seqs, budget, cache, policy=policy)


def _request(request_id, priority=0, prompt_len=BS, max_tokens=8, rng=None):
    rng = rng or random.Random()
    prompt = [rng.randrange(1000) for _ in range(prompt_len)]
    request = Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), max_tokens)
    request.priority = priority
    return request


def _ids(requests):
    return [r.request_id for r in requests]


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    rng = random.Random()
    sched = _scheduler("priority", max_seqs=1)
    requests = [_request(f"r{i}", rng.randint(-3, 3), max_tokens=1) for i in range(rng.randint(5, 9))]
    for r in requests:
        sched.add(r)
    admitted = []
    while sched.has_unfinished():
        admitted += _step(sched).admitted
    # a stable sort: among equal priorities the order of arrival stays
    assert _ids(admitted) == _ids(sorted(requests, key=lambda r: r.priority))


def test_fcfs_admits_by_arrival_whatever_the_priority():
    sched = _scheduler("fcfs", max_seqs=1)
    requests = [_request(f"r{i}", random.randint(-3, 3), max_tokens=1) for i in range(6)]
    for r in requests:
        sched.add(r)
    admitted = []
    while sched.has_unfinished():
        admitted += _step(sched).admitted
    assert _ids(admitted) == _ids(requests)


def test_the_priority_queue_serves_its_smallest_key_first_and_takes_removals():
    queue = PriorityQueue()
    requests = [_request(f"r{i}", random.randint(0, 2)) for i in range(8)]
    for arrival, r in enumerate(requests):
        r.arrival = arrival
    for r in random.sample(requests, len(requests)):
        queue.add(r)
    gone = random.choice(requests)
    queue.remove(gone)
    kept = sorted((r for r in requests if r is not gone), key=served_before)
    assert list(queue) == kept and queue.peek() is kept[0] and len(queue) == 7 and gone not in queue
    assert [queue.pop() for _ in range(7)] == kept and not queue


def _three_running(policy, priorities):
    """Three one-block prompts filling a pool of three blocks: each needs a second block for its first decode."""
    sched = _scheduler(policy, num_blocks=3)
    requests = [_request(name, p) for name, p in zip("abc", priorities)]
    for r in requests:
        sched.add(r)
    _step(sched)  # their prefills
    assert sorted(_ids(sched.running)) == ["a", "b", "c"] and sched.blocks.num_free == 0
    return sched, requests


def test_the_lowest_priority_is_preempted_not_the_newest():
    sched, (a, b, c) = _three_running("priority", [0, 5, 2])
    plan = _step(sched)
    # a needs a block: b (priority 5) goes; c then needs one and is the lowest left, so it goes itself
    assert _ids(plan.preempted) == ["b", "c"] and _ids(ch.request for ch in plan.chunks) == ["a"]
    assert not plan.admitted and _ids(sched.waiting) == ["c", "b"]  # by priority again, not preemption order
    assert b.num_computed_tokens == c.num_computed_tokens == 0 and b.state_slot is None and not b.block_ids
    assert sched.slots.num_used == 1 and sched.blocks.num_used == 2


def test_fcfs_preempts_the_newest():
    sched, _ = _three_running("fcfs", [0, 0, 0])
    plan = _step(sched)
    assert _ids(plan.preempted) == ["c", "b"] and _ids(ch.request for ch in plan.chunks) == ["a"]
    assert _ids(sched.waiting) == ["b", "c"]  # each to the front as it was preempted


def test_equal_priorities_preempt_the_latest_to_arrive():
    sched, _ = _three_running("priority", [1, 1, 1])
    plan = _step(sched)
    assert _ids(plan.preempted) == ["c", "b"]


def test_a_victim_planned_earlier_in_the_step_gives_back_its_place_and_tokens():
    """Running b (priority 9, decoding in its last block), a (0, decoding into a new block), c (1, prefilling),
    with the pool full: b is planned first, then preempted for a; c is still planned, with b's token back in the
    budget."""
    sched = _scheduler("priority", num_blocks=7, budget=12)
    b, a, c = _request("b", 9, prompt_len=15), _request("a", 0, prompt_len=BS), _request("c", 1, prompt_len=16)
    sched.add(b)
    _step(sched)  # b's first 12 tokens, 3 blocks
    sched.add(a)
    sched.add(c)
    _step(sched)  # b's last 3 (4 blocks), a's 4 (1 block), c's first 5 (2 blocks)
    assert _ids(sched.running) == ["b", "a", "c"] and sched.blocks.num_free == 0
    plan = _step(sched)
    assert _ids(plan.preempted) == ["b"]
    assert [(ch.request.request_id, ch.num_tokens) for ch in plan.chunks] == [("a", 1), ("c", 11)]
    assert sched.blocks.num_used == 2 + 4 and _ids(sched.waiting) == ["b"]


def _random_mix(policy, rng):
    """A tight pool, prefix caching on, requests of random priorities and lengths arriving over the run: every
    step's victims are the running requests served last (priority) or admitted last (fcfs), every admission the
    first waiting, and nothing stays held at the end."""
    sched = _scheduler(policy, num_blocks=rng.randint(10, 14), max_seqs=rng.randint(2, 4), budget=rng.randint(6, 24),
                       cached=True)
    shared = [rng.randrange(1000) for _ in range(BS * 2)]
    pending = []
    for i in range(rng.randint(8, 14)):
        r = _request(f"r{i}", rng.randint(0, 3) if policy == "priority" else 0, prompt_len=rng.randint(1, 14),
                     max_tokens=rng.randint(1, 12), rng=rng)
        if rng.random() < 0.4:  # some share a cached prefix
            r.prompt_token_ids = shared + r.prompt_token_ids
        pending.append(r)
    key = served_before if policy == "priority" else None
    steps = 0
    while pending or sched.has_unfinished():
        for _ in range(min(rng.randint(0, 2), len(pending))):
            sched.add(pending.pop(0))
        running, waiting = list(sched.running), list(sched.waiting)
        plan = _step(sched)
        steps += 1
        assert steps < 2000
        if key is not None:
            assert plan.preempted == sorted(running, key=key, reverse=True)[:len(plan.preempted)]
        else:
            assert plan.preempted == running[::-1][:len(plan.preempted)]
        assert not (plan.preempted and plan.admitted)
        assert plan.admitted == waiting[:len(plan.admitted)]
        for r in sched.running:
            assert r.state_slot is not None and all(sched.blocks.ref_counts[b] > 0 for b in r.block_ids)
        for r in sched.waiting:
            assert r.state_slot is None and not r.block_ids and not r.snapshot_refs
    assert sched.blocks.num_used == 0 and sched.slots.num_used == 0
    assert sched.prefix_cache.snapshots.num_referenced == 0
    return sched


def test_random_mixes_preempt_and_admit_in_policy_order_and_free_everything():
    rng = random.Random()
    for policy in ("priority", "fcfs"):
        preemptions = sum(_random_mix(policy, rng).num_preemptions for _ in range(6))
        assert preemptions > 0, policy
