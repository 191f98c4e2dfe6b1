"""Scheduler: continuous batching with chunked prefill under a token budget, and preemption by
recompute when KV blocks run out. Pure Python: it decides, the ModelRunner computes.

Each step, running requests go first (oldest first; a decode needs one token, an unfinished prefill
continues), then waiting requests are admitted in the waiting queue's order while the budget,
`max_num_seqs`, the KV blocks and the GDN state slots allow. When a running request cannot get the blocks
it needs, another running request is preempted: its blocks and slot are freed and it waits to be
recomputed. The policy (vLLM's) says which: under "fcfs" the waiting queue is in order of arrival, the
newest running request is preempted and waits at the front; under "priority" the queue is ordered by
(priority, arrival), the running request of the largest priority value (of those the latest to arrive) is
preempted and waits in its place by that order. A waiting request never preempts a running one, as in
vLLM: it is admitted first once there is room.

With a PrefixCache, a request starting from scratch first looks up the longest cached prefix it can
restart from (shared KV blocks, and for hybrid models a state snapshot), prefill passes stop at the
request's replay point, and the plan says where to save snapshots (see prefix_cache.py).
"""

from __future__ import annotations

import itertools

from deltaserve.cache.block_allocator import BlockAllocator
from deltaserve.cache.slot_allocator import SlotAllocator
from deltaserve.engine.prefix_cache import PrefixCache
from deltaserve.engine.request import Request, RequestStatus
from deltaserve.engine.step_plan import ScheduledChunk, StepPlan
from deltaserve.engine.waiting_queue import served_before, waiting_queue


