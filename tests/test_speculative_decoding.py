"""Speculative decoding with the model's MTP head: greedy outputs are plain greedy decoding's, whatever the drafts
(the head's own, or drafts that are right up to a point), with the GDN state set back where a draft is refuted,
through eager steps and through the graphs' padded layout (whose drafts are the eager steps'); kept drafts carry
their own rows' logprobs; penalties, biases, refusals, grammars and thinking budgets are followed through the
drafts; seeded sampling gives the same text alone or in a batch."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.engine.grammar import mask_shape
from deltaserve.errors import DeltaServeError
from deltaserve.sampling_params import StructuredOutputsParams
from tests.arrivals import arrival_requests, arrivals
from tests.checkpoints import VOCAB, add_mtp_weights, add_think_tokens, make_checkpoint
from tests.read_off_drafts import read_off_drafts
from tests.uncaptured_graphs import recorded_splits, with_uncaptured_graphs

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
MTP = {"method": "mtp", "num_speculative_tokens": 1}


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory):
    """A tiny hybrid checkpoint (its full-attention layers 1 and 3) with an MTP head."""
    path = str(tmp_path_factory.mktemp("qwen3_5_mtp"))
    make_checkpoint("qwen3.5", path, seed=3)
    add_mtp_weights(path, seed=3)
    return path


@pytest.fixture(scope="module")
def plain(mtp_checkpoint):
    return LLM(mtp_checkpoint, device="cpu", max_num_seqs=8)


@pytest.fixture(scope="module")
def drafting(mtp_checkpoint):
    return LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, speculative_config={**MTP, "num_speculative_tokens": 3})


def _prompts(count: int, longest: int = 40) -> list[list[int]]:
    return [[random.randrange(3, VOCAB) for _ in range(random.randint(1, longest))] for _ in range(count)]


def _tokens(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_greedy_tokens_are_plain_greedy_decodings(plain, drafting):
    prompts = _prompts(5)
    before = drafting.engine.stats()
    drafts_before = before.spec_decode_num_draft_tokens
    assert _tokens(drafting, prompts) == _tokens(plain, prompts)
    stats = drafting.engine.stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_draft_tokens > drafts_before


def _verified(llm: LLM, prompts) -> tuple[list[list[int]], int, int]:
    """The greedy tokens, and the drafts verified and kept on the way."""
    before = llm.engine.stats()
    drafted, kept = before.spec_decode_num_draft_tokens, before.spec_decode_num_accepted_tokens
    tokens = _tokens(llm, prompts)
    after = llm.engine.stats()
    return tokens, after.spec_decode_num_draft_tokens - drafted, after.spec_decode_num_accepted_tokens - kept


def test_drafts_right_up_to_a_point_keep_their_right_part(mtp_checkpoint, plain):
    """The steps keep the right drafts, set the GDN state back after a wrong one, and the output stays plain greedy
    decoding's."""
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, speculative_config={**MTP, "num_speculative_tokens": 3})
    prompts = _prompts(4)
    expected = _tokens(plain, prompts)
    read_off_drafts(llm, prompts, expected)
    tokens, drafted, kept = _verified(llm, prompts)
    assert tokens == expected
    assert 0 < kept < drafted  # some held, some were refuted


def _recorded_drafts(llm: LLM) -> list:
    """The drafts of each step, appended to as the engine runs."""
    speculative, recorded = llm.engine.runner.speculative, []
    execute = speculative.execute

    def recording(*args):
        result = execute(*args)
        recorded.append(sorted((r.request_id, d) for r, d in result.drafts.items()))
        return result

    speculative.execute = recording
    return recorded


