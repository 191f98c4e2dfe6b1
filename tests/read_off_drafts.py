"""Drafts read off known outputs: an engine's drafter (the MTP head, prompt lookup) still runs, and where it drafts
for a request, its drafts become that request's expected next tokens, each wrong with some chance. So a test sees
drafts kept and refuted on tiny random models, whose own drafts are almost never right."""

import random

from tests.checkpoints import VOCAB


def read_off_drafts(llm, prompts, expected, rng: random.Random = random) -> None:
    """`expected[i]`: the output of `prompts[i]` (plain greedy decoding's); each draft is right with chance 0.8
    (drawn from `rng`). Past the expected output's end, the drafter's own drafts stand."""
    by_prompt = {tuple(p): e for p, e in zip(prompts, expected)}
    drafter = llm.engine.runner.speculative.drafter
    own_drafts = drafter.propose

    def read_off(hidden, rows, *rung):
        drafts = own_drafts(hidden, rows, *rung)
        for row in rows:
            request = row.chunk.request
            if request in drafts:
                first = row.chunk.end + 1 - request.num_prompt_tokens
                right = by_prompt[tuple(request.prompt_token_ids)][first : first + len(drafts[request])]
                right = [t if rng.random() < 0.8 else (t + 1) % VOCAB for t in right]
                drafts[request] = right + drafts[request][len(right):]
        return drafts

    drafter.propose = read_off
