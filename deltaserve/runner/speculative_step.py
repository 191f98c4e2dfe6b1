"""SpeculativeStep: how a ModelRunner runs a step where the MTP head drafts (speculative decoding).

One pass of the target model computes the plan's rows, a verify chunk's rows included: the last token and its
drafts, each row sampling (draft_verifier.py keeps the drafts up to the first one refuted, and the token that row
gives). The GDN layers leave the recurrent states of the verify chunks as they were and keep their rows' inputs in
a GdnStash; once the verdicts are in, one launch advances each state through the rows its sequence kept
(gdn_stash.py), so its state covers exactly its tokens. The conv kernel writes the conv state after each verify row
but the last into conv-only verify slots (captures, as the prefix cache's mid-chunk snapshots are written), and a
sequence whose drafts were not all kept gets its conv state back from the slot of its last kept row. Its KV past
them is written over by the next step. Then the MTP head reads the kept rows and drafts for the next step
(mtp_drafter.py).

A step of decoding sequences alone, each its last token and up to k drafts (the steady state of decoding),
replays a verify graph (verify_graphs.py) with every sequence padded to k + 1 rows, the sampling runs eagerly after
it and the head drafts in a graph of its own (mtp_graphs.py). One prompt chunk, alone or beside such sequences,
runs as its prefill graph after their verify graph (the head then drafts eagerly, reading the chunk's rows from
the prefill graph, which keeps every row's hidden state for it). Prompt lookup reads no hidden states, so its
steps with no drafts to verify run as a plain engine's (decode graphs, a prompt chunk's prefill graph beside
them, or one eager pass: ModelRunner.execute_plain). Any other step runs eagerly. The step's tokens are read back
before the next is planned.
"""

from __future__ import annotations

import torch

from deltaserve.cache.snapshot_pool import SnapshotPool
from deltaserve.engine.step_plan import ScheduledChunk, StepPlan
from deltaserve.host_to_device import columns_to_device, to_device
from deltaserve.kernels.capture_rows import CaptureRows
from deltaserve.runner.batch_builder import HostBatch, build_host_batch
from deltaserve.runner.draft_verifier import Verdicts, VerifyRows, verify_sequences
from deltaserve.runner.gdn_stash import GdnStash
from deltaserve.runner.mtp_drafter import DraftRequest, MtpDrafter
from deltaserve.runner.ngram_drafter import NgramDrafter
from deltaserve.runner.sampler import Sampler
from deltaserve.runner.snapshot_steps import mid_chunk_capture_rows, restore_pairs
from deltaserve.runner.verify_graphs import VerifyGraphs