def test_the_graphs_layout_drafts_as_the_eager_steps_do(mtp_checkpoint, plain):
    """The head's own drafts after padded verify steps (its passes over every verify row, then one row a
    sequence) are those of eager steps (over the kept rows alone), step by step, where drafts read off the plain
    output (wrong at the same places in both runs) are verified in their stead, so that rows are kept."""
    prompts = _prompts(5)
    expected = _tokens(plain, prompts)
    seed = random.randrange(2**31)
    runs = []
    for padded in (False, True):
        llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=6, speculative_config={**MTP, "num_speculative_tokens": 3})
        replayed = with_uncaptured_graphs(llm.engine).verify if padded else []
        head_drafts = _recorded_drafts(llm)
        read_off_drafts(llm, prompts, expected, random.Random(seed))
        tokens, drafted, kept = _verified(llm, prompts)
        runs.append((tokens, head_drafts))
    assert replayed and 0 < kept < drafted
    assert runs[0] == runs[1] and runs[0][0] == expected


def test_padded_verify_steps_keep_greedy_outputs(mtp_checkpoint, plain):
    """Verify steps through the graphs' padded layout (uncaptured on the CPU, so run eagerly): sequences of k + 1
    rows padded to a rung, the GDN states captured by a fixed table, the head drafting over every verify row."""
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=6, speculative_config={**MTP, "num_speculative_tokens": 2})
    replayed = with_uncaptured_graphs(llm.engine).verify
    prompts = _prompts(5)
    expected = _tokens(plain, prompts)
    read_off_drafts(llm, prompts, expected)
    tokens, drafted, kept = _verified(llm, prompts)
    assert tokens == expected and 0 < kept < drafted
    assert replayed and {len(step) for step in replayed} - {1, 2, 4, 6}  # padded to rungs from other sizes


def test_pad_rows_fills_each_sequence_to_k_plus_1_rows_that_write_nothing():
    from deltaserve.runner.batch_builder import HostBatch
    from deltaserve.runner.verify_graphs import pad_rows

    per = random.randint(2, 5)
    lengths = [random.randint(1, per) for _ in range(random.randint(1, 6))]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    ids, positions, slots = ([random.randrange(1000) for _ in range(starts[-1])] for _ in range(3))
    seq_lens = [random.randint(n, 200) for n in lengths]
    host = HostBatch(ids, positions, starts, seq_lens, [[1]] * len(lengths), slots, list(range(len(lengths))), [])
    padded = pad_rows(host, per)
    assert padded.query_start_loc == [b * per for b in range(len(lengths) + 1)]
    for b, n in enumerate(lengths):
        own = slice(starts[b], starts[b] + n)
        rows = slice(b * per, b * per + n)
        assert list(padded.input_ids[rows]) == ids[own] and list(padded.positions[rows]) == positions[own]
        assert list(padded.slot_mapping[rows]) == slots[own]
        past = slice(b * per + n, (b + 1) * per)
        assert set(padded.input_ids[past]) <= {ids[starts[b] + n - 1]}
        assert set(padded.positions[past]) <= {positions[starts[b] + n - 1]}
        assert set(padded.slot_mapping[past]) <= {-1}
        assert padded.seq_lens[b] == seq_lens[b] + per - n  # its own rows attend as far as before


def test_sequences_with_drafts_cut_short_replay_the_verify_graphs(mtp_checkpoint, plain):
    """Requests near their max_tokens verify fewer than k drafts, the last step none: they stay in the graphs'
    layout, each padded to k + 1 rows that change nothing, beside sequences with all k; the tokens are plain
    decoding's, and sampled rows (seeded) are the eager steps' draws."""
    prompts = _prompts(5)
    lengths = [9] + [random.randint(2, 9) for _ in prompts[1:]]  # one long enough for a step with all k drafts
    greedy = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    seeded = [SamplingParams(temperature=0.9, seed=random.randrange(2**31), max_tokens=n, ignore_eos=True)
              for n in lengths]
    expected = _tokens(plain, prompts, greedy)
    seed = random.randrange(2**31)  # both runs verify the same drafts: a seeded row's draws follow its drafts
    runs = []
    for padded in (False, True):
        llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=6, speculative_config={**MTP, "num_speculative_tokens": 3})
        replayed = with_uncaptured_graphs(llm.engine).verify if padded else []
        read_off_drafts(llm, prompts, expected, random.Random(seed))
        runs.append((_tokens(llm, prompts, greedy), _tokens(llm, prompts, seeded)))
    assert runs[0][0] == expected and runs[1] == runs[0]
    rows = [n for step in replayed for n in step]
    assert 1 in rows and 4 in rows and {2, 3} & set(rows)  # no drafts, some, all k


