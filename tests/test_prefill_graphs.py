"""The layout of graph-replayed prefill passes, run eagerly on CPU: a pass padded with a padding
sequence and padding captures (what the GPU replays as a graph) gives what the unpadded pass gives,
and saves the same snapshots."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.runner.prefill_graphs import PrefillGraphs
from deltaserve.runner.step_buffers import StepBuffers
from tests.checkpoints import every_expert

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0)


def _with_padded_prefill_passes(llm: LLM, max_rows: int) -> list[tuple[int, bool, bool]]:
    """Gives the engine prefill graphs of up to max_rows rows that were never captured (so each pass runs its
    padded batch eagerly); returns a list that records (row count, whether it restored a snapshot, whether it
    copied a cached tail's KV block) of every such pass."""
    loaded = llm.engine.loaded
    runner = loaded.runner
    buffers = StepBuffers(llm.engine.config.max_num_seqs, -(-loaded.max_model_len // llm.engine.config.block_size),
                          runner.kv_pool, runner.state_pool, runner.device, max_prefill_rows=max_rows)
    graphs = PrefillGraphs(runner.model, buffers, runner.snapshots)
    passes, run = [], graphs.run

    def counted(host, captures, restore=None, kv_copy=None):
        passes.append((len(host.input_ids), restore is not None, kv_copy is not None))
        return run(host, captures, restore, kv_copy)

    graphs.run = counted
    runner.prefill_graphs = graphs
    return passes


def _generate(llm: LLM, prompt, points):
    engine = llm.engine
    request_id = f"r{random.random()}"
    engine.add_request(request_id, prompt, PARAMS, capture_points=points)
    while True:
        for out in engine.step():
            if out.finished:
                return out


def _logprobs(out):
    return torch.tensor([entry[t].logprob for entry, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids)])


def _snapshots(llm: LLM) -> dict:
    pool = llm.engine.loaded.snapshots
    return {name: (torch.stack([conv[slot] for conv in pool.conv.values()]),
                   torch.stack([h[slot] for h in pool.h.values()]))
            for name, slot in pool.index._slot_of.items()}


# Graphs up to 128 rows (the first turn's long pass runs eagerly) and up to 1024 (the whole ladder: it runs
# padded too, at a rung of 32 or 64 rows' step).
@pytest.mark.parametrize("arch,max_rows", [("qwen3.5", 128), ("qwen3.5-moe", 128), ("qwen3.5", 1024)])
def test_padded_prefill_passes_equal_unpadded_ones(arch, max_rows, checkpoint_factory):
    path = checkpoint_factory(arch, **every_expert(arch))  # the two agree to rounding only
    plain, padded = (LLM(path, device="cpu", max_num_batched_tokens=256) for _ in range(2))
    passes = _with_padded_prefill_passes(padded, max_rows)
    rng = random.Random()
    length = rng.randint(150, 220)
    length += (length + PARAMS.max_tokens - 1) % 16 == 0  # the first turn ends inside a block: a tail
    history = [rng.randrange(300) for _ in range(length)]
    message = [rng.randrange(300) for _ in range(rng.randint(20, 90))]
    outs = {}
    for name, llm in (("plain", plain), ("padded", padded)):
        first = _generate(llm, history, [0, 40])  # cold: a long pass, then a short one (padded)
        follow_up = history + first.outputs[0].token_ids + message
        # warm: one short pass from the first turn's tail (padded, with captures), then again
        outs[name] = (first, _generate(llm, follow_up, [0, len(history) + 6]), _generate(llm, follow_up, []))
    assert passes and all(n <= 124 for n, _, _ in passes) == (max_rows == 128)  # the long pass padded too
    # the warm passes restore from the first turn's tail inside the padded pass, its KV block copied there
    assert any(restored and copied for _, restored, copied in passes)
    for plain_out, padded_out in zip(outs["plain"], outs["padded"]):
        assert plain_out.outputs[0].token_ids == padded_out.outputs[0].token_ids
        assert plain_out.num_cached_tokens == padded_out.num_cached_tokens
        torch.testing.assert_close(_logprobs(padded_out), _logprobs(plain_out), rtol=0, atol=1e-4)
    saved, padded_saved = _snapshots(plain), _snapshots(padded)
    assert saved.keys() == padded_saved.keys()
    for name, (conv, h) in saved.items():
        torch.testing.assert_close(padded_saved[name][0], conv, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(padded_saved[name][1], h, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3.5-moe"])
def test_a_pass_that_fills_its_rung_equals_the_unpadded_one(arch, checkpoint_factory):
    """A prompt of exactly a rung's rows takes that rung, beside a padding sequence of no rows."""
    path = checkpoint_factory(arch, **every_expert(arch))
    plain, padded = (LLM(path, device="cpu", max_num_batched_tokens=256, enable_prefix_caching=False)
                     for _ in range(2))
    passes = _with_padded_prefill_passes(padded, 128)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.choice([16, 48, 64, 128]))]
    plain_out, padded_out = (_generate(llm, prompt, []) for llm in (plain, padded))
    graphs = padded.engine.loaded.runner.prefill_graphs
    assert passes[0][0] == len(prompt) and graphs.rung(len(prompt), []) == len(prompt)
    assert plain_out.outputs[0].token_ids == padded_out.outputs[0].token_ids
    torch.testing.assert_close(_logprobs(padded_out), _logprobs(plain_out), rtol=0, atol=1e-4)


def test_a_rung_longer_than_max_model_len_runs_its_capture_layout(checkpoint_factory):
    """Padding rows sit at position 0: the rotary table holds max_model_len positions, fewer than a rung's rows."""
    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu", max_model_len=40, max_num_batched_tokens=256,
              enable_prefix_caching=False)  # a graph's capture table lives on the device
    _with_padded_prefill_passes(llm, 128)
    graphs = llm.engine.loaded.runner.prefill_graphs
    batch = graphs.capture_batch(128)
    assert int(batch.positions.max()) < 40
    with torch.inference_mode():
        hidden = graphs._forward(batch)
    assert hidden.shape == (1, graphs.model.config.hidden_size) and torch.isfinite(hidden).all()