class SpeculativeStep:
    def __init__(self, drafter: MtpDrafter | NgramDrafter, verify_states: SnapshotPool | None,
                 num_speculative_tokens: int, graphs: VerifyGraphs | None = None, stash: GdnStash | None = None):
        self.drafter = drafter
        # the conv-only verify slots and the stash of the verify rows' GDN inputs; None without GDN layers
        self.verify_states = verify_states
        self.stash = stash
        self.num_speculative_tokens = num_speculative_tokens
        self.graphs = graphs  # None: every step runs eagerly

    def execute(self, runner, plan: StepPlan):
        if not self.drafter.reads_hidden and not any(c.draft_token_ids for c in plan.chunks):
            return self._plain_step(runner, plan)
        # one prompt chunk, alone or beside decoding sequences that a verify graph holds, as a plain step splits
        split = runner.graph_passes(plan, self.graphs.replayable) if self.graphs is not None else None
        if split is not None:
            return self._execute_split(runner, plan, *split)
        sampling = [c for c in plan.chunks if c.samples]
        host = build_host_batch(plan, runner.block_size)
        prompt_logprobs, rung = {}, None
        if self.graphs is not None and self.graphs.replayable(plan):
            runner._prepare_states(plan, restore_pairs(plan))
            logits, hidden = self.graphs.run(host)
            rung = self.graphs.last_size
            layout = RowLayout.padded(plan, self.graphs.rows_per_seq)
        else:
            layout = RowLayout.eager(plan, host)
            hidden, logits_indices, prompt_logprobs = self._eager_pass(runner, plan, host, layout)
            logits = runner.model.compute_logits(hidden[logits_indices]) if sampling else None
        return self._verify(runner, plan, logits, hidden, layout, rung, prompt_logprobs, graph_seqs=rung)

    def _verify(self, runner, plan: StepPlan, logits, hidden, layout: RowLayout, rung: int | None = None,
                prompt_logprobs: dict | None = None, graph_seqs: int | None = None):
        """Samples the step's rows (verdicts on the drafts), commits the verify chunks' GDN states through their
        kept rows and sets refuted sequences' conv states back, saves the step's snapshots and drafts for the next
        step. graph_seqs: the sequences of the verify graph that ran the verify chunks (None: an eager pass)."""
        from deltaserve.runner.model_runner import StepResult

        sampling = [c for c in plan.chunks if c.samples]
        tokens, logprobs, accepted, set_back, draft_logprobs = self._sample(runner.sampler, logits, sampling, layout)
        if self.stash is not None:
            if set_back:
                self.verify_states.restore_conv(set_back, runner.state_pool)
            self._commit(runner, layout, accepted, graph_seqs or len(plan.chunks))
        runner._save_snapshots(plan)  # a padded sequence's state is its own once set back
        drafts = self.drafter.propose(hidden, self._draft_rows(plan, layout.pass_row, sampling, tokens), rung)
        return StepResult(sampling, tokens, logprobs, prompt_logprobs or {}, accepted, drafts, draft_logprobs)

    def _commit(self, runner, layout: RowLayout, accepted: dict, step_seqs: int) -> None:
        """Each verify chunk's recurrent states (sequence i of the stash is verify chunk i) through its kept rows:
        its kept drafts and the row before them. step_seqs: the sequences of the pass that ran the rows."""
        chunks = sorted(layout.verify_index, key=layout.verify_index.get)
        kept_rows = [len(accepted.get(c, ())) + 1 for c in chunks]
        self.stash.commit(runner.state_pool.h_all, [c.request.state_slot for c in chunks], kept_rows,
                          self.num_speculative_tokens + 1, step_seqs)

    def _plain_step(self, runner, plan: StepPlan):
        """Prompt lookup's step with no drafts to verify runs as a plain engine's does (its decode graph, its
        decode rows' graph and its prompt chunk's, or one eager pass), then drafts: the lookup reads no hidden
        states."""
        result = runner.execute_plain(plan)
        result.drafts = self.drafter.propose(None, self._draft_rows(plan, {}, result.sampling, result.tokens))
        return result

    def _execute_split(self, runner, plan: StepPlan, decoding: StepPlan | None, prefill: StepPlan, captures: list):
        """The decoding sequences' verify graph, then the prompt chunk's prefill graph (which restores its
        sequence's snapshot and copies its KV tail itself), over the same buffers one after the other; the
        chunk's logits row, where it samples, follows the verify rows, and its hidden states follow theirs. The
        MTP head drafts eagerly over both passes' rows at once: its drafting graph would read the verify step's
        layout from the buffers, which the prefill graph's has replaced."""
        runner._prepare_states(plan, [], copy_blocks=False)
        logits, hidden = None, None
        layout = RowLayout()
        if decoding is not None:
            logits, hidden = self.graphs.run(build_host_batch(decoding, runner.block_size))
            layout = RowLayout.padded(decoding, self.graphs.rows_per_seq)
        chunk = prefill.chunks[0]
        prompt_hidden = runner.run_prefill_graph(prefill, captures)  # its last row's, or every row's for the head
        layout.pass_row[chunk] = 0 if hidden is None else hidden.shape[0]
        if self.drafter.reads_hidden:
            hidden = prompt_hidden if hidden is None else torch.cat([hidden, prompt_hidden])
        if chunk.samples:
            chunk_logits = runner.model.compute_logits(prompt_hidden[-1:])
            layout.add_plain_row(chunk, 0 if logits is None else logits.shape[0])
            logits = chunk_logits if logits is None else torch.cat([logits, chunk_logits])
        graph_seqs = self.graphs.last_size if decoding is not None else None
        return self._verify(runner, plan, logits, hidden, layout, graph_seqs=graph_seqs)

    def _eager_pass(self, runner, plan: StepPlan, host: HostBatch, layout: RowLayout):
        """The target's final hidden states of every row (the MTP head reads them all), the rows that sample (on
        the device), and prompt logprobs."""
        runner._prepare_states(plan, restore_pairs(plan))
        batch = runner.to_forward_batch(host, plan.is_decode)
        captures = mid_chunk_capture_rows(plan) if runner.snapshots is not None else []
        verify_captures = self._verify_captures(layout)
        if captures or verify_captures:
            batch.capture_rows, batch.snapshot_pool = CaptureRows(captures), self.verify_states
            if verify_captures:  # the conv states' alone
                batch.conv_capture_rows = CaptureRows(captures + verify_captures)
        if self.stash is not None and layout.verify_index:
            batch.gdn_stash = self.stash
            batch.stash_rows, batch.store_state = self._stash_rows(plan, layout, batch.input_ids.device)
        hidden = runner.model(batch.input_ids, batch)
        prompt_logprobs = {}
        if any(c.request.params.prompt_logprobs is not None for c in plan.chunks):
            prompt_logprobs = runner._prompt_logprobs(plan, host, hidden)
        return hidden, batch.logits_indices, prompt_logprobs

    def _stash_rows(self, plan: StepPlan, layout: RowLayout, device) -> tuple[torch.Tensor, torch.Tensor]:
        """An eager pass's stash rows (verify chunk i's k + 1 from i * (k + 1), its last row repeated past its
        own) as rows of the pass, and its sequences' say on writing their GDN states back (a verify chunk's waits
        for its verdicts)."""
        per = self.num_speculative_tokens + 1
        rows = [0] * (len(layout.verify_index) * per)
        for chunk, index in layout.verify_index.items():
            first, count = layout.pass_row[chunk], len(chunk.draft_token_ids) + 1
            rows[index * per : (index + 1) * per] = [first + min(j, count - 1) for j in range(per)]
        stores = [0 if chunk in layout.verify_index else 1 for chunk in plan.chunks]
        rows, stores = columns_to_device([rows, stores], device)
        return rows, stores

    def _verify_captures(self, layout: RowLayout) -> list[tuple[int, int]]:
        """(row, verify slot): the conv state after each verify row but the last, slot j of its chunk's k."""
        if self.verify_states is None:
            return []
        return [(layout.pass_row[chunk] + j, self._verify_slot(index, j))
                for chunk, index in layout.verify_index.items() for j in range(len(chunk.draft_token_ids))]

    def _sample(self, sampler: Sampler, logits, sampling: list[ScheduledChunk], layout: RowLayout):
        """Each sampling chunk's token (a verify chunk's after its kept drafts), the logprobs of plain rows where
        asked, {verify chunk: its kept drafts}, and (verify slot, state slot) for each sequence whose state went
        past its kept rows (drafts refuted, or a padded layout's rows past its own): the state after its last kept
        row. A verify chunk is cut to its kept rows."""
        plain = [c for c in sampling if not c.draft_token_ids]
        verify_chunks = [c for c in sampling if c.draft_token_ids]
        by_chunk, plain_logprobs = {}, None
        if plain:
            rows = [layout.first_row[c] for c in plain]
            index = slice(None) if len(rows) == logits.shape[0] else rows  # every row is a plain chunk's
            plain_tokens, plain_logprobs = sampler(logits[index], [c.request for c in plain])
            by_chunk = dict(zip(plain, plain_tokens))
        verify = [VerifyRows(c.request, layout.first_row[c], list(c.draft_token_ids)) for c in verify_chunks]
        verdicts = verify_sequences(sampler, logits, verify)
        accepted = {}
        for chunk, kept in zip(verify_chunks, verdicts.taken):
            accepted[chunk] = kept[:-1]
            by_chunk[chunk] = kept[-1]
        set_back = self._set_back(sampling, layout, {c: len(accepted.get(c, ())) + 1 for c in sampling})
        for chunk in verify_chunks:
            chunk.keep_verified(len(accepted[chunk]))
        entries = dict(zip(plain, plain_logprobs)) if plain_logprobs is not None else {}
        draft_logprobs = self._verified_logprobs(sampler, verify, verify_chunks, verdicts)
        for chunk, chunk_entries in draft_logprobs.items():
            entries[chunk] = chunk_entries.pop()  # the chunk's own token's; its kept drafts' stay
        logprobs = [entries.get(c) for c in sampling] if entries else None
        return [by_chunk[c] for c in sampling], logprobs, accepted, set_back, draft_logprobs

    def _set_back(self, sampling: list[ScheduledChunk], layout: RowLayout, kept_rows: dict) -> list[tuple[int, int]]:
        """(verify slot, state slot) for each sequence that ran more rows than it keeps."""
        if self.verify_states is None:
            return []
        return [(self._verify_slot(layout.verify_index[c], kept_rows[c] - 1), c.request.state_slot)
                for c in sampling if kept_rows[c] < layout.rows[c]]

    @staticmethod
    def _verified_logprobs(sampler: Sampler, verify: list[VerifyRows], chunks, verdicts: Verdicts) -> dict:
        """{verify chunk: the logprob entries of its kept drafts and its token, each read off its own row of the
        logits the verdicts report} for requests asking logprobs."""
        asking = [(seq, chunk, kept, first) for seq, chunk, kept, first
                  in zip(verify, chunks, verdicts.taken, verdicts.first_rows) if seq.request.params.returns_logprobs]
        if not asking:
            return {}
        rows = [first + j for _, _, kept, first in asking for j in range(len(kept))]
        tokens = [t for _, _, kept, _ in asking for t in kept]
        requests = [seq.request for seq, _, kept, _ in asking for _ in kept]
        reported = verdicts.reported[to_device(rows, verdicts.reported.device)]
        entries = sampler.logprob_entries(reported, tokens, requests)
        out, at = {}, 0
        for _, chunk, kept, _ in asking:
            out[chunk] = entries[at : at + len(kept)]
            at += len(kept)
        return out

    def _verify_slot(self, verify_index: int, row: int) -> int:
        """The slot of the state after row `row` of the step's verify chunk `verify_index`."""
        return self.verify_states.first_verify_slot + verify_index * self.num_speculative_tokens + row

    @staticmethod
    def _draft_rows(plan: StepPlan, pass_row: dict, sampling, tokens) -> list[DraftRequest]:
        """Each chunk as the drafter reads it; `pass_row`: each chunk's first row of the step's hidden states
        (empty where the drafter reads none)."""
        sampled = dict(zip(sampling, tokens))
        rows = []
        for chunk in plan.chunks:
            request = chunk.request
            following = sampled[chunk] if chunk in sampled else request.token_at(chunk.end)
            rows.append(DraftRequest(chunk, pass_row.get(chunk), following, chunk in sampled))
        return rows