def test_a_prompt_arriving_beside_verify_steps_replays_its_prefill_graph(mtp_checkpoint, plain):
    """A prompt arriving while sequences verify the head's drafts runs as its own prefill graph after their verify
    graph (uncaptured on the CPU, so run eagerly in the graphs' layouts), one arriving alone as a prefill graph,
    a prefix-cache hit restored inside it; the graphs keep every row's hidden state, which the head reads apart
    from the verify rows'. The tokens are plain greedy decoding's, the head's drafts those of eager steps, and
    seeded sampled rows those of eager steps."""
    rng = random.Random()
    prompts, greedy, expected, seeded = arrival_requests(plain, rng, 16)
    seed, runs = rng.randrange(2**31), []
    for in_graphs in (False, True):
        llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, block_size=16,
                  speculative_config={**MTP, "num_speculative_tokens": 3})
        if in_graphs:
            with_uncaptured_graphs(llm.engine)
        splits = recorded_splits(llm.engine)
        head_drafts = _recorded_drafts(llm)
        read_off_drafts(llm, list(prompts.values()), list(expected.values()), random.Random(seed))
        runs.append((arrivals(llm, prompts, greedy), head_drafts, arrivals(llm, prompts, seeded)))
    assert runs[0][0] == expected and runs[1] == runs[0]
    assert any(beside for beside, _ in splits) and any(not beside for beside, _ in splits)  # and alone
    assert llm.engine.stats().prefix_cache_hits > 0 and llm.engine.stats().spec_decode_num_accepted_tokens > 0


def test_penalties_biases_and_refusals_draft_and_keep_plain_outputs(mtp_checkpoint, plain):
    """Requests whose sampling reads their past (penalties, a logit bias, min_tokens holding a stop token back,
    bad and allowed words) draft too, each verify row processed as a plain step after the drafts before it: with
    drafts read off their plain greedy outputs (some wrong), their tokens are plain decoding's, drafts kept."""
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, speculative_config={**MTP, "num_speculative_tokens": 3})
    prompts = _prompts(5)
    full = _tokens(plain, prompts)
    greedy = dict(temperature=0, max_tokens=20)
    asking = [SamplingParams(**greedy, ignore_eos=True, repetition_penalty=1.5),
              SamplingParams(**greedy, ignore_eos=True, frequency_penalty=0.8, presence_penalty=0.6),
              SamplingParams(**greedy, ignore_eos=True, logit_bias={full[2][1]: -4.0, full[2][4]: 3.0}),
              SamplingParams(**greedy, min_tokens=8, stop_token_ids=[full[3][random.randrange(1, 6)]]),
              SamplingParams(**greedy, ignore_eos=True, bad_words=["ab"], allowed_token_ids=list(range(3, VOCAB, 2)))]
    want = [_tokens(plain, [p], s)[0] for p, s in zip(prompts, asking)]
    assert want != full  # the constraints change the outputs
    read_off_drafts(llm, prompts, want)
    kept = llm.engine.stats().spec_decode_num_accepted_tokens
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, asking, use_tqdm=False)]
    assert got == want
    assert llm.engine.stats().spec_decode_num_accepted_tokens > kept


def _structured(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(**kwargs))


def test_structured_outputs_draft_and_keep_plain_outputs(mtp_checkpoint, plain):
    """Requests under a grammar draft: each verify row is masked as the grammar stands after the drafts before it,
    so with drafts read off their plain greedy outputs (some wrong, some of those outside the grammar) the tokens
    and finish reasons are plain decoding's, and drafts are kept, beside a grammar with min_tokens too."""
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, speculative_config={**MTP, "num_speculative_tokens": 3})
    prompts = _prompts(4)
    asking = [_structured(regex="[ab]{4,14}"), _structured(regex="(ab|ba|a)+c?"), _structured(choice=["ab", "ba"]),
              SamplingParams(temperature=0, max_tokens=20, min_tokens=3,
                             structured_outputs=StructuredOutputsParams(regex="[ab]{2,9}"))]
    want = [plain.generate([p], s, use_tqdm=False)[0].outputs[0] for p, s in zip(prompts, asking)]
    read_off_drafts(llm, prompts, [w.token_ids for w in want])
    kept = llm.engine.stats().spec_decode_num_accepted_tokens
    got = [o.outputs[0] for o in llm.generate(prompts, asking, use_tqdm=False)]
    assert [(g.token_ids, g.finish_reason) for g in got] == [(w.token_ids, w.finish_reason) for w in want]
    assert llm.engine.stats().spec_decode_num_accepted_tokens > kept


