"""Prefix cache bookkeeping as plain Python: the hash chain, shared KV blocks with LRU eviction, the
snapshot index, and what the scheduler plans (restores, capture points, the replay-point cut)."""

import random
from array import array

import pytest

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.block_hash import chain_hashes, chain_hashes_of_bytes, hash_block
from deltaserve.cache.slot_allocator import SlotAllocator
from deltaserve.cache.snapshot_index import SnapshotIndex
from deltaserve.engine.prefix_cache import PrefixCache
from deltaserve.engine.request import Request
from deltaserve.engine.scheduler import Scheduler
from deltaserve.sampling_params import SamplingParams

BS = 4


# -- hash chain -----------------------------------------------------------------------------------
def test_hash_chain_names_whole_prefixes():
    rng = random.Random()
    tokens = [rng.randrange(1000) for _ in range(23)]
    hashes = chain_hashes(tokens, BS)
    assert len(hashes) == 5  # the partial last block has no name
    assert len(set(hashes)) == 5
    assert chain_hashes(tokens[:20] + [1, 2], BS) == hashes
    changed = list(tokens)
    changed[9] += 1  # block 2
    other = chain_hashes(changed, BS)
    assert other[:2] == hashes[:2] and all(a != b for a, b in zip(other[2:], hashes[2:]))
    # the same block contents after a different prefix get a different name
    assert hash_block(hashes[0], tokens[4:8]) == hashes[1] != hash_block(None, tokens[4:8])
    # a chain continued from a named block names the blocks after it as the whole chain does
    assert chain_hashes(tokens[8:], BS, hashes[1]) == hashes[2:]


def test_a_request_hands_the_cache_its_token_ids_as_bytes_across_prompt_and_output():
    rng = random.Random()
    prompt = [rng.randrange(1000) for _ in range(13)]
    given = Request("r", prompt, SamplingParams(), 10, prompt_bytes=array("q", prompt).tobytes())
    bare = Request("s", prompt, SamplingParams(), 10)
    for request in (given, bare):
        request.output_token_ids += [7, 8, 9]
        for start, end in ((0, 12), (4, 13), (8, 16), (13, 15)):
            assert request.token_bytes(start, end) == array("q", request.token_ids_slice(start, end)).tobytes()
    assert chain_hashes_of_bytes(given.token_bytes(0, 16), BS) == chain_hashes(prompt + [7, 8, 9], BS)


# -- shared blocks --------------------------------------------------------------------------------
def test_registered_blocks_are_shared_then_cached_then_evicted_lru_tail_first():
    blocks = BlockAllocator(6)
    names = chain_hashes(list(range(12)), BS)
    a = blocks.allocate(3)
    for b, h in zip(a, names):
        blocks.register(b, h)
    assert blocks.cached_prefix(names) == a and blocks.cached_prefix([hash_block(None, [5])] + names[1:]) == []
    blocks.incref(a[:2])  # a second sequence shares the first two
    assert blocks.ref_counts[a[0]] == 2
    blocks.free(reversed(a))
    blocks.free(reversed(a[:2]))
    assert blocks.num_used == 0 and blocks.num_free == 6 and blocks.num_cached == 3
    assert blocks.cached_prefix(names) == a  # still cached
    fresh = blocks.allocate(3)  # never-registered blocks go first
    assert set(fresh).isdisjoint(a) and blocks.num_cached == 3 and blocks.num_evictions == 0
    blocks.allocate(1)  # now the least recently freed cached block, the tail, is evicted
    assert blocks.num_evictions == 1 and blocks.cached_prefix(names) == a[:2]
    blocks.incref([a[0]])  # a hit takes a cached block back out of the LRU
    blocks.allocate(1)
    assert blocks.cached_prefix(names) == a[:1]
    with pytest.raises(MemoryError):
        blocks.allocate(1)


