"""Top-p and min-p floors (kernels/sampling/triton_nucleus.py) against the torch reference's masks on fresh
random logits: rows of one slice and of several, temperatures, top-p alone, min-p alone, both, neither;
the order keys against the floats they order; and the sampler's kernel path with those floors against the
reference's sampling."""

import random

import pytest
import torch

from deltaserve.kernels.sampling import reference
from deltaserve.kernels.sampling.triton_nucleus import KEY_MIN, SLICE, nucleus_floors
from deltaserve.kernels.sampling.triton_race import sample_from_logits

pytestmark = pytest.mark.triton


def _rows(rows: int):
    """Per-row inverse temperatures, top-p (some off) and min-p (some off)."""
    inverse = 1.0 / (0.3 + 1.2 * torch.rand(rows))
    top_p = torch.tensor([random.choice([1.0, random.uniform(0.05, 0.99)]) for _ in range(rows)])
    min_p = torch.tensor([random.choice([0.0, random.uniform(0.001, 0.5)]) for _ in range(rows)])
    return inverse, top_p, min_p


def test_order_keys_order_as_the_floats():
    x = torch.cat([torch.randn(5000) * 10 ** random.uniform(-3, 3), torch.tensor([0.0, -0.0, float("-inf")])])
    keys = reference.order_keys(x).long()
    order = x.argsort()
    assert bool((keys[order][1:] >= keys[order][:-1]).all())
    assert reference.order_keys(torch.tensor([float("-inf")])).item() > KEY_MIN


@pytest.mark.parametrize("rows, vocab", [(5, 3000), (4, SLICE * 2 + 517)])
def test_floors_keep_what_the_reference_masks_keep(rows, vocab):
    logits = torch.randn(rows, vocab) * 3
    logits[0, : vocab // 2] = float("-inf")  # masked tokens, a whole slice of them in the longer rows
    inverse, top_p, min_p = _rows(rows)
    floors = nucleus_floors(logits, inverse, top_p, min_p)
    scaled = logits * inverse[:, None]
    # A masked token is never drawn whatever the floor; a row with neither top-p nor min-p has the floor
    # below every key (KEY_MIN), -inf's included, where the reference's mask leaves it -inf.
    kept = (reference.order_keys(scaled) >= floors[:, None]) & torch.isfinite(scaled)
    expected = torch.isfinite(reference.mask_logits(scaled, torch.zeros(rows, dtype=torch.int64), top_p, min_p))
    # The kernel's min-p cut-off (best + log min_p) is a float32 sum; a token within its rounding of the cut-off
    # may fall either side of the reference's float64 one.
    cut = scaled.double().max(-1, keepdim=True).values + torch.log(min_p.double())[:, None]
    at_the_cut = (scaled.double() - cut).abs() < 1e-5 * cut.abs().clamp(min=1)
    assert torch.equal(kept[~at_the_cut], expected[~at_the_cut])
    assert bool(kept[torch.arange(rows), scaled.argmax(-1)].all())  # the best token always stays


def test_top_p_is_a_share_of_what_min_p_keeps():
    """vLLM's order: min-p first. Two tokens of 0.4 and 0.3 in different slices, the rest 0.3 spread thin:
    min-p 0.1 keeps the two, and top-p 0.5 of their 0.57 and 0.43 keeps the first alone (of the whole row's
    mass, 0.4 before the second, it would keep both)."""
    vocab = SLICE + 777
    first, second = random.randrange(SLICE), random.randrange(SLICE, vocab)
    probs = torch.full((1, vocab), 0.3 / (vocab - 2))
    probs[0, first], probs[0, second] = 0.4, 0.3
    logits = probs.log()
    floors = nucleus_floors(logits, torch.ones(1), torch.tensor([0.5]), torch.tensor([0.1]))
    kept = (reference.order_keys(logits) >= floors[:, None])[0].nonzero().flatten().tolist()
    assert kept == [first]
    assert torch.isfinite(reference.mask_logits(logits, torch.zeros(1, dtype=torch.int64), torch.tensor([0.5]),
                                                torch.tensor([0.1])))[0].nonzero().flatten().tolist() == [first]
    # without min-p (the host says so) the pass that sums what it keeps is skipped, with the same floors
    none = torch.zeros(1)
    assert torch.equal(nucleus_floors(logits, torch.ones(1), torch.tensor([0.5]), none, with_min_p=False),
                       nucleus_floors(logits, torch.ones(1), torch.tensor([0.5]), none))


def test_floors_at_the_qwen_vocabulary_keep_what_the_reference_keeps():
    """248320 tokens, most of them kept by top-p: the sums' rounding must not move the boundary."""
    rows, vocab = 2, 248320
    logits = torch.randn(rows, vocab) * 3
    inverse, top_p, min_p = torch.full((rows,), 1 / 0.8), torch.full((rows,), 0.95), torch.zeros(rows)
    scaled = logits * inverse[:, None]
    kept = reference.order_keys(scaled) >= nucleus_floors(logits, inverse, top_p, min_p)[:, None]
    expected = torch.isfinite(reference.mask_logits(scaled, torch.zeros(rows, dtype=torch.int64), top_p, min_p))
    assert torch.equal(kept, expected)


def test_sampling_with_floors_matches_the_reference():
    rows, vocab = 6, 5000
    logits = (torch.randn(rows, vocab + 40) * 2)[:, :vocab]  # rows of a wider buffer, as the sampler's
    _, top_p, min_p = _rows(rows)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.5, 0.0])
    top_k = torch.zeros(rows, dtype=torch.int64)
    seeds = torch.tensor([random.getrandbits(63) for _ in range(rows)], dtype=torch.int64)
    mask = reference.MaskPlan(nucleus=True)
    args = (logits, temperature, top_k, top_p, min_p, seeds)
    tokens = sample_from_logits(*args, mask=mask)
    assert torch.equal(tokens, reference.sample_from_logits(*args, mask=mask))
    assert tokens[0] == logits[0].argmax() and tokens[5] == logits[5].argmax()
