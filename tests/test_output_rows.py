"""The last layer computes only the rows that a pass samples (OutputRows). Prompt logprobs need every
row, so a request asking for them runs the whole layer: the two must give the same tokens and logprobs,
over ragged batches, prompts split into chunks whose early ones sample nothing, and a last layer of
either kind of mixer."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from tests.checkpoints import every_expert, make_checkpoint

GDN_LAST = ["full_attention", "linear_attention", "full_attention", "linear_attention"]


def _record_output_rows(llm: LLM) -> list:
    """The count of output rows of every eager pass from now on (None where the pass computed every row)."""
    model = llm.engine.loaded.runner.model
    counts, forward = [], model.forward

    def recorded(input_ids, batch):
        counts.append(None if batch.output_rows is None else batch.output_rows.count)
        hidden = forward(input_ids, batch)
        assert hidden.shape[0] == (input_ids.shape[0] if batch.output_rows is None else batch.output_rows.count)
        return hidden

    model.forward = recorded
    return counts


def _first_logprobs(outputs) -> torch.Tensor:
    return torch.tensor([[next(iter(e.values())).logprob for e in o.outputs[0].logprobs] for o in outputs])


@pytest.mark.parametrize("arch, last_gdn", [("qwen3.5", False), ("qwen3.5", True), ("qwen3.5-moe", False),
                                            ("llama", False)])
def test_output_rows_give_what_every_row_gives(arch, last_gdn, tmp_path):
    overrides = dict(every_expert(arch), **({"layer_types": GDN_LAST} if last_gdn else {}))
    path = make_checkpoint(arch, str(tmp_path / "model"), seed=random.randrange(1000), **overrides)
    # 48-token steps split the longer prompts: their early chunks sample nothing.
    llm = LLM(path, device="cpu", enable_prefix_caching=False, max_num_batched_tokens=48)
    assert llm.engine.loaded.runner.model.layers[-1].is_attention != last_gdn
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(n)] for n in (1, rng.randint(5, 20), rng.randint(50, 130))]
    counts = _record_output_rows(llm)
    params = dict(max_tokens=5, temperature=0, ignore_eos=True, logprobs=0)
    # The batch, then the longest prompt alone: its early passes sample nothing at all.
    trimmed = llm.generate(prompts, SamplingParams(**params)) + llm.generate(prompts[-1:], SamplingParams(**params))
    assert 0 in counts and any(c for c in counts if c)
    del counts[:]
    every_row = [o for batch in (prompts, prompts[-1:])
                 for o in llm.generate(batch, SamplingParams(prompt_logprobs=0, **params))]
    assert counts and all(c is None for c in counts)
    assert [o.outputs[0].token_ids for o in trimmed] == [o.outputs[0].token_ids for o in every_row]
    torch.testing.assert_close(_first_logprobs(trimmed), _first_logprobs(every_row), atol=1e-5, rtol=0)