def test_thinking_budgets_draft_and_keep_plain_outputs(tmp_path):
    """A thinking budget's end is forced at the verify row where the drafts before it fill the budget: with drafts
    read off plain greedy outputs (some wrong), the tokens are plain decoding's, forced ends and all."""
    path = str(tmp_path)
    make_checkpoint("qwen3.5", path, seed=5)
    add_mtp_weights(path, seed=5)
    start, end = add_think_tokens(path)
    plain = LLM(path, device="cpu", max_num_seqs=8)
    llm = LLM(path, device="cpu", max_num_seqs=8, speculative_config={**MTP, "num_speculative_tokens": 3})
    prompts = [p + [start] for p in _prompts(4, longest=20)]
    asking = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, thinking_token_budget=b)
              for b in (0, 2, 5, random.randint(6, 12))]
    want = [_tokens(plain, [p], s)[0] for p, s in zip(prompts, asking)]
    assert sum(end in w for w in want) >= 3  # the budgets force their ends
    read_off_drafts(llm, prompts, want)
    kept = llm.engine.stats().spec_decode_num_accepted_tokens
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, asking, use_tqdm=False)] == want
    assert llm.engine.stats().spec_decode_num_accepted_tokens > kept


def test_a_grammar_beside_refusals_ends_its_request_where_a_reached_row_allows_nothing(plain):
    """Regex [ab]+, allowed tokens a, b and c, bad words "a a" and "a b": after an a, only c is left, which the
    grammar refuses. A draft a that holds ends the request at the next output index (as a plain step there
    would); one refused leaves the request going."""
    from deltaserve.engine.request import Request
    from deltaserve.runner.draft_verifier import VerifyRows, verify_sequences

    a, b, c = (plain.engine.tokenizer.hf.encode(x, add_special_tokens=False)[0] for x in "abc")
    params = SamplingParams(temperature=0, allowed_token_ids=[a, b, c],
                            structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    grammars = plain.engine.grammars
    sampler, vocab = plain.engine.runner.sampler, plain.engine.model_config.vocab_size
    for best, dead in ((a, True), (b, False)):
        request = Request("r", [5, 6], params, max_tokens=16, bad_words_ids=[[a, a], [a, b]],
                          grammar=grammars.matcher(params.structured_outputs,
                                                   grammars.compile(params.structured_outputs)))
        logits = torch.zeros(3, vocab)
        logits[0, best] = 1.0
        out = verify_sequences(sampler, logits, [VerifyRows(request, 0, [a, b])]).taken
        assert out[0][0] == best
        assert (request.dead_end is not None) == dead
        if dead:
            assert request.dead_end[0] == 1 and "structured" in str(request.dead_end[1])


def test_a_grammars_masks_along_its_drafts_are_the_masks_after_taking_them(plain):
    """RequestGrammar.fill_masks_along: row j is the mask the grammar gives once drafts[:j] are taken, rows past a
    draft it refuses allow everything, and the grammar itself stays where it was."""
    params = StructuredOutputsParams(regex="(ab|ba)+c")
    grammars, vocab = plain.engine.grammars, plain.engine.model_config.vocab_size
    text = grammars.compile(params)
    path = _tokens(plain, _prompts(1), SamplingParams(temperature=0, max_tokens=12, structured_outputs=params))[0]

    def masks(grammar, drafts):
        rows = torch.empty(mask_shape(len(drafts) + 1, vocab), dtype=torch.int32)
        grammar.fill_masks_along(drafts, rows, 0)
        return rows

    grammar = grammars.matcher(params, text)
    before = masks(grammar, [])
    cut = random.randrange(len(path))
    along = masks(grammar, path[:cut])
    walker = grammars.matcher(params, text)
    for j in range(cut + 1):
        assert torch.equal(along[j], masks(walker, [])[0]), j
        if j < cut:
            assert walker.accept(path[j])
    refused = next(t for t in range(vocab) if not (int(along[cut, t // 32]) >> (t % 32)) & 1)
    past_a_refusal = masks(grammar, path[:cut] + [refused, path[0]])
    assert torch.equal(past_a_refusal[: cut + 1], along) and (past_a_refusal[cut + 1 :] == -1).all()
    assert torch.equal(masks(grammar, []), before)


def _entries(output) -> list[list[tuple[int, int]]]:
    return [sorted((token, logprob.rank) for token, logprob in entry.items()) for entry in output.logprobs]


def test_kept_drafts_carry_the_logprobs_of_their_rows(mtp_checkpoint, plain):
    """A request asking logprobs drafts too: each kept draft's entry is read off its own verify row, and greedy
    decoding's entries come out (the same tokens and ranks, values to fp32 rounding), in every logprobs mode, with
    and without a penalty."""
    mode = random.choice(["raw_logprobs", "processed_logprobs", "raw_logits"])
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, logprobs_mode=mode,
              speculative_config={**MTP, "num_speculative_tokens": 2})
    reference = plain if mode == "raw_logprobs" else LLM(mtp_checkpoint, device="cpu", max_num_seqs=8,
                                                          logprobs_mode=mode)
    prompts = _prompts(3)
    # a penalty too, some runs: a processed mode reports the logits each row samples from, past its drafts
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=3,
                            repetition_penalty=random.choice([1.0, 1.4]))
    read_off_drafts(llm, prompts, _tokens(plain, prompts, params))
    got, want = (m.generate(prompts, params, use_tqdm=False) for m in (llm, reference))
    assert llm.engine.stats().spec_decode_num_accepted_tokens > 0
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert _entries(g.outputs[0]) == _entries(w.outputs[0])
        values = [[e[t].logprob for t in sorted(e)] for e in g.outputs[0].logprobs]
        expected = [[e[t].logprob for t in sorted(e)] for e in w.outputs[0].logprobs]
        assert values == [pytest.approx(v, abs=1e-4) for v in expected]


@pytest.mark.parametrize("reads_its_past", [{}, {"repetition_penalty": 1.3, "presence_penalty": 0.5},
                                            {"structured_outputs": StructuredOutputsParams(regex="[ab ]{4,30}")}])
def test_a_seeded_sample_is_the_same_alone_and_in_a_batch(drafting, reads_its_past):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, ignore_eos=True, seed=random.randrange(2**31),
                            **reads_its_past)
    prompt = _prompts(1)
    alone = _tokens(drafting, prompt, seeded)
    others = _prompts(3)
    batch = drafting.generate(others + prompt, [SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)] * 3
                              + [seeded], use_tqdm=False)
    assert batch[-1].outputs[0].token_ids == alone[0]


def test_stops_and_max_tokens_cut_a_verified_run(plain, drafting):
    prompts = _prompts(3)
    full = _tokens(plain, prompts)
    stops = [SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[f[random.randrange(3, 12)]]) for f in full]
    assert _tokens(drafting, prompts, stops) == [_tokens(plain, [p], s)[0] for p, s in zip(prompts, stops)]
    for length in (1, 2, 5):
        short = SamplingParams(temperature=0, max_tokens=length, ignore_eos=True)
        assert _tokens(drafting, prompts, short) == [f[:length] for f in full]


