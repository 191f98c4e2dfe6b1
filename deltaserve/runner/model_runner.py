"""ModelRunner: executes a StepPlan — builds the flat batch, runs the model, samples."""

from __future__ import annotations

import torch

from deltaserve.cache.kv_pool import KVPool
from deltaserve.cache.state_pool import StatePool
from deltaserve.engine.step_plan import StepPlan
from deltaserve.models.decoder import DecoderLM
from deltaserve.runner.batch_builder import build_host_batch, pad_block_tables, to_device
from deltaserve.runner.forward_batch import ForwardBatch
from deltaserve.runner.sampler import Sampler


class ModelRunner:
    def __init__(self, model: DecoderLM, kv_pool: KVPool | None, state_pool: StatePool | None, block_size: int,
                 device: torch.device, sampler: Sampler):
        self.model = model
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.block_size = block_size
        self.device = device
        self.sampler = sampler

    @torch.inference_mode()
    def execute(self, plan: StepPlan):
        """Runs one step. Returns (sampling chunks, their token ids, their logprobs or None)."""
        if self.state_pool is not None:
            self.state_pool.reset(plan.reset_state_slots)
        batch = self.build_batch(plan)
        hidden = self.model(batch.input_ids, batch)
        sampling = [c for c in plan.chunks if c.samples]
        if not sampling:
            return [], [], None
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        tokens, logprobs = self.sampler(logits, [c.request for c in sampling])
        return sampling, tokens, logprobs

    def build_batch(self, plan: StepPlan) -> ForwardBatch:
        host = build_host_batch(plan, self.block_size)
        dev = lambda values: to_device(values, self.device)  # noqa: E731
        return ForwardBatch(
            input_ids=dev(host.input_ids),
            positions=dev(host.positions),
            query_start_loc=dev(host.query_start_loc),
            seq_lens=dev(host.seq_lens),
            block_tables=dev(pad_block_tables(host.block_tables)),
            slot_mapping=dev(host.slot_mapping),
            state_slots=dev(host.state_slots),
            logits_indices=dev(host.logits_indices),
            is_decode=plan.is_decode,
            kv_pool=self.kv_pool,
            state_pool=self.state_pool,
        )
