"""Penalties over the entries a batch's prompts and outputs name (kernels/sampling/triton_penalties.py and the
torch form beside it) against the dense reference, apply_penalties, on fresh random rows: repeated tokens, a
row with no output yet, logits of zero and of both signs, rows of a wider buffer, no entries at all."""

import random

import pytest
import torch

from deltaserve.kernels.sampling import reference
from deltaserve.kernels.sampling.triton_penalties import BLOCK, apply_penalties_at

pytestmark = pytest.mark.triton


def _batch(rows: int, vocab: int):
    """(logits view of a wider buffer, prompt mask, output counts, seen, counts, repetition, frequency, presence)."""
    logits = (torch.randn(rows, vocab + 24) * 3)[:, :vocab]
    logits[0, :5] = 0.0  # x = 0 takes x * rep, as the reference's where does
    prompt_mask = torch.zeros(rows, vocab, dtype=torch.bool)
    output_counts = torch.zeros(rows, vocab)
    for row in range(rows):
        prompt_mask[row, torch.randint(0, vocab, (random.randrange(1, 3 * BLOCK // rows),))] = True
        outputs = torch.randint(0, vocab // 4, (random.randrange(60) if row else 0,))  # repeats among few tokens
        output_counts[row] += torch.bincount(outputs, minlength=vocab).float()
    seen_mask = prompt_mask | (output_counts > 0)
    seen = seen_mask.view(-1).nonzero()[:, 0]
    penalties = [1 + torch.rand(rows), torch.rand(rows), torch.rand(rows)]
    return logits, prompt_mask, output_counts, seen, output_counts.view(-1)[seen], *penalties


@pytest.mark.parametrize("rows, vocab", [(1, 40), (4, 3000)])
def test_penalties_at_the_entries_match_the_dense_reference(rows, vocab):
    logits, prompt_mask, output_counts, seen, counts, *penalties = _batch(rows, vocab)
    expected = reference.apply_penalties(logits, prompt_mask, output_counts, *penalties)
    assert seen.numel() > BLOCK or vocab < 100  # the larger case spans several programs
    for apply in (apply_penalties_at, reference.apply_penalties_at):
        out = apply(logits, seen, counts, *penalties)
        assert out.is_contiguous() and torch.allclose(out, expected, rtol=1e-6, atol=1e-6)
    assert not torch.equal(expected, logits)  # the entries did change


def test_no_entries_leave_a_copy_of_the_logits():
    logits = torch.randn(3, 50)
    empty = torch.zeros(0, dtype=torch.int64)
    out = apply_penalties_at(logits, empty, empty.float(), torch.ones(3), torch.zeros(3), torch.zeros(3))
    assert torch.equal(out, logits) and out.data_ptr() != logits.data_ptr()


def test_sampler_lists_each_seen_token_once_with_its_count():
    """The sampler's entries: numpy's union of a row's prompt and output indices, counts from its outputs."""
    from types import SimpleNamespace

    from deltaserve.runner.sampler import Sampler
    from deltaserve.sampling_params import SamplingParams

    vocab = 30
    requests = [SimpleNamespace(params=SamplingParams(temperature=1.0, repetition_penalty=2.0, frequency_penalty=0.5,
                                                      presence_penalty=0.25),
                                prompt_token_ids=prompt, output_token_ids=outputs)
                for prompt, outputs in (([3, 3, 7], [7, 7, 1]), ([], [29, 0, 29]), ([5], []))]
    logits = torch.rand(3, vocab) + 0.5  # positive: the repetition penalty divides
    out = Sampler(vocab, torch.device("cpu"), seed=0)._penalise(logits, requests)
    expected = logits.clone()
    for row, token, generated in ((0, 3, 0), (0, 7, 2), (0, 1, 1), (1, 29, 2), (1, 0, 1), (2, 5, 0)):
        expected[row, token] = logits[row, token] / 2.0 - 0.5 * generated - 0.25 * (generated > 0)
    assert torch.allclose(out, expected)