def test_preemption_and_the_prefix_cache_keep_greedy_outputs(mtp_checkpoint, plain):
    """Four sequences of up to 32 tokens (8 blocks each, a draft's lookahead included) in 14 blocks of 4, in steps of
    at most 10 tokens (prompts in chunks, drafts cut to the budget)."""
    tight = LLM(mtp_checkpoint, device="cpu", max_num_seqs=4, num_kv_blocks=14, block_size=4,
                max_num_batched_tokens=10, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    prompts = _prompts(4, longest=12)
    expected = _tokens(plain, prompts)
    assert _tokens(tight, prompts) == expected
    assert tight.engine.stats().num_preemptions > 0
    assert _tokens(tight, prompts[:1]) == expected[:1]  # again: a prefix-cache hit


@pytest.mark.parametrize("config, named", [({**MTP, "method": "eagle"}, "method='eagle'"),
                                           ({**MTP, "num_speculative_tokens": "2"}, "num_speculative_tokens='2'"),
                                           ({**MTP, "num_speculative_tokens": 0}, "num_speculative_tokens=0"),
                                           ({**MTP, "model": "x/y"}, "model='x/y'"),
                                           ({**MTP, "foo": 1}, "foo")])
def test_a_speculative_config_deltaserve_cannot_run_is_refused_by_name(config, named):
    with pytest.raises(DeltaServeError, match=named):
        LLM("unused", device="cpu", speculative_config=config)


def test_num_speculative_tokens_left_out_is_what_the_head_predicts(mtp_checkpoint, plain):
    """vLLM's default: as many drafts a step as the checkpoint's MTP layers predict (one here)."""
    llm = LLM(mtp_checkpoint, device="cpu", max_num_seqs=8, speculative_config={"method": "mtp"})
    assert llm.engine.config.speculative_config.num_speculative_tokens == 1
    prompts = _prompts(2)
    assert _tokens(llm, prompts) == _tokens(plain, prompts)
    stats = llm.engine.stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_draft_tokens == stats.spec_decode_num_drafts


def test_a_model_without_an_mtp_head_is_refused(checkpoint_factory):
    with pytest.raises(DeltaServeError, match="multi-token-prediction head"):
        LLM(checkpoint_factory("qwen3"), device="cpu", speculative_config=MTP)


@pytest.mark.parametrize("arch", ["qwen3-next", "qwen3.5-moe"])
def test_the_moe_heads_draft_for_greedy_decoding_too(tmp_path, arch):
    path = make_checkpoint(arch, str(tmp_path), seed=5)
    add_mtp_weights(path, seed=5)
    prompts = _prompts(3)
    drafting = LLM(path, device="cpu", max_num_seqs=4, speculative_config=MTP)
    assert _tokens(drafting, prompts) == _tokens(LLM(path, device="cpu", max_num_seqs=4), prompts)
    assert drafting.engine.stats().spec_decode_num_drafts > 0


def test_the_batched_masks_along_drafts_are_each_grammars_own(plain):
    """fill_masks_along_drafts (llguidance's threads, each matcher taking its drafts and giving them back) fills
    what RequestGrammar.fill_masks_along fills, sequence by sequence: drafts right, wrong at some point, or none."""
    from deltaserve.engine.grammar import fill_masks_along_drafts

    params = StructuredOutputsParams(regex="(ab|ba)+c")
    grammars, vocab = plain.engine.grammars, plain.engine.model_config.vocab_size
    text = grammars.compile(params)
    path = _tokens(plain, _prompts(1), SamplingParams(temperature=0, max_tokens=12, structured_outputs=params))[0]
    sequences, first = [], 0
    for _ in range(6):
        cut = random.randrange(len(path))
        drafts = path[:cut] + ([random.randrange(VOCAB)] + path[:2] if random.random() < 0.5 else [])
        sequences.append((grammars.matcher(params, text), first, drafts))
        first += len(drafts) + 1
    batched = torch.empty(mask_shape(first, vocab), dtype=torch.int32)
    fill_masks_along_drafts(sequences, batched)
    one_by_one = torch.empty(mask_shape(first, vocab), dtype=torch.int32)
    for grammar, at, drafts in sequences:
        grammar.fill_masks_along(drafts, one_by_one, at)
    assert torch.equal(batched, one_by_one)
    again = torch.empty(mask_shape(first, vocab), dtype=torch.int32)
    fill_masks_along_drafts(sequences, again)
    assert torch.equal(again, batched)  # the matchers gave the drafts back