def test_the_newest_copy_of_a_block_keeps_the_name_and_reset_forgets_everything():
    blocks = BlockAllocator(4)
    name = hash_block(None, [1, 2, 3, 4])
    first = blocks.allocate(1)[0]
    blocks.register(first, name)
    blocks.free([first])
    second = blocks.allocate(1)[0]  # the same contents computed again while the first copy waits in the LRU
    blocks.register(second, name)
    assert blocks.cached_prefix([name]) == [second] and blocks.num_cached == 1
    rest = blocks.allocate(3)  # the old copy is a plain free block now: taken without evicting
    assert first in rest and blocks.num_evictions == 0 and blocks.num_cached == 1
    blocks.free(rest + [second])
    assert blocks.num_cached == 1 and blocks.num_free == 4
    blocks.reset_cache()
    assert blocks.num_cached == 0 and blocks.cached_prefix([name]) == [] and blocks.num_free == 4
    with pytest.raises(ValueError):
        blocks.incref([first])  # free and uncached: nothing to share


# -- snapshot index -------------------------------------------------------------------------------
def test_snapshot_index_lru_and_references():
    index = SnapshotIndex(2)
    names = [hash_block(None, [i]) for i in range(4)]
    s0 = index.reserve()
    assert index.find(names[0]) is None  # pending until committed
    index.commit(s0, names[0])
    s1 = index.reserve()
    index.commit(s1, names[1])
    assert index.find(names[0]) == s0 and index.num_used == 2
    index.acquire(s0)  # a restore in flight pins it
    s2 = index.reserve()  # evicts the LRU unpinned one: names[1]
    assert s2 == s1 and index.find(names[1]) is None and index.num_evictions == 1
    assert index.reserve() is None  # one pinned, one pending
    index.cancel(s2)
    index.release(s0)
    assert index.num_referenced == 0 and index.find(names[0]) == s0
    s3 = index.reserve()  # the freed slot first
    assert s3 == s2
    index.commit(s3, names[0])  # a duplicate of a ready snapshot: the slot goes back
    assert index.find(names[0]) == s0 and index.num_used == 1


def test_snapshot_index_demote_and_clear():
    index = SnapshotIndex(3)
    names = [hash_block(None, [i]) for i in range(4)]
    for name in names[:3]:
        index.commit(index.reserve(), name)
    index.demote(names[2])
    index.reserve()  # evicts the demoted one, not the oldest
    assert index.find(names[2]) is None and index.find(names[0]) is not None
    index.acquire(index.find(names[1]))
    index.clear()
    assert index.find(names[0]) is None and index.find(names[1]) is not None


def test_snapshot_index_promote_makes_a_snapshot_the_last_to_evict():
    index = SnapshotIndex(3)
    names = [hash_block(None, [i]) for i in range(3)]
    for name in names:
        index.commit(index.reserve(), name)
    index.promote(names[0])  # the oldest becomes the newest
    index.reserve()
    index.reserve()
    assert index.find(names[0]) is not None and index.find(names[1]) is None and index.find(names[2]) is None
    index.promote(hash_block(None, [9]))  # nothing of that name: nothing happens


# -- scheduler planning ---------------------------------------------------------------------------
def _scheduler(num_blocks=64, snapshot_slots=16, budget=64, hybrid=True, interval=1024, max_seqs=4,
               decode_interval=BS):
    blocks = BlockAllocator(num_blocks)
    cache = PrefixCache(blocks, SnapshotIndex(snapshot_slots) if hybrid else None, BS, interval, decode_interval)
    return Scheduler(blocks, SlotAllocator(max_seqs) if hybrid else None, BS, max_seqs, budget, cache)


def _request(tokens, request_id="r", max_tokens=3, capture_points=()):
    return Request(request_id, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens,
                   capture_points=list(capture_points))


