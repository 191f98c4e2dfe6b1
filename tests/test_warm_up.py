"""The start-up warm-up: one prefill step for each (sequence count, row count) class of the kernels,
and an engine that warmed up serves what one that did not serves, with nothing of the warm-up left."""

import random

import pytest

from deltaserve import SamplingParams
from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.engine.warm_up import warm_up, warm_up_groups


def _pow2_at_least_16(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


@pytest.mark.parametrize("max_num_seqs,budget", [(256, 2048), (8, 512), (128, 8192), (1024, 4096)])
def test_warm_up_groups_fit_one_step_and_cover_every_class(max_num_seqs, budget):
    groups = warm_up_groups(max_num_seqs, budget, max_model_len=4096)
    for lengths in groups:  # a longer prompt in each: a step of one-token prompts alone runs as decode
        assert len(lengths) <= max_num_seqs and sum(lengths) <= budget and max(lengths) >= 2
        # and two where there are one-token ones: beside one, they would run as two graphs (mixed split)
        assert len(lengths) == 1 or sum(n > 1 for n in lengths) >= 2, lengths
    # The GDN dispatch's row classes (token loop, 16-row chunks, 64-row chunks), with one sequence.
    single = {sum(g) for g in groups if len(g) == 1}
    assert any(r <= 16 for r in single) and any(16 < r <= 128 for r in single) and any(r > 128 for r in single)
    # and a pass of 16-row chunks that no prefill graph takes (a graph's kernels read the step buffers): one that
    # asks for prompt logprobs
    from deltaserve.engine.warm_up import EAGER_SHORT_PASS
    from deltaserve.kernels import SHORT_CHUNK_MAX_ROWS

    assert EAGER_SHORT_PASS in groups and 16 < sum(EAGER_SHORT_PASS) <= SHORT_CHUNK_MAX_ROWS
    # and, where the budget holds a first prompt long enough for the dense attention of fresh prompts (past
    # the prefill graphs' last rung), such a step: its attention's library starts before serving does
    from deltaserve.runner.model_runner import FRESH_PREFILL_MIN_TOKENS
    from deltaserve.runner.prefill_graphs import MAX_ROWS

    assert FRESH_PREFILL_MIN_TOKENS > MAX_ROWS
    fresh = [g for g in groups if max(g) >= FRESH_PREFILL_MIN_TOKENS]
    assert bool(fresh) == (budget >= FRESH_PREFILL_MIN_TOKENS), fresh
    # Every power-of-two class of the sequence count that a step can hold, with a count that is a
    # multiple of 16 and one that is not (Triton specializes integer arguments on both).
    counts = {len(g) for g in groups}
    largest = min(max_num_seqs, budget // 3)  # the most two- and three-token prompts a step takes
    for block in {_pow2_at_least_16(n) for n in range(1, largest + 1)}:
        in_class = {n for n in counts if _pow2_at_least_16(n) == block}
        assert any(n % 16 == 0 for n in in_class) or block > largest, (block, in_class)
        assert any(n % 16 for n in in_class), (block, in_class)


def test_warm_up_groups_cover_many_sequences_in_a_pass_of_16_row_chunks():
    """Up to 128 rows over up to 111 sequences, one of them past the token loop's rows (a pass whose sequences
    are all within them takes the loop), as when decode rows share a step with a short chunk: each
    power-of-two class of the sequence count, as a multiple of 16 and not."""
    from deltaserve.kernels import TOKEN_LOOP_MAX_ROWS

    groups = warm_up_groups(256, 2048, max_model_len=4096)
    counts = {len(g) for g in groups if 16 < sum(g) <= 128 and max(g) > TOKEN_LOOP_MAX_ROWS}
    for block in (16, 32, 64, 128):
        in_class = {n for n in counts if _pow2_at_least_16(n) == block}
        assert any(n % 16 == 0 for n in in_class) and any(n % 16 for n in in_class), (block, in_class)


@pytest.mark.parametrize("max_num_seqs,budget", [(256, 2048), (1024, 4096)])
def test_warm_up_groups_cover_the_token_loop_over_many_short_sequences_and_chunks_past_it(max_num_seqs, budget):
    """Passes whose sequences all take at most TOKEN_LOOP_MAX_ROWS rows run the token loop in tiles by their
    sequence count (a few, a decode step's 256 (sequence, head) pairs and 1024 at 32 value heads); the
    long-pass class over many sequences still runs 64-row chunks where a prompt is past the loop."""
    from deltaserve.kernels import TOKEN_LOOP_MAX_ROWS

    groups = warm_up_groups(max_num_seqs, budget, max_model_len=4096)
    loop = {len(g) for g in groups if max(g) <= TOKEN_LOOP_MAX_ROWS and len(g) > 1}
    assert any(n < 8 for n in loop) and any(8 <= n < 32 for n in loop) and any(n >= 32 for n in loop), loop
    long_chunks = {len(g) for g in groups if sum(g) > 128 and max(g) > TOKEN_LOOP_MAX_ROWS}
    assert {16, 17, 32, 33, 64, 65, 128, 129} <= long_chunks, long_chunks


def test_warm_up_groups_cover_every_class_of_the_conv_row_kernel():
    """Each run length the conv1d row kernel takes at the Qwen3.5 shape's 8192 channels, with a pass of a
    multiple of 16 rows and of another count, over one sequence, 16 and 17 of them (the integer classes
    Triton compiles a kernel for: 1, a multiple of 16, any other)."""
    pytest.importorskip("triton")
    from deltaserve.kernels.conv1d.triton_causal_conv1d import row_tiles_for

    # the server's default step, and a budget that holds every class
    for budget, classes in ((2048, {8, 16, 32}), (16384, {8, 16, 32, 64, 128})):
        groups = warm_up_groups(256, budget, max_model_len=budget)
        seen = {(row_tiles_for(sum(g), 8192)[0], _int_class(len(g)), sum(g) % 16 == 0) for g in groups if sum(g) > 64}
        run_lengths = {row_tiles_for(rows, 8192)[0] for rows in range(65, budget + 1)}
        assert run_lengths == classes
        for run_length in run_lengths:
            for count in ("one", "multiple of 16", "other"):
                for aligned in (True, False):
                    assert (run_length, count, aligned) in seen, (budget, run_length, count, aligned)


def _int_class(n: int) -> str:
    return "one" if n == 1 else "multiple of 16" if n % 16 == 0 else "other"


def _generate(engine: LLMEngine, requests) -> list:
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = [(o.token_ids, o.text) for o in out.outputs]
    return [done[i] for i in range(len(requests))]


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_a_warmed_up_engine_serves_what_a_cold_one_serves(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    rng = random.Random()
    requests = [([rng.randrange(300) for _ in range(rng.randint(2, 70))],
                 SamplingParams(max_tokens=rng.randint(4, 20), temperature=0, ignore_eos=True)) for _ in range(5)]
    requests.append(([rng.randrange(300) for _ in range(40)],
                     SamplingParams(max_tokens=12, temperature=0.8, seed=rng.randrange(1000), ignore_eos=True)))
    requests.append(([rng.randrange(300) for _ in range(30)],  # seeded by the engine's generator
                     SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True)))
    outputs = []
    for warm in (False, True):
        engine = LLMEngine.from_args(path, device="cpu", max_model_len=256, max_num_seqs=40, warm_up=warm)
        stats = engine.stats()
        assert stats.prompt_tokens_total == stats.generation_tokens_total == 0
        assert stats.prefix_cache_queries == stats.prefix_cache_hits == 0
        assert stats.num_running == stats.num_waiting == stats.kv_blocks_used == stats.state_slots_used == 0
        assert stats.snapshot_slots_used == 0
        outputs.append(_generate(engine, requests))
    assert outputs[0] == outputs[1]


def test_the_warm_up_takes_one_step_a_group_and_one_for_the_penalised_token(checkpoint_factory):
    """Without prefix caching (with it, prompts ending inside a block take a second step for the tail); the
    fourth group's penalised request takes one more, for its second token."""
    engine = LLMEngine.from_args(checkpoint_factory("qwen3.5"), device="cpu", max_model_len=256, max_num_seqs=40,
                                 warm_up=False, enable_prefix_caching=False)
    groups = len(warm_up_groups(40, 2048, 256))
    assert groups > 3 and warm_up(engine) == groups + 1
    assert engine.stats().prompt_tokens_total == 0 and not engine.has_unfinished_requests()


def test_the_warm_up_runs_the_grammar_mask_over_a_row_that_keeps_every_token(checkpoint_factory, monkeypatch):
    """Its kernel compiles at start-up, without a grammar (llguidance's vocabulary is built on first use)."""
    from deltaserve import kernels

    engine = LLMEngine.from_args(checkpoint_factory("qwen3.5"), device="cpu", max_model_len=256, max_num_seqs=8,
                                 warm_up=False)
    masked = []
    real = kernels.apply_token_bitmask
    monkeypatch.setattr(kernels, "apply_token_bitmask", lambda *a: masked.append(real(*a)) or masked[-1])
    warm_up(engine, [[4]])
    assert len(masked) == 1 and masked[0].shape == (1, engine.model_config.vocab_size)
    assert not masked[0].isinf().any()
    assert engine.grammars._ll_tokenizer is None


@pytest.mark.parametrize("kv_heads", [4, 2])  # the attention of Qwen3.5-9B and 35B-A3B: 16 query heads of 256
def test_start_up_compiles_every_paged_attention_kernel_that_serving_meets(kv_heads):
    """Paged attention compiles a kernel per tile shape, split or not, and a merge kernel per power of two
    of the split count. The decode graphs, the prefill graphs and the warm-up's eager steps, all run
    before the server is ready, must between them meet every such kernel that a step can call: decode
    rows at any batch, prompts and chunks of up to a step's budget beside them, several at once."""
    pytest.importorskip("triton")
    from deltaserve.kernels.attention.triton_paged_attention import launch_plan
    from deltaserve.runner.cuda_graphs import batch_size_ladder
    from deltaserve.runner.model_runner import FRESH_PREFILL_MIN_TOKENS
    from deltaserve.runner.prefill_graphs import MAX_ROWS, prefill_ladder

    max_num_seqs, budget, group = 256, 2048, 16 // kv_heads

    def kernels(tokens: int, seqs: int, longest: int) -> tuple:
        plan = launch_plan(tokens, seqs, longest, group, kv_heads, 256, sms=132)
        return plan.block_m, plan.block_n, plan.merge_rows if plan.splits > 1 else None, plan.interior

    started = {kernels(b, b, 1) for b in batch_size_ladder(max_num_seqs)}  # a graph's bound T - B + 1 is 1
    started |= {kernels(rows, 2, rows) for rows in prefill_ladder(MAX_ROWS)}  # sized by the rung they may fill
    for g in warm_up_groups(max_num_seqs, budget, 4096):  # not a prefill graph's pass, nor a fresh prompt's
        if (len(g) > 1 or g[0] > MAX_ROWS) and max(g) < FRESH_PREFILL_MIN_TOKENS:
            started.add(kernels(sum(g), len(g), max(g)))
        started.add(kernels(len(g), len(g), 1))  # its last layer: the sampled row of each sequence alone
    rng = random.Random()
    met = set()
    # A step's sequences (past 64 a sample, whose single-tile rows split their keys four ways, take 64-key
    # tiles unsplit, or neither), its longest chunk and its rows in all.
    for seqs in [*range(1, 65), 72, 96, 100, 128, 132, 200, max_num_seqs]:
        for longest in range(2, budget - seqs + 2):
            fewest, most = longest + seqs - 1, min(budget, longest * seqs)
            for tokens in {fewest, most, rng.randint(fewest, most)}:
                if seqs > 1 or longest > MAX_ROWS:  # not a prefill graph's pass
                    met.add(kernels(tokens, seqs, longest))
        for sampled in range(1, seqs + 1):  # an eager pass's last layer: the rows that sample, each alone
            met.add(kernels(sampled, sampled, 1))
    assert len(met) > 3 and met <= started, sorted(met - started, key=str)


def test_the_warm_up_samples_plainly_with_top_p_with_top_k_and_with_penalties_in_steps_of_their_own(
        checkpoint_factory):
    """The sampler's kernels compile at start-up: the race alone, the nucleus floors and the race with them,
    the top-k candidates and their race, then the penalties over a step with an output to count (a group's
    rows share a step, so each kind leads a group of its own)."""
    engine = LLMEngine.from_args(checkpoint_factory("qwen3.5"), device="cpu", max_model_len=256, max_num_seqs=8,
                                 warm_up=False, enable_prefix_caching=False)
    sent, add_request = [], engine.add_request

    def recorded(request_id, prompt, params):
        sent.append((request_id, params))
        return add_request(request_id, prompt, params)

    engine.add_request = recorded
    warm_up(engine)
    sampled = [(request_id.split("-")[2], p.top_p, p.top_k) for request_id, p in sent if p.temperature > 0]
    assert sampled == [("0", 1.0, -1), ("1", 0.9, -1), ("2", 1.0, 20)]
    penalised = [(request_id.split("-")[2], p.max_tokens) for request_id, p in sent if p.repetition_penalty != 1.0]
    assert penalised == [("3", 2)]