def test_only_the_chunk_that_samples_runs_the_lm_head_after_its_pass(checkpoint_factory):
    """A prompt longer than the step budget prefills in chunks, each a padded pass; the passes end at the last
    row's hidden state, and the LM head runs for the last chunk alone, as eagerly."""
    path = checkpoint_factory("qwen3.5")
    plain, padded = (LLM(path, device="cpu", max_num_batched_tokens=48, enable_prefix_caching=False)
                     for _ in range(2))
    passes = _with_padded_prefill_passes(padded, 64)
    model = padded.engine.loaded.runner.model
    heads, compute_logits = [], model.compute_logits
    model.compute_logits = lambda hidden: heads.append(len(passes)) or compute_logits(hidden)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(97, 140))]
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=0)
    plain_out, padded_out = (llm.generate([prompt], params)[0] for llm in (plain, padded))
    tail = len(prompt) - 96
    # a last chunk of one token plans as a decode step (see ModelRunner._prepare_states), no prefill pass
    chunks = [48, 48] + ([tail] if tail > 1 else [])
    assert [n for n, _, _ in passes] == chunks
    assert heads == [len(chunks)]  # once, after the last pass
    assert plain_out.outputs[0].token_ids == padded_out.outputs[0].token_ids
    torch.testing.assert_close(_logprobs(padded_out), _logprobs(plain_out), rtol=0, atol=1e-4)


def test_the_ladder_steps_16_rows_to_128_then_32_to_256_then_64_to_1024_then_128_to_a_2048_token_step():
    from deltaserve.runner.prefill_graphs import MAX_ROWS, prefill_graph_rows, prefill_ladder

    rungs = prefill_ladder(MAX_ROWS)
    assert MAX_ROWS == 2048 and rungs[-1] == 2048 and rungs == sorted(set(rungs))
    steps = {b - a for a, b in zip([0] + rungs, rungs)}
    assert steps == {16, 32, 64, 128}
    assert all(b - a <= max(16, a // 4) for a, b in zip(rungs, rungs[1:]))  # padding at most a quarter past 16
    assert prefill_ladder(300) == [r for r in rungs if r <= 300] and prefill_ladder(100)[-1] == 96
    # the graphs a step budget needs: a pass of the whole budget, which may fill its rung
    assert prefill_graph_rows(2048) == 2048 and prefill_graph_rows(2047) == 2048 and prefill_graph_rows(100) == 112
    assert prefill_graph_rows(1024) == 1024 and prefill_graph_rows(8192) == MAX_ROWS and prefill_graph_rows(1) == 16
    buffers = StepBuffers(4, 64, None, None, torch.device("cpu"), max_prefill_rows=MAX_ROWS)
    graphs = PrefillGraphs(None, buffers)
    assert graphs.rung(128, []) == 128 and graphs.rung(129, []) == 160 and graphs.rung(300, []) == 320
    assert graphs.rung(512, []) == 512 and graphs.rung(513, []) == 576 and graphs.rung(1024, []) == 1024
    assert graphs.rung(1025, []) == 1152 and graphs.rung(2048, []) == 2048 and graphs.rung(2049, []) is None
    # buffers with fewer rows than the first rung: no graph, nothing to capture
    small = PrefillGraphs(None, StepBuffers(16, 8, None, None, torch.device("cpu"), max_prefill_rows=8))
    assert small.sizes == [] and small.rung(4, []) is None
    small.capture(None)
    assert small.graphs == {}


def test_a_pass_takes_the_smallest_rung_with_room_for_its_rows():
    buffers = StepBuffers(4, 8, None, None, torch.device("cpu"), max_prefill_rows=64)
    graphs = PrefillGraphs(None, buffers)
    assert graphs.sizes == [16, 32, 48, 64]
    assert graphs.rung(12, []) == 16  # unused captures name rows past the pass: they take no room
    assert graphs.rung(15, [(1, 0), (2, 1), (3, 2), (4, 3)]) == 16  # one padding row
    assert graphs.rung(16, []) == 16 and graphs.rung(17, []) == 32  # the padding sequence may be empty
    assert graphs.rung(64, []) == 64 and graphs.rung(65, []) is None  # past the last rung: eager
    assert graphs.rung(8, [(1, 0)] * 5) is None  # more captures than the graphs hold
    assert graphs.rung(8, [(1, 0), (1, 1)]) is None  # one row captured twice


def test_the_warm_ups_short_pass_runs_eagerly_where_a_plain_prompt_of_its_rows_takes_a_graph(checkpoint_factory):
    """The warm-up's EAGER_SHORT_PASS asks for prompt logprobs, which no prefill graph computes: its pass runs
    eagerly (its kernels' eager specializations compile at start-up), where the same rows as a plain prompt
    replay a graph."""
    from deltaserve.engine.warm_up import EAGER_SHORT_PASS, warm_up

    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu", max_num_batched_tokens=256, enable_prefix_caching=False)
    passes = _with_padded_prefill_passes(llm, 1024)
    assert warm_up(llm.engine, [EAGER_SHORT_PASS]) == 1 and passes == []
    rows = sum(EAGER_SHORT_PASS)
    llm.generate([[random.randrange(300) for _ in range(rows)]], SamplingParams(max_tokens=1, temperature=0))
    assert [n for n, _, _ in passes] == [rows]