def _step(sched):
    """One step as the engine runs it, with token 7 sampled for every sampling chunk."""
    plan = sched.schedule()
    for chunk in plan.chunks:
        chunk.request.num_computed_tokens = chunk.end
    sched.step_done(plan)
    for chunk in plan.chunks:
        if chunk.samples:
            chunk.request.output_token_ids.append(7)
            if len(chunk.request.output_token_ids) >= chunk.request.max_tokens:
                sched.finish(chunk.request, "length")
    return plan


def _run(sched, request):
    sched.add(request)
    plans = []
    while sched.has_unfinished():
        plans.append(_step(sched))
    return plans


def _captures(plan):
    return sorted((c.position, c.at_chunk_end) for c in plan.captures)


def test_cold_prefill_stops_at_the_replay_point_and_captures_there_and_mid_chunk():
    sched = _scheduler()
    prompt = list(range(100, 130))  # 30 tokens: replay point 28
    plans = _run(sched, _request(prompt, capture_points=[0, 9, 29]))
    first, second = plans[0], plans[1]
    assert [(c.start, c.num_tokens) for c in first.chunks] == [(0, 28)]
    assert first.reset_state_slots and not first.restores
    # 28: replay point (the pass end), 24: one block before, 8: message at 9 floored; 0 is nothing to save
    assert _captures(first) == [(8, False), (24, False), (28, True)]
    assert [(c.start, c.num_tokens) for c in second.chunks] == [(28, 2)]
    # decode: 30 -> 31 -> 32 reaches a block boundary after the prompt
    assert [_captures(p) for p in plans[2:]] == [[], [(32, True)]]
    assert sched.prefix_cache.snapshots.num_ready == 4 and sched.prefix_cache.snapshots.num_referenced == 0
    assert sched.blocks.num_used == 0 and sched.blocks.num_cached == 8  # [0, 32) full blocks


def test_budget_cuts_put_capture_points_mid_chunk_and_at_chunk_edges():
    sched = _scheduler(budget=10)
    prompt = list(range(200, 238))  # 38 tokens: replay point 36, one block before 32
    plans = _run(sched, _request(prompt, capture_points=[10, 21]))
    chunks = [(c.start, c.end) for p in plans for c in p.chunks]
    assert chunks[:5] == [(0, 10), (10, 20), (20, 30), (30, 36), (36, 38)]
    captured = [_captures(p) for p in plans[:5]]
    # 8 mid-chunk; 20 at a chunk edge; 32 mid-chunk; 36 at the cut
    assert captured == [[(8, False)], [(20, True)], [], [(32, False), (36, True)], []]


def test_same_prompt_again_restores_at_the_replay_point_sharing_blocks():
    sched = _scheduler()
    prompt = list(range(300, 330))
    cold = _request(prompt, "cold")
    _run(sched, cold)
    warm = _request(prompt, "warm")
    sched.add(warm)
    plan = _step(sched)
    assert [(c.start, c.num_tokens) for c in plan.chunks] == [(28, 2)]
    assert warm.num_cached_tokens == 28 and not plan.reset_state_slots
    (restore,) = plan.restores
    assert restore.request is warm
    assert restore.snapshot_slot == sched.prefix_cache.snapshots.find(chain_hashes(prompt, BS)[6])
    assert sched.blocks.num_used == len(warm.block_ids) == 8  # 7 shared + 1 new
    assert sched.prefix_cache.snapshots.num_referenced == 0  # the restore is done
    stats = sched.stats()
    assert stats["prefix_cache_queries"] == 60 and stats["prefix_cache_hits"] == 28


def test_a_diverging_request_restores_from_the_furthest_snapshot_inside_its_cached_run():
    sched = _scheduler()
    shared = list(range(400, 420))
    _run(sched, _request(shared + list(range(10)), capture_points=[0, 13, 22]))  # snapshots 12, 20, 24, 28, 32
    other = _request(shared + [999] * 10, "other")
    sched.add(other)
    plan = _step(sched)
    assert other.num_cached_tokens == 20  # 5 shared blocks, and the snapshot at 20
    assert plan.chunks[0].start == 20 and len(plan.restores) == 1


