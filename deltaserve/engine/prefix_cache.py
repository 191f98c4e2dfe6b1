"""PrefixCache: the scheduler's side of prefix caching. Pure Python: it decides which cached KV
blocks and which state snapshot a request starts from, where prefill saves snapshots, and records
what each step computed; the ModelRunner moves the tensors.

- KV blocks are named by the hash chain of block_hash.py and shared through the BlockAllocator.
- A hybrid model (GDN layers) can restart a sequence only where its recurrent state was saved: a
  hit is the longest run of cached blocks cut back to the furthest snapshot at or before its end.
  An attention-only model (snapshots None) restarts at the end of the run.
- Exact replay: every prefill pass is cut at the request's replay point, the last block boundary
  strictly below its length. A cold request computes [replay point, end) in a pass of its own, and
  the state after [0, replay point) is that pass's initial state; the same request sent again
  restores exactly that state and runs the same last pass over the same KV, so its logits are the
  same bytes.
- Snapshot capture points, block-aligned: the replay point and one block before it, the start of
  each message (`Request.capture_points`, floored to a block), every `snapshot_interval` tokens, and
  each block boundary reached at the end of a step once the prompt is done (decode).
"""

from __future__ import annotations

from dataclasses import dataclass

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.block_hash import BlockHash, hash_block
from deltaserve.cache.snapshot_index import SnapshotIndex
from deltaserve.engine.request import Request
from deltaserve.engine.step_plan import SnapshotCapture, SnapshotRestore, StepPlan


# The name of a capture planned while the last token of its block was still on the device (asynchronous
# scheduling); its block hash is taken when the step is committed, once every token is known.
UNNAMED = b"unnamed"


@dataclass
class PrefixHit:
    blocks: list[int]  # cached KV blocks the request shares, covering [0, num_tokens)
    num_tokens: int  # the request restarts from here (block-aligned, < its length)
    snapshot_slot: int | None  # the GDN state after num_tokens tokens (hybrid models, num_tokens > 0)
    replay_point: int


class PrefixCache:
    def __init__(self, blocks: BlockAllocator, snapshots: SnapshotIndex | None, block_size: int,
                 snapshot_interval: int):
        self.blocks = blocks
        self.snapshots = snapshots  # None: no recurrent state, KV blocks alone restore a prefix
        self.block_size = block_size
        self.snapshot_step = max(block_size, snapshot_interval // block_size * block_size)
        self.num_queries = 0  # tokens looked up
        self.num_hits = 0  # tokens found

    def replay_point(self, num_tokens: int) -> int:
        return (num_tokens - 1) // self.block_size * self.block_size

    def block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """The names of the request's first `num_blocks` blocks (computed once, kept on the request)."""
        hashes, size = request.block_hashes, self.block_size
        for i in range(len(hashes), num_blocks):
            hashes.append(hash_block(hashes[-1] if hashes else None, request.token_ids_slice(i * size, (i + 1) * size)))
        return hashes

    # -- admission --------------------------------------------------------------------------------
    def lookup(self, request: Request) -> PrefixHit:
        """Where a request starting from scratch can restart; takes no references."""
        replay = self.replay_point(request.num_tokens)
        hashes = self.block_hashes(request, replay // self.block_size)
        blocks = self.blocks.cached_prefix(hashes[: replay // self.block_size])
        slot = None
        if self.snapshots is not None:
            count = len(blocks)
            while count and (slot := self.snapshots.find(hashes[count - 1])) is None:
                count -= 1
            blocks = blocks[:count]
        return PrefixHit(blocks, len(blocks) * self.block_size, slot, replay)

    def admit(self, request: Request, hit: PrefixHit, plan: StepPlan) -> None:
        """Takes the hit's references and starts the request from it. Its state slot is allocated."""
        self.num_queries += request.num_tokens
        self.num_hits += hit.num_tokens
        self.blocks.incref(hit.blocks)
        request.block_ids = list(hit.blocks)
        request.num_registered_blocks = len(hit.blocks)
        request.num_computed_tokens = hit.num_tokens
        if request.num_preemptions == 0:
            request.num_cached_tokens = hit.num_tokens
        request.replay_point = hit.replay_point
        if self.snapshots is None:
            return
        request.snapshot_positions = self._snapshot_positions(request, hit.replay_point)
        if hit.num_tokens:
            self.snapshots.acquire(hit.snapshot_slot)
            request.snapshot_refs[hit.snapshot_slot] = None
            plan.restores.append(SnapshotRestore(request, hit.snapshot_slot))

    def _snapshot_positions(self, request: Request, replay: int) -> list[int]:
        size, length = self.block_size, request.num_tokens
        points = {replay, replay - size}
        points.update(offset // size * size for offset in request.capture_points)
        points.update(range(self.snapshot_step, length, self.snapshot_step))
        return sorted(p for p in points if 0 < p < length)

    # -- each step --------------------------------------------------------------------------------
    def plan_captures(self, plan: StepPlan) -> None:
        """Reserves a snapshot slot for each capture point the plan's chunks reach that is not saved
        yet, latest first (with few slots, the points nearest the end matter most)."""
        if self.snapshots is None:
            return
        planned: set[BlockHash] = set()
        for chunk in plan.chunks:
            request = chunk.request
            known = request.num_tokens - request.num_pending_tokens
            for position in self._capture_positions(chunk):
                if position > known:  # its block ends with a token still on the device: named at commit
                    name = UNNAMED
                else:
                    name = self.block_hashes(request, position // self.block_size)[position // self.block_size - 1]
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
        end = chunk.end
        if end % self.block_size == 0 and end >= request.num_prompt_tokens and end not in points:
            points.append(end)  # a block boundary reached once the prompt is done
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
        for restore in plan.restores:  # before the captures: what a step saved is newer than its start
            if restore.snapshot_slot in restore.request.snapshot_refs:
                del restore.request.snapshot_refs[restore.snapshot_slot]
                self.snapshots.release(restore.snapshot_slot)
        for capture in sorted(plan.captures, key=lambda c: c.position):  # the latest is the last to evict
            request = capture.chunk.request
            name = request.snapshot_refs.pop(capture.snapshot_slot, None)
            if name is None:
                continue  # the request let it go already
            if name is UNNAMED:
                blocks = capture.position // self.block_size
                name = self.block_hashes(request, blocks)[blocks - 1]
            self.snapshots.commit(capture.snapshot_slot, name)
            if capture.position > request.num_prompt_tokens:  # decode: the one before is superseded
                if request.last_decode_snapshot is not None:
                    self.snapshots.demote(request.last_decode_snapshot)
                request.last_decode_snapshot = name

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

    def reset(self) -> None:
        """Forgets every cached block and every snapshot not in use."""
        self.blocks.reset_cache()
        if self.snapshots is not None:
            self.snapshots.clear()

    def stats(self) -> dict:
        return {
            "prefix_cache_queries": self.num_queries,
            "prefix_cache_hits": self.num_hits,
            "snapshot_slots_used": self.snapshots.num_used if self.snapshots else 0,
            "snapshot_slots_total": self.snapshots.num_slots if self.snapshots else 0,
        }
