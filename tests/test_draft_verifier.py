"""Speculative sampling over verify rows (runner/draft_verifier.py): a greedy sequence keeps exactly the drafts that
are its argmax, and a sampled one's tokens are distributed as the target's sampling draws them, whatever the draft."""

import random

import torch

from deltaserve.engine.request import Request
from deltaserve.runner.draft_verifier import VerifyRows, verify_drafts
from deltaserve.runner.sampler import Sampler
from deltaserve.sampling_params import SamplingParams

VOCAB = 12


def _request(params: SamplingParams) -> Request:
    return Request(f"r{random.randrange(10**9)}", [1, 2, 3], params, max_tokens=64)


def test_greedy_sequences_keep_the_drafts_that_are_their_argmax():
    sampler = Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31))
    sequences, expected, rows = [], [], []
    for _ in range(20):
        k = random.randint(1, 4)
        logits = torch.randn(k + 1, VOCAB)
        best = logits.argmax(-1).tolist()
        held = random.randint(0, k)  # drafts 0..held-1 are the argmax, the next one (if any) is not
        drafts = best[:held] + [(best[held] + random.randint(1, VOCAB - 1)) % VOCAB for _ in range(k - held)]
        sequences.append(VerifyRows(_request(SamplingParams(temperature=0)), len(rows), drafts))
        rows += list(logits)
        expected.append(best[:held] + [best[held]])
    assert verify_drafts(sampler, torch.stack(rows), sequences) == expected


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
        out = verify_drafts(sampler, _tiled(logits, n), _offset(sequences))
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
    runs = [verify_drafts(Sampler(VOCAB, torch.device("cpu"), seed=random.randrange(2**31)), logits,
                          [VerifyRows(_request(params), 0, drafts)]) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
