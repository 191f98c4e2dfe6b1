"""Verifying drafted tokens: speculative sampling over a verify chunk's rows.

A sequence that verifies k drafts d_1..d_k runs k + 1 rows: row j's logits are the target model's distribution
p_j of the token after d_j (row 0's after the sequence's last token). The MTP head drafts greedily, so a draft's
own distribution is all on the draft: d_{j+1} is accepted with probability p_j(d_{j+1}) (a greedy row: where it
is p_j's argmax), and at the first refusal the row's token is drawn from p_j without d_{j+1}, renormalised (the
residual max(p - q, 0) of speculative sampling where q is one-hot). Where every draft holds, the last row's token
is drawn from p_k. So every token kept is distributed as the target model's sampling would draw it, and a greedy
sequence keeps exactly the tokens greedy decoding gives.

p_j is the distribution the sampler draws from (Sampler.drawn_from: temperature, top-k, top-p, min-p) over row
j's logits as a plain step would process them were d_1..d_j the output already: under the grammar's mask after
those drafts (Sampler.constrained_along_drafts, a copy of the matcher taking them), with the request's biases,
refusals and penalties (Sampler.follow_drafts: a penalty counts the drafts before the row, min_tokens holds stop
tokens back by the row's place, a bad word ends in the drafts, a thinking budget forces its end where the drafts
fill it). A draft the grammar refuses is masked, so it is never kept; a row whose constraints leave no token ends
its request there only where the sequence reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deltaserve import kernels
from deltaserve.engine.request import Request
from deltaserve.host_to_device import to_device
from deltaserve.kernels.sampling.reference import uniforms
from deltaserve.runner.sampler import Sampler, row_seed

ACCEPT_STREAM = 1  # a seeded row's acceptance draw takes its row_seed at this sample offset; its tokens at 0


@dataclass
class VerifyRows:
    """One sequence's rows in the step's logits: first_row, then one per draft."""

    request: Request
    first_row: int
    draft_token_ids: list[int]


@dataclass
class Verdicts:
    """What verify_sequences gives: `taken[i]`, sequence i's accepted drafts then the token its first refuted row
    (or its last row) gives; `reported`, the logits the engine's logprobs mode reads of every verify row (under the
    grammar's mask, and in a processed mode with the biases and penalties too), sequence i's rows from
    `first_rows[i]`."""

    taken: list[list[int]]
    reported: torch.Tensor | None  # None: no sequence
    first_rows: list[int]


def verify_sequences(sampler: Sampler, logits: torch.Tensor, sequences: list[VerifyRows]) -> Verdicts:
    """The verdicts on the sequences' drafts, and the logits their rows report (Verdicts)."""
    if not sequences:
        return Verdicts([], None, [])
    requests, rows, drafts, positions, first_rows = [], [], [], [], []
    in_order = True  # each sequence's rows start where the one before it ended (as a verify graph lays them out)
    for seq in sequences:  # the host's lists a row each, a sequence's built at once
        count, base = len(seq.draft_token_ids) + 1, len(seq.request.output_token_ids)
        in_order = in_order and (not rows or seq.first_row == rows[-1] + 1)
        first_rows.append(len(rows))
        requests += [seq.request] * count
        rows += range(seq.first_row, seq.first_row + count)
        drafts += seq.draft_token_ids
        drafts.append(-1)  # the last row verifies no draft
        positions += range(base, base + count)
    device = logits.device
    if in_order:  # a view of the logits, no copy
        picked = logits[rows[0] : rows[0] + len(rows), : sampler.vocab_size].float()  # (no op on fp32 logits)
    else:
        picked = logits[to_device(rows, device), : sampler.vocab_size].float()
    masked, processed, dead_rows = _processed(sampler, picked, requests, sequences)
    draft = to_device(drafts, device)
    if all(seq.request.params.temperature == 0 for seq in sequences):
        # greedy rows keep a draft where it is their argmax: one argmax, as plain greedy decoding takes it
        tokens = kernels.greedy_tokens(processed, torch.empty(len(rows), dtype=torch.int64, device=device))
        accepted = tokens == draft
    else:
        tokens, accepted = _sampled_verdicts(sampler, processed, requests, draft, positions)
    tokens, accepted = torch.stack([tokens, accepted.long()]).tolist()  # one read back
    out = []
    for seq, row in zip(sequences, first_rows):
        kept = []
        for j, draft_token in enumerate(seq.draft_token_ids):
            if not accepted[row + j]:
                break
            kept.append(draft_token)
        out.append(kept + [tokens[row + len(kept)]])
        if dead_rows:
            _mark_dead_end(seq, row, len(kept), dead_rows)
    return Verdicts(out, processed if sampler.logprobs_mode.startswith("processed") else masked, first_rows)


