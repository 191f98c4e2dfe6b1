"""Speculative sampling over verify rows (runner/draft_verifier.py): a greedy sequence keeps exactly the drafts that
are its argmax, and a sampled one's tokens are distributed as the target's sampling draws them, whatever the draft."""

import random

import pytest
import torch

from deltaserve.engine.request import Request
from deltaserve.runner.draft_verifier import VerifyRows, verify_sequences
from deltaserve.runner.sampler import Sampler
from deltaserve.sampling_params import SamplingParams

VOCAB = 12


def _request(params: SamplingParams) -> Request:
    return Request(f"r{random.randrange(10**9)}", [1, 2, 3], params, max_tokens=64)


# in_order: the rows as a verify graph lays them out (read in place); between other rows (an eager pass's prompt
# chunks beside the verify chunks: gathered). The logits are wider than the vocabulary, the padding the largest.
@pytest.mark.parametrize("in_order", [True, False])
def test_greedy_sequences_keep_the_drafts_that_are_their_argmax(in_order):
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31))
    sequences, expected, rows = [], [], []
    for _ in range(20):
        if not in_order:
            rows += list(torch.randn(random.randint(1, 2), VOCAB))  # rows no sequence verifies
        k = random.randint(1, 4)
        logits = torch.randn(k + 1, VOCAB)
        best = logits.argmax(-1).tolist()
        held = random.randint(0, k)  # drafts 0..held-1 are the argmax, the next one (if any) is not
        drafts = best[:held] + [(best[held] + random.randint(1, VOCAB - 1)) % VOCAB for _ in range(k - held)]
        sequences.append(VerifyRows(_request(SamplingParams(temperature=0)), len(rows), drafts))
        rows += list(logits)
        expected.append(best[:held] + [best[held]])
    padded = torch.cat([torch.stack(rows), torch.full((len(rows), 3), 100.0)], dim=1)
    assert verify_sequences(sampler, padded, sequences).taken == expected


def _distribution(tokens: list[int]) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=VOCAB).float() / len(tokens)


def test_sampled_tokens_follow_the_target_distribution_whatever_the_draft():
    """Each of many sequences verifies one draft over the same two rows of logits: its first token must be drawn
    from row 0's distribution (temperature, top-p), and its second, where the draft held, from row 1's."""
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31))
    params = SamplingParams(temperature=random.uniform(0.6, 1.4), top_p=random.choice([1.0, 0.9]))
    logits = torch.randn(2, VOCAB) * 1.5
    probe = _request(params)
    target = torch.softmax(sampler.drawn_from(logits, [probe, probe]), dim=-1)
    for draft in (int(target[0].argmax()), int(target[0].argmin()), random.randrange(VOCAB)):
        n = 6000
        sequences = [VerifyRows(_request(params), 0, [draft]) for _ in range(n)]
        out = verify_sequences(sampler, _tiled(logits, n), _offset(sequences)).taken
        first = [o[0] for o in out]
        assert (_distribution(first) - target[0]).abs().sum() / 2 < 0.04, (draft, _distribution(first), target[0])
        kept = [o[1] for o in out if len(o) == 2]
        assert all(o[0] == draft for o in out if len(o) == 2)  # two tokens only where the draft held
        if len(kept) > 1500:
            assert (_distribution(kept) - target[1]).abs().sum() / 2 < 0.06


def _tiled(logits: torch.Tensor, n: int) -> torch.Tensor:
    """n copies of the two rows, one after the other."""
    return logits.unsqueeze(0).expand(n, -1, -1).reshape(-1, VOCAB)


def _offset(sequences: list[VerifyRows]) -> list[VerifyRows]:
    for i, seq in enumerate(sequences):
        seq.first_row = 2 * i
    return sequences


def test_a_seeded_sequence_verifies_the_same_way_again():
    params = SamplingParams(temperature=1.0, seed=random.randrange(2**31))
    logits = torch.randn(3, VOCAB)
    drafts = random.sample(range(VOCAB), 2)
    runs = [verify_sequences(Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31)), logits,
                             [VerifyRows(_request(params), 0, drafts)]).taken for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def _constrained_request(rng: random.Random, temperature: float = 0.0) -> Request:
    """A request whose sampling reads its past: penalties, a logit bias, a bad word, stop tokens that min_tokens
    holds back (one more output token to go before they are allowed), some of them at once; an output so far."""
    output = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 4))]
    params = SamplingParams(
        temperature=temperature,
        repetition_penalty=rng.choice([1.0, 1.8]), presence_penalty=rng.choice([0.0, 2.0]),
        frequency_penalty=rng.choice([0.0, 1.0]), min_tokens=len(output) + rng.choice([0, 1, 2]),
        logit_bias={rng.randrange(VOCAB): rng.uniform(-2, 2)} if rng.random() < 0.5 else None)
    bad_words = [rng.sample(range(VOCAB), 2)] if rng.random() < 0.5 else []
    request = Request(f"r{rng.randrange(10**9)}", [rng.randrange(VOCAB) for _ in range(3)], params, max_tokens=64,
                      bad_words_ids=bad_words)
    request.held_back = rng.sample(range(VOCAB), 2) if params.min_tokens > len(output) else []
    request.output_token_ids = output
    return request


