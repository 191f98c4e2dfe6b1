"""Drafts read off known outputs: an engine's drafter (the MTP head, prompt lookup) still runs, and where it drafts
for a request, its drafts become that request's expected next tokens, each wrong with some chance. So a test sees
drafts kept and refuted on tiny random models, whose own drafts are almost never right (and a benchmark, with every
one right, nearly the most a step can yield)."""

import random

from tests.checkpoints import VOCAB


def read_off_drafts(llm, prompts, expected, rng: random.Random = random, right_chance: float = 0.8) -> None:
    """`expected[i]`: the output of `prompts[i]` (token lists; plain greedy decoding's); each draft is right with
    chance `right_chance` (drawn from `rng`). The drafter's own drafts stand past the expected output's end, and
    wherever a sequence's tokens so far are not its beginning (rounding took the sequence elsewhere)."""
    by_prompt = {tuple(p): e for p, e in zip(prompts, expected)}
    drafter = llm.engine.runner.speculative.drafter
    own_drafts = drafter.propose

    def read_off(hidden, rows, *rung):
        drafts = own_drafts(hidden, rows, *rung)
        for row in rows:
            request = row.chunk.request
            want = by_prompt.get(tuple(request.prompt_token_ids))
            if request not in drafts or want is None:
                continue
            so_far = request.output_token_ids + list(row.chunk.draft_token_ids) + [row.next_token]
            if want[: len(so_far)] != so_far:
                continue
            right = want[len(so_far) : len(so_far) + len(drafts[request])]
            right = [t if rng.random() < right_chance else (t + 1) % VOCAB for t in right]
            drafts[request] = right + drafts[request][len(right):]
        return drafts

    drafter.propose = read_off