def _mark_dead_end(seq: VerifyRows, row: int, kept: int, dead_rows: set[int]) -> None:
    """The first of the sequence's rows it reaches (its kept drafts' and the one after) whose constraints allow no
    token: its request fails at that output token, as a plain step's would (Sampler._adjusted)."""
    for j in range(kept + 1):
        if row + j in dead_rows:
            seq.request.mark_dead_end(len(seq.request.output_token_ids) + j)
            return


def _processed(sampler: Sampler, logits: torch.Tensor, requests: list[Request], sequences: list[VerifyRows]):
    """The verify rows' logits as a plain step processes its row's, were the drafts before each row the output
    already: (under the grammar's mask, what a raw logprobs mode reports; then with the biases, refusals and
    penalties too, what the row samples from; the rows those leave no token)."""
    grammar = any(seq.request.grammar is not None for seq in sequences)  # a sequence's, not a row's each
    changes = any(Sampler.changes_logits(seq.request) for seq in sequences)
    if not (grammar or changes):
        return logits, logits, set()
    drafted = [seq.draft_token_ids[:j] for seq in sequences for j in range(len(seq.draft_token_ids) + 1)]
    dead_rows = set()
    if grammar:
        logits, dead = sampler.constrained_along_drafts(logits, requests, drafted)
        dead_rows.update(dead)
    processed = logits
    if changes:
        processed, dead = sampler.follow_drafts(logits, requests, drafted)
        dead_rows.update(dead)
    return logits, processed, dead_rows


def _sampled_verdicts(sampler: Sampler, logits: torch.Tensor, requests: list[Request], draft: torch.Tensor,
                      positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token should its draft be refused, and whether its draft holds, in a batch with sampled rows."""
    device = logits.device
    drawn = sampler.drawn_from(logits, requests)
    has_draft = draft >= 0
    greedy = to_device([r.params.temperature == 0 for r in requests], device, torch.bool)
    tokens = _residual_tokens(drawn, draft, has_draft, greedy, _seeds(sampler, requests, positions, 0))
    accepted = _accepted(drawn, draft, has_draft, greedy, _seeds(sampler, requests, positions, ACCEPT_STREAM))
    return tokens, accepted


def _residual_tokens(drawn: torch.Tensor, draft: torch.Tensor, has_draft: torch.Tensor, greedy: torch.Tensor,
                     seeds: torch.Tensor) -> torch.Tensor:
    """Each row's token should its draft be refused: a greedy row's argmax, a sampled row's draw from its
    distribution without the draft (a last row's from its whole distribution). `drawn` is already scaled and
    masked, so the draw takes temperature 1 and no masks."""
    rows = torch.arange(drawn.shape[0], device=drawn.device)
    residual = drawn.clone()
    residual[rows[has_draft], draft[has_draft]] = float("-inf")
    residual = torch.where(greedy[:, None], drawn, residual)  # a greedy row refuses a draft only off its argmax
    ones = torch.ones(drawn.shape[0], dtype=torch.float32, device=drawn.device)
    temperature = torch.where(greedy, 0.0, ones)
    no_masks = kernels.MaskPlan(greedy_rows=True, min_p=False)
    return kernels.sample_from_logits(residual, temperature, torch.zeros_like(rows), ones, torch.zeros_like(ones),
                                      seeds, mask=no_masks)


def _accepted(drawn: torch.Tensor, draft: torch.Tensor, has_draft: torch.Tensor, greedy: torch.Tensor,
              seeds: torch.Tensor) -> torch.Tensor:
    """Whether each row's draft holds: u < p(draft) for a sampled row, the argmax for a greedy one."""
    index = draft.clamp(min=0)[:, None]
    p_draft = torch.softmax(drawn, dim=-1).gather(1, index)[:, 0]
    is_argmax = drawn.argmax(-1) == draft
    u = uniforms(seeds, 1)[:, 0]
    return has_draft & torch.where(greedy, is_argmax, u < p_draft)


def _seeds(sampler: Sampler, requests: list[Request], positions: list[int], stream: int) -> torch.Tensor:
    """Each row's 63-bit seed: a seeded request's for (its sample, output position) in `stream`, else the
    engine generator's next."""
    seeds = [0 if r.params.temperature == 0 else sampler.generator.getrandbits(63) if r.params.seed is None
             else row_seed(r.params.seed + r.sample_index, stream, position)
             for r, position in zip(requests, positions)]
    return to_device(seeds, sampler.device, torch.int64)