class Scheduler:
    def __init__(self, blocks: BlockAllocator, slots: SlotAllocator | None, block_size: int,
                 max_num_seqs: int, max_num_batched_tokens: int, prefix_cache: PrefixCache | None = None,
                 policy: str = "fcfs", lookahead: int = 0):
        self.blocks = blocks
        self.prefix_cache = prefix_cache  # None: prefix caching off
        self.slots = slots  # None for models without GDN layers
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy  # "fcfs" or "priority" (waiting_queue.SCHEDULING_POLICIES)
        # speculative decoding: KV slots held past a chunk's end, where the MTP head's later drafting passes write
        # (num_speculative_tokens - 1 of them)
        self.lookahead = lookahead
        self.waiting = waiting_queue(policy)
        self.running: list[Request] = []
        self._arrivals = itertools.count()
        self.num_preemptions = 0

    # -- queue management -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.arrival = next(self._arrivals)
        self.waiting.add(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, reason: str, stop_reason=None) -> None:
        """Marks a request finished (also when aborted or failed) and returns what it holds. One that
        ran to its end leaves its tail in the prefix cache."""
        if request in self.running:
            if self.prefix_cache is not None and reason != "abort":
                self.prefix_cache.save_tail(request)
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)
        request.drop_pending_tokens()
        request.status = RequestStatus.FINISHED
        request.finish_reason, request.stop_reason = reason, stop_reason

    def _release(self, request: Request) -> None:
        self.blocks.free(reversed(request.block_ids))  # tail first: cached tails are evicted before heads
        request.block_ids = []
        if request.tail_source is not None:  # freed last: the most recently used, the last to evict
            self.blocks.free([request.tail_source])
            request.tail_source = None
        if self.prefix_cache is not None:
            self.prefix_cache.release(request)
        if request.state_slot is not None:
            self.slots.free(request.state_slot)
            request.state_slot = None

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request.num_pending_tokens and len(request.output_token_ids) >= request.max_tokens:
                index += 1  # its last token is on the device: it finishes when that is read back
                continue
            count = self._chunk_size(request, request.num_computed_tokens, budget, request.replay_point)
            drafts = self._drafts_to_verify(request, count, budget)
            count += len(drafts)
            num_preempted = len(plan.preempted)
            if not self._reserve_blocks(request, count + self.lookahead, plan):
                break  # `request` itself was preempted, the last to be: as vLLM's, the rest wait for the next step
            if len(plan.preempted) > num_preempted:  # a victim planned before it gives back its place and tokens
                index = self.running.index(request)
                budget = self.max_num_batched_tokens - sum(c.num_tokens for c in plan.chunks)
            plan.chunks.append(ScheduledChunk(request, request.num_computed_tokens, count, drafts))
            budget -= count
            index += 1
        if not plan.preempted:
            self._admit_waiting(plan, budget)
        if self.prefix_cache is not None:
            self.prefix_cache.plan_captures(plan)
        return plan

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting.peek()
            hit = None
            if (self.prefix_cache is not None and request.num_computed_tokens == 0
                    and request.params.prompt_logprobs is None):  # prompt logprobs need every prompt row
                hit = self.prefix_cache.lookup(request)
                if request.params.skip_reading_prefix_cache:
                    hit = hit.unread()
            start = hit.num_tokens if hit else request.num_computed_tokens
            count = self._chunk_size(request, start, budget, hit.replay_point if hit else request.replay_point)
            shared = hit.blocks if hit else []
            missing = max(0, -(-(start + count + self.lookahead) // self.block_size) - len(request.block_ids)
                          - len(shared))
            if not self.blocks.can_allocate(missing + self.blocks.num_unreferenced(hit.held_blocks if hit else [])):
                return
            if self.slots is not None and request.state_slot is None:
                request.state_slot = self.slots.allocate()
                if request.state_slot is None:
                    return
                if start == 0:
                    plan.reset_state_slots.append(request.state_slot)
            if hit is not None:
                self.prefix_cache.admit(request, hit, plan)
            request.block_ids += self.blocks.allocate(missing)
            self.waiting.pop()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.admitted.append(request)
            plan.chunks.append(ScheduledChunk(request, request.num_computed_tokens, count))
            budget -= count

    @staticmethod
    def _chunk_size(request: Request, start: int, budget: int, replay_point: int) -> int:
        """Tokens to compute from `start` this step: what is left, within the budget, and never past
        the replay point in one pass (0 when there is none)."""
        count = min(request.num_tokens - start, budget)
        if start < replay_point:
            count = min(count, replay_point - start)
        return count

    @staticmethod
    def _drafts_to_verify(request: Request, count: int, budget: int) -> list[int]:
        """The drafts a decoding request verifies this step: as many of its MTP head's as the budget takes and its
        max_tokens leaves room for (a step that accepts them all yields one token more)."""
        drafts = request.draft_token_ids
        decoding = count == 1 and request.num_computed_tokens == request.num_tokens - 1
        if not drafts or not decoding or request.num_pending_tokens:
            return []
        room = min(budget - 1, request.max_tokens - len(request.output_token_ids) - 1)
        return drafts[: max(0, room)]

    def _blocks_missing(self, request: Request, count: int) -> int:
        needed = -(-(request.num_computed_tokens + count) // self.block_size)
        return max(0, needed - len(request.block_ids))

    def _reserve_blocks(self, request: Request, count: int, plan: StepPlan) -> bool:
        """Gives `request` the blocks for `count` more tokens, preempting other running requests (`_victim`)
        if it must. False when `request` itself had to be preempted."""
        missing = self._blocks_missing(request, count)
        while not self.blocks.can_allocate(missing):
            victim = self._victim()
            self._preempt(victim, plan)
            if victim is request:
                return False
        request.block_ids += self.blocks.allocate(missing)
        return True

    def _victim(self) -> Request:
        """The running request preempted first, as vLLM's: the newest admitted (fcfs), or the one served last by
        priority and arrival (priority), which may be one planned earlier in this step."""
        if self.policy == "priority":
            return max(self.running, key=served_before)
        return self.running[-1]

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        plan.chunks = [c for c in plan.chunks if c.request is not request]
        self._release(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.requeue(request)
        plan.preempted.append(request)

    # -- after the step ---------------------------------------------------------------------------
    def step_done(self, plan: StepPlan) -> None:
        """The plan's step ran and its requests' num_computed_tokens are advanced; nothing finished yet."""
        if self.prefix_cache is not None:
            self.prefix_cache.commit(plan)

    def take_state_saves(self) -> list[tuple[int, int]]:
        """(state slot, snapshot slot) copies owed by requests that finished since the last call: they
        must be queued before any later step, which may hand those state slots to other requests."""
        return self.prefix_cache.take_state_saves() if self.prefix_cache is not None else []

    def reset_prefix_cache(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.reset()

    def reset_stats(self) -> None:
        self.num_preemptions = 0
        if self.prefix_cache is not None:
            self.prefix_cache.reset_stats()

    def stats(self) -> dict:
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "kv_blocks_used": self.blocks.num_used,
            "kv_blocks_total": self.blocks.num_blocks,
            "state_slots_used": self.slots.num_used if self.slots else 0,
            "state_slots_total": self.slots.num_slots if self.slots else 0,
            "num_preemptions": self.num_preemptions,
            **(self.prefix_cache.stats() if self.prefix_cache is not None else {}),
        }
