"""The sampler's race: the Triton kernels against the torch reference on fresh random logits and seeds
(greedy and sampled rows together, masked tokens and masked rows, each mask plan's path, a vocabulary of
one partial block and one of several slices, ties, a strided view written into a buffer), the reference's
draws against the 64-bit hash written with Python's integers, and its draws' frequencies against the
softmax they sample. A grammar's token bitmask against its reference (strided rows, held rows in any order).
"""

import random

import pytest
import torch

from deltaserve.kernels.sampling import reference
from deltaserve.runner.sampler import mask_plan
from deltaserve.sampling_params import SamplingParams
from deltaserve.kernels.sampling.triton_race import (BLOCK, SLICE_BLOCKS, greedy_tokens, race_or_argmax,
                                                     sample_from_logits)
from deltaserve.kernels.sampling.triton_token_bitmask import BLOCK as BITMASK_BLOCK, apply_token_bitmask

pytestmark = pytest.mark.triton

UINT64 = (1 << 64) - 1


def _seeds(rows: int) -> torch.Tensor:
    return torch.tensor([random.getrandbits(63) for _ in range(rows)], dtype=torch.int64)


@pytest.mark.parametrize("rows, vocab", [(1, 50), (6, BLOCK * SLICE_BLOCKS + 777)])
def test_race_kernel_matches_the_reference(rows, vocab):
    logits = torch.randn(rows, vocab) * 4
    logits[:, torch.randint(0, vocab, (vocab // 5,))] = float("-inf")  # masked tokens never win
    if rows > 1:  # a row that refuses every token takes token 0, as torch's argmax: a token id the next step can read
        logits[random.randrange(rows)] = float("-inf")
    greedy = torch.rand(rows) < 0.4
    inverse = torch.where(greedy, 1.0, 1.0 / (0.2 + torch.rand(rows)))
    seeds = _seeds(rows)
    tokens = race_or_argmax(logits, inverse, seeds, greedy)
    expected = torch.where(greedy, logits.argmax(-1), reference.race(logits * inverse[:, None], seeds))
    assert torch.equal(tokens, expected)


def test_greedy_ties_take_the_first_index():
    vocab = BLOCK * SLICE_BLOCKS * 2 + 5
    logits = torch.randn(3, vocab)
    for row, places in enumerate([[7, 9], [BLOCK + 3, BLOCK * SLICE_BLOCKS + 1], [vocab - 1, 2]]):
        logits[row, places] = 100.0
    tokens = race_or_argmax(logits, torch.ones(3), _seeds(3), torch.ones(3, dtype=torch.bool))
    assert tokens.tolist() == [7, BLOCK + 3, 2] == logits.argmax(-1).tolist()


@pytest.mark.parametrize("vocab", [3000, 40000])
@pytest.mark.parametrize("plan", ["none", "all_top_k", "mixed", "mixed_no_nucleus"])
def test_sample_from_logits_kernel_matches_the_reference(plan, vocab):
    """Each MaskPlan's path against the reference's, which sorts the whole row wherever a row masks:
    temperature alone; top-k in every sampled row; top-k in some, top-p or min-p in others (their floors);
    top-k in some, nothing in the others. Rows of 40000 tokens take their top-k from triton_top_k's
    candidates, rows of 3000 from torch.topk."""
    rows = 6
    logits = torch.randn(rows, vocab) * 3
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0, 0.9])
    zeros = torch.zeros(rows, dtype=torch.int64)
    top_k = {"none": zeros, "all_top_k": torch.tensor([0, 40, 9, 3, 5, 17]),
             "mixed": torch.tensor([0, 40, 0, 0, 5, 7]), "mixed_no_nucleus": torch.tensor([0, 40, 0, 0, 5, 0])}[plan]
    top_p = torch.tensor([0.5, 0.9, 0.8, 1.0, 1.0, 0.7]) if plan != "none" else torch.ones(rows)
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.05])
    if plan in ("none", "mixed_no_nucleus"):
        min_p = torch.zeros(rows)
    if plan == "mixed_no_nucleus":
        top_p = torch.where(top_k > 0, top_p, 1.0)
    seeds = _seeds(rows)
    args = (logits, temperature, top_k, top_p, min_p, seeds)
    mask = mask_plan([SamplingParams(temperature=float(t), top_k=int(k) or -1, top_p=float(p), min_p=float(m))
                      for t, k, p, m in zip(temperature, top_k, top_p, min_p)], vocab)
    assert (mask.top_k > 0, mask.all_top_k, mask.nucleus) == {
        "none": (False, False, False), "all_top_k": (True, True, False), "mixed": (True, False, True),
        "mixed_no_nucleus": (True, False, False)}[plan]
    tokens = sample_from_logits(*args, mask=mask)
    whole_row = reference.MaskPlan(nucleus=True) if mask.masks else mask  # the reference sorts every row
    assert torch.equal(tokens, reference.sample_from_logits(*args, mask=whole_row))
    assert tokens[0] == logits[0].argmax() and tokens[4] == logits[4].argmax()


