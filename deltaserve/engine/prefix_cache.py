"""PrefixCache: the scheduler's side of prefix caching. Pure Python: it decides which cached KV
blocks and which state snapshot a request starts from, where prefill saves snapshots, and records
what each step computed; the ModelRunner moves the tensors.

- KV blocks are named by the hash chain of block_hash.py and shared through the BlockAllocator.
- A hybrid model (GDN layers) can restart a sequence only where its recurrent state was saved: a
  hit is the longest run of cached blocks cut back to the furthest snapshot at or before its end,
  or a tail (below) past that snapshot. An attention-only model (snapshots None) restarts at the end
  of the run.
- Exact replay: no prefill pass crosses the request's replay point, and the same request sent again
  restores exactly the state at that point and runs the same last pass over the same KV, so its
  logits are the same bytes. A request that restores from a snapshot replays from there: its last
  pass is [restore point, end), one pass for a follow-up turn. A cold request replays from the last
  block boundary strictly below its length and computes the few tokens after it in a pass of their
  own. Each prompt's replay point is recorded (`replay_points`, keyed by the hash of the whole
  prompt), so a request sent again cuts where the first run cut, not at a snapshot that run saved
  inside its last pass.
- Snapshot capture points, block-aligned: the last block boundary strictly below the prompt's length
  and one block before it, the start of each message (`Request.capture_points`, floored to a
  block), every `snapshot_interval` tokens, a prompt's end where it is a block boundary, and while
  decoding every `decode_snapshot_interval` tokens (each capture copies the sequence's whole state:
  at every block it took 3.96 ms of each 16 decode steps of 128 sequences on the 9B shape).
- Tails: a request that finishes (stop or length) leaves its partly filled last block cached under
  a tail name (block_hash.tail_name) and, for a hybrid model, a snapshot of its state at its very end
  under the same name. The next turn of a conversation resends that request's tokens: its hit ends
  there instead of at the block boundary before, and it copies the tail block's rows into a block of
  its own (tails are never shared, so no one writes into a cached block).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.block_hash import BlockHash, chain_hashes_of_bytes, hash_bytes, tail_name
from deltaserve.cache.recent_chains import RecentChains
from deltaserve.cache.snapshot_index import SnapshotIndex
from deltaserve.engine.request import Request
from deltaserve.engine.step_plan import BlockCopy, SnapshotCapture, SnapshotRestore, StepPlan


# The name of a capture planned while the last token of its block was still on the device (asynchronous
# scheduling); its block hash is taken when the step is committed, once every token is known.
UNNAMED = b"unnamed"

# A request restored within this many tokens of its last block boundary replays from its restore point
# (one pass); one restored further back cuts at that boundary too, so that sending it again recomputes
# a few tokens rather than all of them. A pass this short costs about what a shorter one does on a MoE
# model (it reads nearly every expert either way).
ONE_PASS_MAX_TOKENS = 256

# Replay points remembered per prompt (a few dozen bytes each), least recently used dropped first.
MAX_REPLAY_RECORDS = 65536


@dataclass
class PrefixHit:
    blocks: list[int]  # cached KV blocks the request shares, the full ones of [0, num_tokens)
    num_tokens: int  # the request restarts from here (< its length; block-aligned unless a tail)
    snapshot_slot: int | None  # the GDN state after num_tokens tokens (hybrid models, num_tokens > 0)
    replay_point: int  # the request's last prefill pass starts here
    prompt_key: BlockHash  # the hash of the whole prompt, under which the replay point is recorded
    tail_block: int | None = None  # a cached tail holding the rows of [len(blocks) * block, num_tokens)

    @property
    def held_blocks(self) -> list[int]:
        """The cached blocks admitting the request references."""
        return self.blocks if self.tail_block is None else [*self.blocks, self.tail_block]

    def unread(self) -> "PrefixHit":
        """The same prompt computed from its start, nothing taken from the cache (vLLM's
        skip_reading_prefix_cache), its replay point and captures kept: what it computes is cached as a miss's is."""
        return PrefixHit([], 0, None, self.replay_point, self.prompt_key)


