"""Drafts read off known outputs: an engine's drafter (the MTP head, prompt lookup) still runs, and where it drafts
for a request, its drafts become that request's expected next tokens, each wrong with some chance. So a test sees
drafts kept and refuted on tiny random models, whose own drafts are almost never right (and a benchmark, with every
one right, nearly the most a step can yield)."""

import random

from tests.checkpoints import VOCAB


def read_off_drafts(llm, prompts, expected, rng: random.Random = random, right_chance: float = 0.8) -> None:
    """`expected[i]`: the output of `prompts[i]` (token lists; plain greedy decoding's); each draft is right with
    chance `right_chance`, drawn for its prompt and output position from a seed `rng` gives (so two engines that
    draft for the same positions, in whatever order, draft alike). The drafter's own drafts stand past the expected
    output's end, and wherever a sequence's tokens so far are not its beginning (rounding took the sequence
    elsewhere)."""
    by_prompt = {tuple(p): (i, e) for i, (p, e) in enumerate(zip(prompts, expected))}
    seed = rng.randrange(2**63)
    drafter = llm.engine.runner.speculative.drafter
    own_drafts = drafter.propose

    def read_off(hidden, rows, *rung):
        drafts = own_drafts(hidden, rows, *rung)
        for row in rows:
            request = row.chunk.request
            index, want = by_prompt.get(tuple(request.prompt_token_ids), (None, None))
            if request not in drafts or want is None:
                continue
            so_far = request.output_token_ids + list(row.chunk.draft_token_ids) + [row.next_token]
            if want[: len(so_far)] != so_far:
                continue
            start = len(so_far)
            right = want[start : start + len(drafts[request])]
            right = [t if is_right(index, start + j) else (t + 1) % VOCAB for j, t in enumerate(right)]
            drafts[request] = right + drafts[request][len(right):]
        return drafts

    def is_right(index: int, position: int) -> bool:
        return right_chance >= 1.0 or random.Random(f"{seed}:{index}:{position}").random() < right_chance

    drafter.propose = read_off