def test_uniforms_are_the_64_bit_hash():
    seeds = _seeds(3)
    drawn = reference.uniforms(seeds, 2000)
    for row, seed in enumerate(seeds.tolist()):
        for index in random.sample(range(2000), 50):
            x = (seed + (index + 1) * reference.GOLDEN) & UINT64
            x ^= x >> 30
            x = (x * reference.MIX_A) & UINT64
            x ^= x >> 27
            x = (x * reference.MIX_B) & UINT64
            x ^= x >> 31
            assert drawn[row, index].item() == ((x >> 41) + 0.5) / 2**23


def test_race_draws_follow_the_softmax():
    draws = 20000
    logits = torch.randn(6)
    seeds = _seeds(draws)
    picked = reference.race(logits.expand(draws, -1), seeds)
    frequency = torch.bincount(picked, minlength=6).float() / draws
    assert (frequency - torch.softmax(logits, 0)).abs().max() < 0.015


def test_greedy_tokens_match_torch_argmax_into_a_strided_view():
    """The decode graph's greedy tokens: the logits' first vocab columns of a wider row, into a buffer."""
    rows, vocab = 4, BLOCK * SLICE_BLOCKS + 300
    padded = torch.randn(rows, vocab + 64)
    padded[1, [5, 900]] = 50.0  # a tie
    padded[2, vocab + 3] = 99.0  # past the vocabulary: never taken
    out = torch.full((rows + 2,), -7, dtype=torch.int64)
    greedy_tokens(padded[:, :vocab], out[:rows])
    assert out[:rows].tolist() == padded[:, :vocab].argmax(-1).tolist() and out[1] == 5
    assert out[rows:].tolist() == [-7, -7]


def _row_tokens(lists: list[list[int]]) -> reference.RowTokens:
    lengths = torch.tensor([0] + [len(tokens) for tokens in lists])
    tokens = torch.tensor([t for tokens in lists for t in tokens], dtype=torch.int32)
    return reference.RowTokens(tokens, lengths.cumsum(0).to(torch.int32), max(lengths.tolist()))


@pytest.mark.parametrize("rows, vocab, prompt_len, output_len", [(1, 50, 7, 0), (5, 3001, 1500, 700),
                                                                 (3, 40, 0, 2100), (4, 300, 30, 40)])
