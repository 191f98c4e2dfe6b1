"""kv_cache_memory_bytes (vLLM's --kv-cache-memory-bytes) sizes the caches: the KV pool, and on a GDN model its
state and snapshot slots too, take the bytes given and no more (here on the CPU, where they replace
cpu_kv_cache_gib as they replace gpu_memory_utilization on a GPU); a budget too small is refused naming it."""

from __future__ import annotations

import logging
import random

import pytest

from deltaserve import LLM
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.errors import DeltaServeError
from deltaserve.runner.gdn_stash import GdnStash

CONTEXT = 512  # tests/checkpoints.py's max_position_embeddings


def _engine(path: str, **settings) -> LLMEngine:
    return LLMEngine.from_args(path, device="cpu", max_num_seqs=2, **settings)


def _bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _kv_block_bytes(engine: LLMEngine) -> int:
    return _bytes(engine.runner.kv_pool.kv) // engine.loaded.blocks.num_blocks


def _cache_bytes(engine: LLMEngine) -> int:
    """Every byte the caches hold: the KV pool, the GDN state slots and the snapshot slots."""
    total = _bytes(engine.runner.kv_pool.kv)
    states, snapshots = engine.runner.state_pool, engine.loaded.snapshots
    if states is not None:
        total += _bytes(states.conv_all, states.h_all)
    if snapshots is not None:
        total += _bytes(snapshots._tensors.conv_all, snapshots._tensors.h_all)
    return total