def _plain_path(sampler: Sampler, request: Request, logits: torch.Tensor) -> list[int]:
    """The greedy token of each row, each sampled by a plain step after the ones before it were taken as output."""
    output = list(request.output_token_ids)
    path = []
    for row in logits:
        token = sampler(row[None], [request])[0][0]
        path.append(token)
        request.output_token_ids.append(token)
    request.output_token_ids[:] = output
    return path


def test_greedy_verdicts_follow_penalties_biases_and_refusals_through_the_drafts():
    """Row j is processed as a plain step would be after drafts 1..j were taken: a repeated draft is penalised, a
    stop token comes back once min_tokens is reached, a bad word's end is refused after its start. The verdicts
    keep exactly the plain steps' path."""
    rng = random.Random(random.randrange(2**31))
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=rng.randrange(2**31))
    sequences, expected, rows, changed = [], [], [], 0
    for _ in range(30):
        request, k = _constrained_request(rng), rng.randint(1, 4)
        logits = torch.randn(k + 1, VOCAB) * 0.5  # close logits: the penalties and refusals move the argmax
        path = _plain_path(sampler, request, logits)
        held = rng.randint(0, k)
        drafts = path[:held] + [(path[held] + rng.randint(1, VOCAB - 1)) % VOCAB for _ in range(k - held)]
        changed += path[:held + 1] != logits[: held + 1].argmax(-1).tolist()  # the unprocessed argmax would differ
        sequences.append(VerifyRows(request, len(rows), drafts))
        rows += list(logits)
        expected.append(path[:held] + [path[held]])
    assert verify_sequences(sampler, torch.stack(rows), sequences).taken == expected
    assert changed >= 5  # the test sees processing through the drafts, not logits that need none


def test_sampled_rows_follow_the_penalties_of_the_drafts_before_them():
    """A sampled request with a presence penalty verifies draft d over two rows: where d held, the second token is
    drawn from row 1 with d penalised, as a plain step after d would draw it."""
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31))
    params = SamplingParams(temperature=1.0, presence_penalty=1.5)
    logits = torch.randn(2, VOCAB)
    draft = int(logits[0].argmax())
    logits[0, draft] += 2.0  # held often enough (some 70% of the rows) to measure what row 1 draws after it
    after = _request(params)
    after.output_token_ids = [draft]
    target = torch.softmax(sampler.drawn_from(sampler._penalise(logits[1:], [after]), [after]), dim=-1)[0]
    n = 6000
    sequences = [VerifyRows(_request(params), 0, [draft]) for _ in range(n)]
    out = verify_sequences(sampler, _tiled(logits, n), _offset(sequences)).taken
    kept = [o[1] for o in out if len(o) == 2]
    assert len(kept) > 1000
    assert (_distribution(kept) - target).abs().sum() / 2 < 0.06
    unpenalised = torch.softmax(logits[1], dim=-1)
    assert (_distribution(kept) - unpenalised).abs().sum() / 2 > 0.06 or unpenalised[draft] < 0.1


def test_a_row_that_allows_no_token_ends_its_request_only_where_the_sequence_reaches_it():
    """allowed_token_ids 4 and 5, and bad words 5 4 and 5 5: after a 5 the row allows nothing. A draft 5 that
    holds marks the request's next output index a dead end, as a plain step there would; one refused leaves it."""
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31))
    params = SamplingParams(temperature=0, allowed_token_ids=[4, 5])
    for best, dead in ((5, True), (4, False)):
        request = Request("r", [1, 2, 3], params, max_tokens=64, bad_words_ids=[[5, 4], [5, 5]])
        request.output_token_ids = [7]
        logits = torch.zeros(3, VOCAB)
        logits[0, best] = 1.0
        out = verify_sequences(sampler, logits, [VerifyRows(request, 0, [5, 4])]).taken
        assert out[0][0] == best
        assert (request.dead_end is not None) == dead
        if dead:
            assert request.dead_end[0] == 2  # output index 2: the token after the kept 5