def test_penalties_kernel_gives_the_reference_bits(rows, vocab, prompt_len, output_len):
    """Fresh lists of ragged lengths (repeats, tokens in both lists, a row with neither, lists longer than
    a block, an empty list in every row) on a strided view of wider logits rows, with penalties that
    divide, multiply and subtract: the reference's bits. A vocabulary of 40 under 2100 outputs a row makes
    the counts' atomics race on the same entries."""
    from deltaserve.kernels.sampling.triton_penalties import apply_penalties

    wide = torch.randn(rows, vocab + 13) * 5
    logits = wide[:, :vocab]
    length = lambda most, row: 0 if row == rows - 1 and rows > 1 else random.randint(most // 2, most)  # noqa: E731
    prompts = [[random.randrange(vocab) for _ in range(length(prompt_len, r))] for r in range(rows)]
    outputs = [prompts[r][:3] + [random.randrange(vocab) for _ in range(length(output_len, r))] for r in range(rows)]
    repetition, frequency, presence = 0.5 + torch.rand(rows) * 2, torch.randn(rows), torch.randn(rows)
    args = (logits, _row_tokens(prompts), _row_tokens(outputs), repetition, frequency, presence)
    out = apply_penalties(*args)
    assert torch.equal(out, reference.apply_penalties(*args))
    assert not torch.equal(out, logits)


def test_top_k_batch_without_greedy_rows_matches_the_reference():
    """Every row samples with top-k (the plan says no greedy row, so no argmax is read): the reference's
    tokens from the whole sorted rows."""
    rows, vocab = 4, 40000
    logits = torch.randn(rows, vocab) * 3
    temperature, top_k = torch.tensor([0.7, 1.0, 1.3, 0.9]), torch.tensor([20, 3, 40, 1])
    top_p, min_p = torch.tensor([0.8, 1.0, 0.95, 1.0]), torch.tensor([0.0, 0.1, 0.0, 0.0])
    args = (logits, temperature, top_k, top_p, min_p, _seeds(rows))
    mask = mask_plan([SamplingParams(temperature=float(t), top_k=int(k), top_p=float(p), min_p=float(m))
                      for t, k, p, m in zip(temperature, top_k, top_p, min_p)], vocab)
    assert mask == reference.MaskPlan(40, True, False, False, min_p=False)  # min-p only beside top-k
    tokens = sample_from_logits(*args, mask=mask)
    assert torch.equal(tokens, reference.sample_from_logits(*args, mask=reference.MaskPlan(nucleus=True)))
    assert tokens[3] == logits[3].argmax()  # top-k 1 keeps the best token alone


@pytest.mark.parametrize("rows, vocab, k", [(5, 40000, 20), (2, 9000, 5), (3, 33000, 64)])
def test_top_k_kernel_matches_torch_topk(rows, vocab, k):
    """Fresh rows on a strided view: normal logits, one with most tokens masked, one of four values
    (thousands tied at the k-th), one with fewer finite tokens than k: torch.topk's values, indices that
    hold them, no index twice."""
    from deltaserve.kernels.sampling.triton_top_k import list_length, top_k

    assert list_length(k) <= vocab // 4  # the candidates' path, not torch.topk of the rows
    x = (torch.randn(rows, vocab + 7) * 3)[:, :vocab]
    x[0, 100 : vocab - 50] = float("-inf")
    x[1] = torch.randint(0, 4, (vocab,)).float()
    if rows > 2:
        x[2] = float("-inf")
        x[2, torch.randperm(vocab)[: k // 2]] = torch.randn(k // 2)
    values, indices = top_k(x, k)
    assert torch.equal(values, x.topk(k, dim=-1).values)
    assert torch.equal(x.gather(1, indices), values)
    assert all(len(set(row)) == k for row in indices.tolist())


@pytest.mark.parametrize("vocab", [1, 33, BITMASK_BLOCK + 77])
def test_token_bitmask_kernel_gives_the_reference_bits(vocab):
    batch = random.randint(1, 6)
    wide = torch.randn(batch, vocab + random.randint(0, 40)) * 3  # the sampler's logits are a view of padded rows
    logits = wide[:, :vocab]
    held = torch.randperm(batch)[: random.randint(0, batch)]  # rows a grammar holds, in any order, maybe none
    mask_rows = torch.full((batch,), -1, dtype=torch.int32)
    mask_rows[held] = torch.arange(len(held), dtype=torch.int32)
    bitmask = torch.randint(-2**31, 2**31 - 1, (len(held), -(-vocab // 32)), dtype=torch.int32)
    out = apply_token_bitmask(logits, bitmask, mask_rows)
    assert torch.equal(out, reference.apply_token_bitmask(logits, bitmask, mask_rows))
    refused = sum(1 for words in bitmask.tolist() for t in range(vocab) if not (words[t // 32] >> t % 32) & 1)
    assert out.isinf().sum().item() == refused  # the held rows' zero bits, and nothing else
    assert torch.equal(out[~out.isinf()], logits[~out.isinf()])