def _unaligned_prompt(rng, low, high, max_tokens):
    """Random ids whose request ends inside a block: prompt plus all its output tokens but the last."""
    while True:
        prompt = [rng.randrange(1000) for _ in range(rng.randint(low, high))]
        if (len(prompt) + max_tokens - 1) % BS:
            return prompt


def test_a_follow_up_turn_restores_from_the_tail_of_the_turn_before_in_one_pass():
    sched = _scheduler(budget=256)
    rng = random.Random()
    first = _unaligned_prompt(rng, 30, 40, 6)
    _run(sched, _request(first, "turn1", max_tokens=6))
    tail_end = len(first) + 5  # the reply's last token was sampled, never computed
    ((state_slot, snapshot_slot),) = sched.prefix_cache.take_state_saves()
    follow_up = first + [7] * 6 + [rng.randrange(1000) for _ in range(rng.randint(9, 30))]
    boundary = (len(follow_up) - 1) // BS * BS
    for name in ("turn2", "turn2 again"):
        request = _request(follow_up, name, capture_points=[len(first) + 6])
        sched.add(request)
        plan = sched.schedule()
        assert [(c.start, c.end) for c in plan.chunks] == [(tail_end, len(follow_up))]
        assert request.num_cached_tokens == tail_end < boundary
        (restore,), (copy,) = plan.restores, plan.block_copies
        assert restore.snapshot_slot == snapshot_slot and restore.at_replay_point
        shared = tail_end // BS
        assert len(request.block_ids) == -(-len(follow_up) // BS) and copy.index == shared
        assert copy.pair == (request.tail_source, request.block_ids[shared]) and copy.source not in request.block_ids
        assert sched.blocks.ref_counts[copy.source] == 1  # held while the request runs
        for chunk in plan.chunks:
            chunk.request.num_computed_tokens = chunk.end
        sched.step_done(plan)
        while sched.has_unfinished():
            _step(sched)
        assert request.tail_source is None and sched.blocks.ref_counts[copy.source] == 0
        # the pass saved the boundary and the message start all the same; sent again, it restores from
        # the same tail, whose block and snapshot outlived the decode captures and its own tail
        assert sched.prefix_cache.snapshots.find(chain_hashes(follow_up, BS)[boundary // BS - 1]) is not None
    assert sched.blocks.num_used == 0 and sched.prefix_cache.snapshots.num_referenced == 0


def test_a_tail_inside_a_block_an_earlier_turn_decoded_past_still_serves():
    """Turn 1 decodes past a block boundary (the block is cached, with no snapshot at its end: decode
    captures are sparse); turn 2, the same prompt stopped sooner, leaves a tail one token short of that
    boundary; its follow-up, whose tokens fill that block as turn 1's did (turn 2's last token, sampled
    and never computed, is the block's last), restores from the tail, not from the boundary before."""
    sched = _scheduler(budget=256, decode_interval=1024)
    rng = random.Random()
    length = BS * rng.randint(2, 4) - 2 + BS * (rng.random() < 0.5)
    prompt = [rng.randrange(1000) for _ in range(length)]
    short_end = len(prompt) + 1  # turn 2: two tokens, the last never computed
    assert (short_end + 1) % BS == 0
    _run(sched, _request(prompt, "long", max_tokens=21))  # computes past the block short_end lies in
    _run(sched, _request(prompt, "short", max_tokens=2))
    request = _request(prompt + [7, 7] + [rng.randrange(1000) for _ in range(rng.randint(3, 12))], "next")
    sched.add(request)
    plan = sched.schedule()
    assert request.num_cached_tokens == short_end and len(plan.block_copies) == 1
    assert plan.chunks[0].start == short_end
    for chunk in plan.chunks:
        chunk.request.num_computed_tokens = chunk.end
    sched.step_done(plan)
    while sched.has_unfinished():
        _step(sched)
    assert sched.blocks.num_used == 0 and sched.prefix_cache.snapshots.num_referenced == 0


def test_a_tail_serves_only_prompts_that_continue_it_and_its_eviction_falls_back_to_the_boundary():
    sched = _scheduler(num_blocks=24, budget=256)
    rng = random.Random()
    first = _unaligned_prompt(rng, 30, 40, 4)
    _run(sched, _request(first, "turn1", max_tokens=4))
    tail_end = len(first) + 3
    floor = tail_end // BS * BS
    tokens = first + [7] * 4
    # Diverging inside the tail: the snapshot at the boundary before it.
    diverging = tokens[: tail_end - 1] + [5000] + [rng.randrange(1000) for _ in range(8)]
    for prompt, expected in ((diverging, floor), (tokens + [1, 2, 3], tail_end)):
        request = _request(prompt, f"r{expected}", max_tokens=1)
        sched.add(request)
        plan = _step(sched)
        assert request.num_cached_tokens == expected and bool(plan.block_copies) == (expected == tail_end)
        while sched.has_unfinished():
            _step(sched)
    # Other prompts fill the cache: the tail block goes, and the boundary's snapshot serves again.
    for i in range(3):
        _run(sched, _request([rng.randrange(1000) for _ in range(60)], f"other{i}", max_tokens=1))
    request = _request(tokens + [9, 9, 9], "late", max_tokens=1)
    sched.add(request)
    plan = _step(sched)
    assert request.num_cached_tokens < tail_end and not plan.block_copies


def test_abort_leaves_no_tail_and_attention_only_tails_need_no_snapshot():
    sched = _scheduler()
    rng = random.Random()
    first = _unaligned_prompt(rng, 30, 40, 3)
    request = _request(first, "aborted", max_tokens=3)
    sched.add(request)
    _step(sched)
    _step(sched)
    sched.finish(request, "abort")
    assert sched.prefix_cache.take_state_saves() == []
    follow = first + [7, 7, 1, 2]
    again = _request(follow, "again", max_tokens=1)
    sched.add(again)
    assert not _step(sched).block_copies and again.num_cached_tokens % BS == 0

    sched = _scheduler(hybrid=False)
    _run(sched, _request(first, "turn1", max_tokens=3))
    follow_up = _request(first + [7, 7, 7, 5, 6], "turn2", max_tokens=1)
    sched.add(follow_up)
    plan = _step(sched)
    assert follow_up.num_cached_tokens == len(first) + 2 and len(plan.block_copies) == 1 and not plan.restores
    assert sched.prefix_cache.take_state_saves() == []


def test_a_request_restored_far_below_its_end_still_cuts_at_its_last_boundary():
    sched = _scheduler(num_blocks=256, budget=512)
    shared = list(range(1000, 1040))
    _run(sched, _request(shared + [1], "short"))
    prompt = shared + list(range(300))  # its restore point, 40, is 296 tokens below its last boundary
    plans = _run(sched, _request(prompt, "long"))
    boundary = (len(prompt) - 1) // BS * BS
    assert [(c.start, c.end) for c in plans[0].chunks] == [(40, boundary)]
    assert [(c.start, c.end) for c in plans[1].chunks] == [(boundary, len(prompt))]
    again = _request(prompt, "again")
    sched.add(again)
    assert [(c.start, c.end) for c in _step(sched).chunks] == [(boundary, len(prompt))]


def test_attention_only_models_restart_at_the_end_of_the_cached_run():
    sched = _scheduler(hybrid=False)
    prompt = list(range(500, 527))
    plans = _run(sched, _request(prompt))
    assert not any(p.captures or p.restores for p in plans)
    assert [(c.start, c.end) for c in plans[0].chunks] == [(0, 24)]
    again = _request(prompt[:25] + [1, 2, 3], "again")
    sched.add(again)
    plan = _step(sched)
    assert again.num_cached_tokens == 24 and plan.chunks[0].start == 24


def test_abort_between_planning_and_the_step_releases_every_reference():
    sched = _scheduler()
    prompt = list(range(600, 640))
    _run(sched, _request(prompt, max_tokens=1))
    index = sched.prefix_cache.snapshots
    ready = index.num_ready
    warm = _request(prompt + list(range(20)), "warm", capture_points=[41, 50])
    sched.add(warm)
    plan = sched.schedule()
    assert plan.restores and plan.captures and index.num_referenced == 1 + len(plan.captures)
    sched.finish(warm, "abort")
    assert index.num_referenced == 0 and index.num_used == ready == index.num_ready
    assert sched.blocks.num_used == 0 and sched.slots.num_used == 0
    sched.step_done(plan)  # a late completion of the aborted plan caches nothing more
    assert index.num_ready == ready and index.num_referenced == 0


def test_preempted_request_releases_references_and_restarts_from_its_own_cache():
    sched = _scheduler(num_blocks=12, budget=64, max_seqs=2)
    a = _request(list(range(700, 730)), "a", max_tokens=12)
    b = _request(list(range(800, 810)), "b", max_tokens=12)
    sched.add(a)
    sched.add(b)
    preempted, restarts = [], []
    while sched.has_unfinished():
        plan = _step(sched)
        preempted += plan.preempted
        restarts += [c.start for c in plan.chunks if c.request in plan.admitted and c.request.num_preemptions]
        assert all(sched.blocks.ref_counts[blk] > 0 for r in sched.running for blk in r.block_ids)
    assert preempted and all(r.num_preemptions > 0 for r in preempted)
    assert sched.prefix_cache.snapshots.num_referenced == 0 and sched.blocks.num_used == 0
    assert len(a.output_token_ids) == len(b.output_token_ids) == 12
    assert any(r.num_cached_tokens == 0 for r in preempted)  # first admission reported, not the restart
    assert any(start > 0 for start in restarts)  # a restart found its own blocks
    # as vLLM counts them, the lookups of restarts are not queries: the two prompts, found nowhere
    assert sched.prefix_cache.num_queries == 40 and sched.prefix_cache.num_hits == 0


def test_snapshot_interval_adds_capture_points_in_long_prompts():
    sched = _scheduler(interval=18, budget=128)  # floored to 16
    plans = _run(sched, _request(list(range(900, 970))))
    assert [p for p, _ in _captures(plans[0])] == [16, 32, 48, 64, 68]


def test_decode_captures_come_every_decode_interval_and_at_a_prompt_end_on_a_block():
    rng = random.Random()
    interval = BS * rng.randrange(2, 5)
    sched = _scheduler(num_blocks=128, snapshot_slots=64, budget=256, decode_interval=interval + 1)  # floored
    length = BS * rng.randrange(3, 8)  # on a block boundary: its last pass ends there
    max_tokens = 4 * interval
    plans = _run(sched, _request([rng.randrange(1000) for _ in range(length)], max_tokens=max_tokens))
    decoded = [c.position for p in plans for c in p.captures if c.position > length]
    # The last token sampled is never an input: the sequence ends at length + max_tokens - 1 computed
    expected = [p for p in range(length + 1, length + max_tokens) if p % interval == 0]
    assert decoded == expected and len(expected) >= 3
    assert length in [c.position for p in plans for c in p.captures]


def test_with_few_slots_the_latest_points_are_kept():
    sched = _scheduler(snapshot_slots=2)
    plans = _run(sched, _request(list(range(1000, 1030)), capture_points=[5, 9, 13], max_tokens=1))
    assert _captures(plans[0]) == [(24, False), (28, True)]


def test_recent_chains_give_the_names_of_the_blocks_a_prompt_shares():
    from deltaserve.cache.recent_chains import RecentChains

    rng, bs = random.Random(), 4
    history = [rng.randrange(1000) for _ in range(10 * bs + 3)]
    recent = RecentChains(bs, capacity=2)
    as_bytes = lambda ids: array("q", ids).tobytes()  # noqa: E731
    recent.remember(as_bytes(history), chain_hashes(history, bs))
    follow_up = history + [rng.randrange(1000) for _ in range(9)]
    assert recent.shared_names(as_bytes(follow_up), 100) == chain_hashes(history, bs)  # all 10 named blocks
    assert recent.shared_names(as_bytes(follow_up), 4) == chain_hashes(history, bs)[:4]
    branch = history[: 6 * bs + 1] + [history[6 * bs + 1] + 1] + history[6 * bs + 2 :]  # differs in block 6
    assert recent.shared_names(as_bytes(branch), 100) == chain_hashes(history, bs)[:6]
    assert recent.shared_names(as_bytes([history[0] + 1] + history[1:]), 100) == []
    named = chain_hashes(history, bs)
    recent.remember(as_bytes(history[: 3 * bs]), named[:3])
    live = named[:2]
    recent.remember(as_bytes(history[: 2 * bs]), live)
    live.extend(chain_hashes([7] * (4 * bs), bs)[2:])  # the sequence names more blocks after it was remembered
    assert recent.shared_names(as_bytes(history[: 2 * bs] + [7] * (2 * bs)), 100) == named[:2]
    for _ in range(2):  # the oldest entry is dropped past the capacity
        other = [rng.randrange(1000) for _ in range(3 * bs)]
        recent.remember(as_bytes(other), chain_hashes(other, bs))
    assert recent.shared_names(as_bytes(follow_up), 100) == []


def test_a_salted_chain_shares_no_name_with_another_salt_or_none():
    from deltaserve.cache.block_hash import salt_root
    from deltaserve.cache.recent_chains import RecentChains

    rng, bs = random.Random(), 4
    tokens = [rng.randrange(1000) for _ in range(5 * bs)]
    salt = f"s{rng.randrange(10**6)}"
    roots = [None, salt_root(salt), salt_root(salt + "x")]
    assert salt_root(None) is None and salt_root(salt) == roots[1]
    chains = [chain_hashes(tokens, bs, root) for root in roots]
    names = [name for chain in chains for name in chain]
    assert len(set(names)) == len(names)  # no block name in common between the three chains
    assert chains[0] == chain_hashes(tokens, bs)
    recent = RecentChains(bs)
    as_bytes = array("q", tokens).tobytes()
    recent.remember(as_bytes, chains[1], roots[1])
    assert recent.shared_names(as_bytes, 100, roots[1]) == chains[1]
    assert recent.shared_names(as_bytes, 100) == [] and recent.shared_names(as_bytes, 100, roots[2]) == []


def test_a_follow_up_turn_takes_the_names_of_the_turn_before():
    # The names a request gets from the sequence it continues are the ones hashing its tokens gives.
    bs = 4
    blocks = BlockAllocator(64)
    cache = PrefixCache(blocks, None, bs, 1024, 256)
    rng = random.Random()
    prompt = [rng.randrange(50) for _ in range(22)]
    first = Request("a", prompt, SamplingParams(max_tokens=8), 8, prompt_bytes=array("q", prompt).tobytes())
    first.output_token_ids = [rng.randrange(50) for _ in range(6)]
    cache.block_hashes(first, 7)  # 28 tokens: the prompt and the reply's first 6 tokens
    cache.release(first)
    ids = first.prompt_token_ids + first.output_token_ids + [rng.randrange(50) for _ in range(5)]
    second = Request("b", ids, SamplingParams(max_tokens=1), 1, prompt_bytes=array("q", ids).tobytes())
    assert cache.block_hashes(second, 8) == chain_hashes(ids, bs)
    assert all(taken is named for taken, named in zip(second.block_hashes, first.block_hashes))  # not rehashed