class RowLayout:
    """Where a step's chunks lie: `pass_row`, each chunk's first row in the pass (its hidden states); for a
    sampling chunk, `first_row`, its first row of the step's logits, `rows`, the rows its state went through, and
    `verify_index`, whose verify slots hold the states after them (SpeculativeStep._verify_slot)."""

    def __init__(self):
        self.pass_row: dict = {}
        self.first_row: dict = {}
        self.rows: dict = {}
        self.verify_index: dict = {}

    @classmethod
    def eager(cls, plan: StepPlan, host: HostBatch) -> RowLayout:
        """An eager pass: the chunks' own rows; logits for the sampling chunks' rows alone; verify slots for the
        chunks with drafts, in order."""
        layout, logits_row, verify_index = cls(), 0, 0
        for chunk, first in zip(plan.chunks, host.query_start_loc):
            layout.pass_row[chunk] = first
            if not chunk.samples:
                continue
            layout.first_row[chunk] = logits_row
            layout.rows[chunk] = len(chunk.draft_token_ids) + 1
            logits_row += layout.rows[chunk]
            if chunk.draft_token_ids:
                layout.verify_index[chunk] = verify_index
                verify_index += 1
        return layout

    def add_plain_row(self, chunk: ScheduledChunk, logits_row: int) -> None:
        """A prompt chunk beside a verify graph's rows, run as its own pass: its one logits row."""
        self.first_row[chunk] = logits_row
        self.rows[chunk] = 1

    @classmethod
    def padded(cls, plan: StepPlan, per: int) -> RowLayout:
        """A verify graph's: sequence b's `per` rows from b * per, every one turned into logits and each but the
        last captured into verify slot b * (per - 1) + j."""
        layout = cls()
        for b, chunk in enumerate(plan.chunks):
            layout.pass_row[chunk] = layout.first_row[chunk] = b * per
            layout.rows[chunk] = per
            layout.verify_index[chunk] = b
        return layout
