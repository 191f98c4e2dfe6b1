"""StepPlan: the scheduler's decision for one step, which the ModelRunner turns into a batch."""

from __future__ import annotations

from dataclasses import dataclass, field

from deltaserve.engine.request import Request


@dataclass(eq=False)
class ScheduledChunk:
    request: Request
    start: int  # first position computed this step (== request.num_computed_tokens)
    num_tokens: int  # drafts included
    # speculative decoding: the drafted tokens after the request's last one, its rows after the first; each row
    # samples, and the tokens up to the first draft its row's token refutes are kept (runner/speculative_step.py)
    draft_token_ids: list[int] = field(default_factory=list)
    num_refuted: int = 0  # a verify chunk's drafts from the first refuted one on (set by keep_verified)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens (a verify chunk's drafts past them), so its
        last row yields a token (every row of a verify chunk does)."""
        return self.end == self.request.num_tokens + len(self.draft_token_ids)

    def keep_verified(self, num_accepted: int) -> None:
        """A verify chunk whose first num_accepted drafts held: its rows past them computed tokens that are not
        the request's, so it counts as the chunk of its rows up to the last accepted draft."""
        self.num_refuted = len(self.draft_token_ids) - num_accepted
        self.num_tokens = num_accepted + 1
        self.draft_token_ids = self.draft_token_ids[:num_accepted]


@dataclass
class SnapshotRestore:
    """Before the step: copy snapshot `snapshot_slot` into the request's state slot (prefix cache hit)."""

    request: Request
    snapshot_slot: int
    at_replay_point: bool = False  # the request's last prefill pass starts from this state


@dataclass
class BlockCopy:
    """Before the step: copy KV block `source` (a cached tail) into the request's block `index`, whose
    first rows the request restores from it (a prefix-cache hit that ends inside a block)."""

    request: Request
    source: int
    index: int

    @property
    def pair(self) -> tuple[int, int]:
        return self.source, self.request.block_ids[self.index]


@dataclass
class SnapshotCapture:
    """Save the request's GDN state after its first `position` tokens into `snapshot_slot`, where
    chunk.start < position <= chunk.end: inside the chunk the kernels write it at that row; at the
    chunk's end it is a copy of the state slot after the step."""

    chunk: ScheduledChunk
    position: int
    snapshot_slot: int

    @property
    def at_chunk_end(self) -> bool:
        return self.position == self.chunk.end


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    reset_state_slots: list[int] = field(default_factory=list)  # slots of sequences starting from token 0
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # requests that start (or restart) this step
    restores: list[SnapshotRestore] = field(default_factory=list)
    captures: list[SnapshotCapture] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)

    @property
    def is_decode(self) -> bool:
        return bool(self.chunks) and all(c.num_tokens == 1 for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def drop_finished(self) -> None:
        """Removes the chunks (and their captures) of requests that finished after the plan was made:
        a token read back from the previous step stopped them."""
        if any(c.request.is_finished for c in self.chunks):
            self.chunks = [c for c in self.chunks if not c.request.is_finished]
            self.captures = [c for c in self.captures if not c.chunk.request.is_finished]