def test_the_kv_pool_takes_the_bytes_given(checkpoint_factory):
    """The llama checkpoint's block of 16 tokens is 16 KiB: a budget under the two full-length sequences that
    cap the pool fills all but what is left of a block, and an unset max_model_len fits what it holds."""
    path = checkpoint_factory("llama")
    per_block = _kv_block_bytes(_engine(path, num_kv_blocks=4))
    budget = random.randint(3 * per_block, 60 * per_block)
    engine = _engine(path, kv_cache_memory_bytes=budget)
    assert budget - per_block < _cache_bytes(engine) <= budget
    assert engine.loaded.blocks.num_blocks == budget // per_block
    assert engine.max_model_len == min(CONTEXT, budget // per_block * 16)
    default = _engine(path)  # cpu_kv_cache_gib's 1 GiB: two whole contexts, the cap
    assert default.loaded.blocks.num_blocks == 2 * CONTEXT // 16


@pytest.mark.parametrize("snapshot_slots", [None, 3])
def test_a_gdn_models_state_and_snapshots_come_out_of_the_budget(checkpoint_factory, snapshot_slots):
    """As vLLM's mamba state pages share its KV budget: the state slots (one a sequence, one for a graph's
    padded rows), the snapshot slots (a tenth of what the state leaves, unless given) and the KV pool together
    hold the budget less what is left of a KV block."""
    path = checkpoint_factory("qwen3.5")
    probe = _engine(path, num_kv_blocks=4, ssm_snapshot_slots=0)
    per_block, state = _kv_block_bytes(probe), _bytes(probe.runner.state_pool.conv_all, probe.runner.state_pool.h_all)
    per_slot = state // 3
    room = ((snapshot_slots or 0) + 1) * per_slot  # the snapshot slots given, and the padding slot
    budget = state + room + random.randint(10 * per_block, 40 * per_block)
    engine = _engine(path, kv_cache_memory_bytes=budget, ssm_snapshot_slots=snapshot_slots)
    assert budget - per_block < _cache_bytes(engine) <= budget
    expected_snapshots = snapshot_slots
    if snapshot_slots is None:
        expected_snapshots = min(int((budget - state) * 0.1 // per_slot), 4 * 2)
    assert engine.loaded.snapshots.num_slots == expected_snapshots
    assert engine.loaded.blocks.num_blocks == (budget - state - (expected_snapshots + 1) * per_slot) // per_block


def test_a_drafting_gdn_models_verify_rows_take_conv_states_and_their_inputs_from_the_budget(checkpoint_factory,
                                                                                               caplog):
    """With drafts, the conv state after each of a sequence's k verify rows but the last has a slot (to go back to
    where a draft is refuted), and every verify row's GDN inputs a row of the stash, through which the verdicts
    commit the recurrent states: no recurrent state is held for a verify row. Both come out of the budget."""
    path = checkpoint_factory("qwen3.5")
    k, seqs = random.randint(1, 4), 2
    drafts = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    probe = _engine(path, num_kv_blocks=4, ssm_snapshot_slots=0)
    per_block, states = _kv_block_bytes(probe), probe.runner.state_pool
    state = _bytes(states.conv_all, states.h_all)
    conv_slot = _bytes(states.conv_all) // (seqs + 1)
    probe_stash = GdnStash.of(probe.runner.model, list(states.h), 1)
    stash_row = _bytes(probe_stash.kv, probe_stash.ba)
    padding = state // (seqs + 1)  # the snapshot pool's padding slot, conv and recurrent state
    verify = seqs * k * conv_slot + seqs * (k + 1) * stash_row
    budget = state + padding + verify + random.randint(10 * per_block, 40 * per_block)
    with caplog.at_level(logging.INFO, logger="deltaserve.engine.model_setup"):
        engine = _engine(path, kv_cache_memory_bytes=budget, speculative_config=drafts, ssm_snapshot_slots=0)
    assert f"{seqs * k} conv-only verify slots and a stash of their GDN inputs" in caplog.text  # the load line
    pool, stash = engine.runner.speculative.verify_states._tensors, engine.runner.speculative.stash
    assert pool.h_all.shape[1] == 1 and pool.conv_all.shape[1] == 1 + seqs * k  # the padding slot, the verify rows
    assert stash.kv.shape[1] == stash.ba.shape[1] == seqs * (k + 1)
    held = _cache_bytes(engine) + _bytes(stash.kv, stash.ba)
    assert budget - per_block < held <= budget
    assert engine.loaded.blocks.num_blocks == (budget - state - padding - verify) // per_block


def test_a_budget_too_small_is_refused_naming_it(checkpoint_factory):
    llama, hybrid = checkpoint_factory("llama"), checkpoint_factory("qwen3.5")
    per_block = _kv_block_bytes(_engine(llama, num_kv_blocks=4))
    short = random.randint(per_block, CONTEXT // 16 * per_block - 1)  # a block at least, not a whole context
    with pytest.raises(DeltaServeError, match=f"max_model_len={CONTEXT} needs {CONTEXT} KV slots.*as "
                                              f"kv_cache_memory_bytes={short} sizes it.*raise kv_cache_memory_bytes"):
        _engine(llama, kv_cache_memory_bytes=short, max_model_len=CONTEXT)
    with pytest.raises(DeltaServeError, match=f"kv_cache_memory_bytes={per_block - 1} leaves .* less than one block"):
        _engine(llama, kv_cache_memory_bytes=per_block - 1)
    probe = _engine(hybrid, num_kv_blocks=4, ssm_snapshot_slots=0).runner.state_pool
    state = _bytes(probe.conv_all, probe.h_all)
    with pytest.raises(DeltaServeError, match=f"kv_cache_memory_bytes={state - 1} is too small for the GDN state "
                                              "of max_num_seqs=2 sequences .* lower max_num_seqs"):
        _engine(hybrid, kv_cache_memory_bytes=state - 1)
    with pytest.raises(DeltaServeError, match="is too small for 100 GDN state snapshots .* after the GDN state\\); "
                                              "raise kv_cache_memory_bytes or lower ssm_snapshot_slots"):
        _engine(hybrid, kv_cache_memory_bytes=state + 10 * per_block, ssm_snapshot_slots=100)


def test_the_pools_other_sizing_errors_name_their_setting(checkpoint_factory):
    """num_kv_blocks names itself, and the CPU's budget cpu_kv_cache_gib (they said num_kv_blocks, unset, or
    nothing)."""
    path = checkpoint_factory("llama")
    with pytest.raises(DeltaServeError, match="as num_kv_blocks=2 sizes it.*raise num_kv_blocks"):
        _engine(path, num_kv_blocks=2, max_model_len=CONTEXT)
    with pytest.raises(DeltaServeError, match="as cpu_kv_cache_gib=3e-05 sizes it.*raise cpu_kv_cache_gib"):
        _engine(path, cpu_kv_cache_gib=3e-5, max_model_len=CONTEXT)  # one block of 16 KiB
    with pytest.raises(DeltaServeError, match="no memory is left .*cpu_kv_cache_gib=1e-05\\); raise cpu_kv_cache_gib"):
        _engine(path, cpu_kv_cache_gib=1e-5)


def test_num_kv_blocks_overrides_the_budgets_block_count(checkpoint_factory):
    """As vLLM's num_gpu_blocks_override over its kv_cache_memory_bytes."""
    blocks = random.randint(33, 64)
    engine = _engine(checkpoint_factory("llama"), num_kv_blocks=blocks, kv_cache_memory_bytes=10**6)
    assert engine.loaded.blocks.num_blocks == blocks


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8G"])
def test_a_budget_that_is_no_positive_number_of_bytes_is_named(value):
    with pytest.raises(DeltaServeError, match=f"kv_cache_memory_bytes={value!r}: must be a positive number"):
        LLM("unused", kv_cache_memory_bytes=value)


def test_vllms_llm_takes_the_keyword(checkpoint_factory):
    path = checkpoint_factory("llama")
    per_block = _kv_block_bytes(_engine(path, num_kv_blocks=4))
    blocks = random.randint(3, 30)
    llm = LLM(path, device="cpu", max_num_seqs=2, kv_cache_memory_bytes=blocks * per_block + per_block // 2)
    assert llm.engine.loaded.blocks.num_blocks == blocks