class PrefixCache:
    def __init__(self, blocks: BlockAllocator, snapshots: SnapshotIndex | None, block_size: int,
                 snapshot_interval: int, decode_snapshot_interval: int):
        self.blocks = blocks
        self.snapshots = snapshots  # None: no recurrent state, KV blocks alone restore a prefix
        self.block_size = block_size
        self.snapshot_step = max(block_size, snapshot_interval // block_size * block_size)
        self.decode_snapshot_step = max(block_size, decode_snapshot_interval // block_size * block_size)
        self.num_queries = 0  # tokens looked up
        self.num_hits = 0  # tokens found
        self.replay_points: OrderedDict[BlockHash, int] = OrderedDict()
        self.recent = RecentChains(block_size)  # names of sequences let go, for the next turn's prompt
        self.state_saves: list[tuple[int, int]] = []  # (state slot, snapshot slot) of tails, for the runner

    def last_boundary(self, num_tokens: int) -> int:
        """The last block boundary strictly below num_tokens: a cold request's replay point."""
        return (num_tokens - 1) // self.block_size * self.block_size

    def block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The names of the request's first `num_blocks` blocks (computed once, kept on the request)."""
        hashes, size = request.block_hashes, self.block_size
        if not hashes and request.prompt_bytes:  # names an earlier sequence with the same tokens (and salt) has
            hashes += self.recent.shared_names(request.prompt_bytes, num_blocks, request.hash_root)
        if len(hashes) < num_blocks:
            hashes += chain_hashes_of_bytes(request.token_bytes(len(hashes) * size, num_blocks * size), size,
                                            hashes[-1] if hashes else request.hash_root)
        return hashes

    # -- admission --------------------------------------------------------------------------------
    def lookup(self, request: Request) -> PrefixHit:
        """Where a request starting from scratch can restart; takes no references. A prompt seen before
        restarts at most from its recorded replay point, a new one at most from the last block boundary
        below its length, and replays from its restore point when that is near the boundary."""
        boundary = self.last_boundary(request.num_tokens)
        hashes = self.block_hashes(request, boundary // self.block_size)
        key = hash_bytes(hashes[-1] if hashes else request.hash_root, request.token_bytes(boundary, request.num_tokens))
        recorded = self.replay_points.get(key)
        limit = boundary if recorded is None else recorded
        blocks = self.blocks.cached_prefix(hashes[: limit // self.block_size])
        count, slot = self._deepest_snapshot(hashes, len(blocks))
        # A tail beyond that snapshot restores further: one continuing any of the cached blocks from
        # there on (an earlier turn may have decoded on past where this one's tokens end, caching the
        # block they end in without a snapshot at its end). Looked for as far back as a decode runs
        # between two snapshots: each block costs about 12 us of hashing, and a long run whose
        # snapshots were evicted would otherwise cost milliseconds at admission.
        end = request.num_tokens - 1 if recorded is None else recorded
        deepest_tail = max(count, len(blocks) - self.decode_snapshot_step // self.block_size)
        for parents in range(len(blocks), deepest_tail - 1, -1):
            if (tail := self._find_tail(request, hashes, parents, end)) is not None:
                tail_block, start, slot = tail
                blocks = blocks[:parents]
                break
        else:
            tail_block, blocks = None, blocks[:count]
            start = count * self.block_size
        if recorded is not None:
            replay = recorded
        else:
            replay = start if 0 < start and boundary - start <= ONE_PASS_MAX_TOKENS else boundary
        return PrefixHit(blocks, start, slot, replay, key, tail_block)

    def _deepest_snapshot(self, hashes: list[BlockHash], count: int) -> tuple[int, int | None]:
        """How many of the first `count` cached blocks a restart can keep (a hybrid model restarts only
        where its state was saved; an attention-only one after all of them), and the snapshot there."""
        if self.snapshots is None:
            return count, None
        while count and (slot := self.snapshots.find(hashes[count - 1])) is None:
            count -= 1
        return count, slot if count else None

    def _find_tail(self, request: Request, hashes: list[BlockHash], count: int, end: int):
        """The longest cached tail continuing the run of `count` cached blocks within the request's
        tokens up to `end`: (its block, where it ends, its snapshot slot), or None."""
        start = count * self.block_size
        longest = min(self.block_size - 1, end - start)
        if longest <= 0:
            return None
        parent = hashes[count - 1] if count else request.hash_root
        data = request.token_bytes(start, start + longest)
        for length in range(longest, 0, -1):
            name = tail_name(parent, data[: length * 8])
            block = self.blocks.find(name)
            slot = None if self.snapshots is None else self.snapshots.find(name)
            if block is not None and (slot is not None or self.snapshots is None):
                return block, start + length, slot
        return None

    def admit(self, request: Request, hit: PrefixHit, plan: StepPlan) -> None:
        """Takes the hit's references and starts the request from it. Its state slot is allocated."""
        if request.num_preemptions == 0:  # as vLLM's counters: a restarted request's lookup is not a new query
            self.num_queries += request.num_tokens
            self.num_hits += hit.num_tokens
        self.blocks.incref(hit.held_blocks)
        request.block_ids = list(hit.blocks)
        if hit.tail_block is not None:  # held until the request stops: sent again, it needs the tail too
            request.tail_source = hit.tail_block
            plan.block_copies.append(BlockCopy(request, hit.tail_block, len(hit.blocks)))
        request.num_registered_blocks = len(hit.blocks)
        request.num_computed_tokens = hit.num_tokens
        if request.num_preemptions == 0:
            request.num_cached_tokens = hit.num_tokens
        request.replay_point = hit.replay_point
        self._record_replay_point(hit)
        if self.snapshots is None:
            return
        request.snapshot_positions = self._snapshot_positions(request, hit.replay_point)
        if hit.num_tokens:
            self.snapshots.acquire(hit.snapshot_slot)
            request.snapshot_refs[hit.snapshot_slot] = None
            plan.restores.append(SnapshotRestore(request, hit.snapshot_slot, hit.num_tokens == hit.replay_point))

    def _record_replay_point(self, hit: PrefixHit) -> None:
        self.replay_points[hit.prompt_key] = hit.replay_point
        self.replay_points.move_to_end(hit.prompt_key)
        if len(self.replay_points) > MAX_REPLAY_RECORDS:
            self.replay_points.popitem(last=False)

    def _snapshot_positions(self, request: Request, replay: int) -> list[int]:
        size, length = self.block_size, request.num_tokens
        boundary = self.last_boundary(length)
        points = {replay, boundary, boundary - size}
        points.update(offset // size * size for offset in request.capture_points)
        points.update(range(self.snapshot_step, length, self.snapshot_step))
        return sorted(p for p in points if 0 < p < length and p % size == 0)  # a tail's end is no capture point

    # -- each step --------------------------------------------------------------------------------
    def plan_captures(self, plan: StepPlan) -> None:
        """Reserves a snapshot slot for each capture point the plan's chunks reach that is not saved
        yet, latest first (with few slots, the points nearest the end matter most)."""
        if self.snapshots is None:
            return
        planned: set[BlockHash] = set()
        for chunk in plan.chunks:
            if chunk.draft_token_ids:  # where a verify chunk ends is known once its drafts are checked
                continue
            request = chunk.request
            known = request.num_tokens - request.num_pending_tokens
            for position in self._capture_positions(chunk):
                if position > known:  # its block ends with a token still on the device: named at commit
                    name = UNNAMED
                else:
                    name = self._name_at(request, position)
                    if name in planned or self.snapshots.find(name) is not None:
                        continue
                slot = self.snapshots.reserve()
                if slot is None:
                    return
                planned.add(name)
                request.snapshot_refs[slot] = name
                plan.captures.append(SnapshotCapture(chunk, position, slot))

    def _capture_positions(self, chunk) -> list[int]:
        request = chunk.request
        points = [p for p in request.snapshot_positions if chunk.start < p <= chunk.end]
        end, prompt = chunk.end, request.num_prompt_tokens
        step = self.block_size if end == prompt else self.decode_snapshot_step
        if end >= prompt and end % step == 0 and end not in points:
            points.append(end)  # the prompt's end on a block boundary, or a decode step's on the interval
        return sorted(points, reverse=True)

    def commit(self, plan: StepPlan) -> None:
        """After a step that ran: caches the blocks it filled, the snapshots it wrote, and lets go of
        the snapshots it restored. Call before any of its requests can finish."""
        for chunk in plan.chunks:
            request = chunk.request
            full = chunk.end // self.block_size
            restarted = request.num_computed_tokens < chunk.end  # preempted while the step ran
            if full > request.num_registered_blocks and not request.is_finished and not restarted:
                hashes = self.block_hashes(request, full)
                for i in range(request.num_registered_blocks, full):
                    self.blocks.register(request.block_ids[i], hashes[i])
                request.num_registered_blocks = full
        # What a step saved is newer than its start, except a restore at the request's replay point: the
        # same request sent again needs that one, so it is the last of them to evict.
        for restore in plan.restores:
            if not restore.at_replay_point:
                self._release_restore(restore)
        for capture in sorted(plan.captures, key=lambda c: c.position):  # the latest is the last to evict
            request = capture.chunk.request
            name = request.snapshot_refs.pop(capture.snapshot_slot, None)
            if name is None:
                continue  # the request let it go already
            if name is UNNAMED:
                name = self._name_at(request, capture.position)
            self.snapshots.commit(capture.snapshot_slot, name)
            if capture.position > request.num_prompt_tokens:  # decode: the one before is superseded
                if request.last_decode_snapshot is not None:
                    self.snapshots.demote(request.last_decode_snapshot)
                request.last_decode_snapshot = name
        for restore in plan.restores:
            if restore.at_replay_point:
                self._release_restore(restore)

    def _release_restore(self, restore) -> None:
        if restore.snapshot_slot in restore.request.snapshot_refs:
            del restore.request.snapshot_refs[restore.snapshot_slot]
            self.snapshots.release(restore.snapshot_slot)

    def save_tail(self, request: Request) -> None:
        """A request finished (stop or length), before its blocks are freed: caches its partly filled
        last block under its tail name and, for a hybrid model, queues a copy of its state slot, which
        holds the state after exactly its computed tokens, into a snapshot of that name (`state_saves`:
        the engine hands them to the runner before any later step can reuse the state slot). A request
        that ends on a block boundary has no tail: its last block is cached under its own name, and the
        state snapshot goes under that name unless a decode capture saved it there already. In
        asynchronous scheduling a row run after the last token was read back counts as computed: its
        input was that token, so the state and KV cover it too."""
        end, size = request.num_computed_tokens, self.block_size
        index = end // size
        on_boundary = end % size == 0
        if (end == 0 or end > request.num_tokens - request.num_pending_tokens
                or index + (not on_boundary) > len(request.block_ids)
                or (self.snapshots is not None and request.state_slot is None)):
            return
        name = self._name_at(request, end)
        if self.snapshots is not None and self.snapshots.find(name) is None:
            if request.replay_point:  # sent again, it restores there: that and the tail are evicted last
                self.snapshots.promote(self._name_at(request, request.replay_point))
            slot = self.snapshots.reserve()
            if slot is None:
                return
            self.snapshots.commit(slot, name)
            self.state_saves.append((request.state_slot, slot))
        self.blocks.register(request.block_ids[index - 1 if on_boundary else index], name)

    def _name_at(self, request: Request, position: int) -> BlockHash:
        """The name of the request's prefix [0, position): its block's, or a tail's inside a block."""
        index = position // self.block_size
        hashes = self.block_hashes(request, index)
        if position % self.block_size == 0:
            return hashes[index - 1]
        return tail_name(hashes[index - 1] if index else request.hash_root,
                         request.token_bytes(index * self.block_size, position))

    def take_state_saves(self) -> list[tuple[int, int]]:
        saves, self.state_saves = self.state_saves, []
        return saves

    def release(self, request: Request) -> None:
        """The request stops (finished, aborted, failed or preempted): drops its snapshot references
        and forgets captures that will not be written. Its blocks are freed by the scheduler."""
        for slot, name in request.snapshot_refs.items():
            if name is None:
                self.snapshots.release(slot)
            else:
                self.snapshots.cancel(slot)
        request.snapshot_refs.clear()
        request.num_registered_blocks = 0
        known = request.block_hashes
        self.recent.remember(request.token_bytes(0, len(known) * self.block_size), known, request.hash_root)

    def reset(self) -> None:
        """Forgets every cached block and every snapshot not in use."""
        self.blocks.reset_cache()
        self.replay_points.clear()
        self.recent.clear()
        if self.snapshots is not None:
            self.snapshots.clear()

    def reset_stats(self) -> None:
        self.num_queries = self.num_hits = 0

    def stats(self) -> dict:
        return {
            "prefix_cache_queries": self.num_queries,
            "prefix_cache_hits": self.num_hits,
            "snapshot_slots_used": self.snapshots.num_used if self.snapshots else 0,
            "snapshot_slots_total": self.snapshots.num_slots if self.snapshots else 0,
        }
