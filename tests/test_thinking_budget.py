"""thinking_token_budget: a think block's end is forced once it holds the budget's tokens (vLLM's meaning)."""

import random
import shutil

import pytest

from deltaserve import LLM, SamplingParams
from deltaserve.engine.thinking_budget import ThinkingBudget
from deltaserve.errors import InvalidSamplingParamsError
from tests.checkpoints import add_think_tokens

START, END = 1000, 1001  # tag ids for the plain-Python cases, outside the random tokens below


def feed(budget: ThinkingBudget, tokens: list[int]) -> list[int | None]:
    """The forced token before each of `tokens`, each then taken."""
    forced = []
    for token in tokens:
        forced.append(budget.forced_token)
        budget.accept(token)
    return forced


def free_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100) for _ in range(n)]


def test_a_block_the_prompt_opens_is_ended_after_the_budget():
    rng = random.Random()
    size = rng.randint(0, 12)
    budget = ThinkingBudget(size, [START], [END], free_tokens(rng, 5) + [START])
    thoughts = free_tokens(rng, size)
    assert feed(budget, thoughts) == [None] * size
    assert budget.forced_token == END
    budget.accept(END)
    assert feed(budget, free_tokens(rng, 20)) == [None] * 20  # the answer after the block is free


def test_thoughts_already_in_the_prompt_count():
    rng = random.Random()
    size, already = rng.randint(3, 12), rng.randint(0, 2)
    budget = ThinkingBudget(size, [START], [END], [START] + free_tokens(rng, already))
    assert feed(budget, free_tokens(rng, size - already)) == [None] * (size - already)
    assert budget.forced_token == END
    over = ThinkingBudget(size, [START], [END], [START] + free_tokens(rng, size + rng.randint(0, 5)))
    assert over.forced_token == END  # a prompt past the budget: its end comes first


def test_a_block_closed_in_the_prompt_or_by_the_model_is_left_alone():
    rng = random.Random()
    closed = ThinkingBudget(2, [START], [END], [START] + free_tokens(rng, 5) + [END] + free_tokens(rng, 3))
    assert feed(closed, free_tokens(rng, 30)) == [None] * 30
    early = ThinkingBudget(10, [START], [END], [START])
    assert feed(early, free_tokens(rng, 4) + [END] + free_tokens(rng, 30)) == [None] * 35


def test_forced_after_drafts_is_the_forced_token_once_they_are_taken_and_moves_nothing():
    # A speculative verify row's forced token: the budget as it would stand after the drafts before the row, with
    # multi-token tags (the end forced one token after another), the block closed or reopened among the drafts.
    rng = random.Random()
    start, end = [START, 7], [END, 8, 9]
    for _ in range(50):
        pool = free_tokens(rng, 6) + start + end
        prompt = free_tokens(rng, 3) + start + free_tokens(rng, rng.randint(0, 4))
        budget = ThinkingBudget(rng.randint(0, 5), start, end, prompt)
        feed(budget, [rng.choice(pool) for _ in range(rng.randint(0, 6))])
        state = vars(budget).copy()
        drafts = [rng.choice(pool + [END, 8, 9] * 2) for _ in range(rng.randint(0, 5))]
        walked = ThinkingBudget(budget.budget, start, end, [])
        vars(walked).update({**state, "_recent": list(budget._recent)})
        feed(walked, drafts)
        assert budget.forced_after(drafts) == walked.forced_token
        assert vars(budget) == state


def test_a_block_the_output_opens_is_counted_from_its_start():
    rng = random.Random()
    size = rng.randint(0, 8)
    budget = ThinkingBudget(size, [START], [END], free_tokens(rng, 6))
    before = free_tokens(rng, rng.randint(0, 10))
    assert feed(budget, before + [START] + free_tokens(rng, size)) == [None] * (len(before) + 1 + size)
    assert budget.forced_token == END
    budget.accept(END)
    # a second block is counted afresh
    assert feed(budget, [START] + free_tokens(rng, size)) == [None] * (size + 1)
    assert budget.forced_token == END


def test_an_end_of_several_tokens_is_forced_whole():
    rng = random.Random()
    start, end = [START, START + 2], [END, END + 2, END + 4]
    size = rng.randint(0, 6)
    budget = ThinkingBudget(size, start, end, free_tokens(rng, 3) + start)
    assert feed(budget, free_tokens(rng, size)) == [None] * size
    assert feed(budget, end) == end
    assert budget.forced_token is None and not budget.in_block


# -- through the engine -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_llm(checkpoint_factory, tmp_path_factory):
    """A tiny Qwen3.5 checkpoint whose tokenizer has <think> and </think> as tokens of their own, as Qwen's has."""
    path = tmp_path_factory.mktemp("thinking")
    shutil.copytree(checkpoint_factory("qwen3.5"), path, dirs_exist_ok=True)
    start, end = add_think_tokens(str(path))
    return LLM(str(path), device="cpu"), start, end


def end_due_at(tokens: list[int], budget: int, start: int, end: int, already: int = 0) -> int | None:
    """Where a run whose prompt opened its block (`already` tokens after its start) must write `end`, walking its
    tokens: after `budget` thoughts since the last `start`, unless the run closes the block itself first (None)."""
    count = already
    for i, token in enumerate(tokens):
        if count >= budget:
            return i
        if token == end:
            return None
        count = 0 if token == start else count + 1
    return None  # not due within these tokens


def forced_positions(tokens: list[int], budget: int, start: int, end: int) -> set[int]:
    """Where a run whose prompt opened its block was forced to write `end`: each block (a later one the run opens
    itself too) once it held `budget` thoughts."""
    forced, in_block, count = set(), True, 0
    for i, token in enumerate(tokens):
        if in_block and count >= budget:
            forced.add(i)
        if token == start:
            in_block, count = True, 0
        elif token == end:
            in_block = False
        elif in_block:
            count += 1
    return forced


def test_the_engine_forces_the_end_after_the_budget(thinking_llm):
    llm, start, end = thinking_llm
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(2, 20))] + [start]
    budget = rng.randint(0, 8)
    greedy = dict(max_tokens=budget + 6, temperature=0, ignore_eos=True, logprobs=1)
    free = llm.generate([prompt], SamplingParams(**greedy))[0].outputs[0]
    kept = llm.generate([prompt], SamplingParams(thinking_token_budget=budget, **greedy))[0].outputs[0]
    at = end_due_at(free.token_ids, budget, start, end)
    if at is None:
        assert kept.token_ids == free.token_ids
        return
    assert kept.token_ids[:at] == free.token_ids[:at] and kept.token_ids[at] == end
    assert len(kept.token_ids) == budget + 6  # the reply goes on after the block
    forced = forced_positions(kept.token_ids, budget, start, end)
    assert at in forced and all(kept.token_ids[i] == end for i in forced)
    for i, (token, entry) in enumerate(zip(kept.token_ids, kept.logprobs)):
        if i not in forced:  # every other token is the model's own greedy choice, a forced one its own logprob
            assert entry[token].rank == 1, i
    assert "</think>" in kept.text  # an added token, not a special one: its text stays, as Qwen's


def test_each_sample_and_each_row_of_a_batch_keeps_its_own_count(thinking_llm):
    llm, start, end = thinking_llm
    rng = random.Random()
    budgets = [rng.randint(0, 6) for _ in range(3)]
    prompts = [[rng.randrange(300) for _ in range(rng.randint(2, 12))] + [start] for _ in budgets]
    params = [SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=rng.randrange(2**31), ignore_eos=True,
                             thinking_token_budget=b) for b in budgets]
    plain = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outputs = llm.generate(prompts + [prompts[0]], params + [plain])
    for budget, out in zip(budgets, outputs):
        for sample in out.outputs:
            at = end_due_at(sample.token_ids, budget, start, end)
            assert at is None or sample.token_ids[at] == end, (budget, sample.token_ids)
            assert end in sample.token_ids[: budget + 1] or start in sample.token_ids, (budget, sample.token_ids)
    alone = llm.generate([prompts[0]], plain)[0].outputs[0]
    assert outputs[-1].outputs[0].token_ids == alone.token_ids  # a row without a budget is untouched


def test_a_model_without_think_tokens_refuses_a_budget(checkpoint_factory):
    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu")
    with pytest.raises(InvalidSamplingParamsError, match="thinking_token_budget=4: .*no <think> and </think>"):
        llm.generate(["hi"], SamplingParams(max_tokens=2, thinking_token_budget=4))
    out = llm.generate(["hi"], SamplingParams(max_tokens=2, thinking_token_budget=-1))[0]  # -1: no budget
    assert len(out.outputs[0].token_ids) >= 1


def test_a_structure_holds_after_the_think_block_the_prompt_opens(thinking_llm):
    """As on the server's routes: the reasoning stays free, the budget ends it, and the answer is held."""
    import re

    from deltaserve import StructuredOutputsParams

    llm, start, end = thinking_llm
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(2, 12))] + [start]
    budget = rng.randint(0, 5)
    structure = StructuredOutputsParams(regex="[a-z]{1,6}")
    # the random model's end of sequence held back (it may come first among the thoughts, left free)
    unlikely = {eos: -100.0 for eos in llm.engine.eos_token_ids}
    out = llm.generate([prompt], SamplingParams(max_tokens=budget + 12, temperature=0, thinking_token_budget=budget,
                                                logit_bias=unlikely, structured_outputs=structure))[0].outputs[0]
    at = end_due_at(out.token_ids, budget, start, end)
    assert out.finish_reason == "stop" and (at is None or out.token_ids[at] == end), out
    closed = out.token_ids.index(end)
    answer = llm.get_tokenizer().decode(out.token_ids[closed + 1 :])
    assert re.fullmatch("[a-z]{1,6}", answer), answer


def test_a_structure_waits_for_the_end_of_a_block_the_output_opens(thinking_llm):
    """A prompt that holds no think tag (a template whose model opens its block itself): the first token may be
    <think>, and the structure then holds from the block's end; a prompt whose block is closed is held at once."""
    import re

    from deltaserve import StructuredOutputsParams

    llm, start, end = thinking_llm
    rng = random.Random()
    words = [rng.randrange(300) for _ in range(rng.randint(2, 12))]
    # the bias writes <think> wherever it may (a <think> in the block starts its count again), the budget of 0 its
    # end straight after
    params = SamplingParams(max_tokens=12, temperature=0, thinking_token_budget=0, logit_bias={start: 100.0},
                            structured_outputs=StructuredOutputsParams(regex="[a-z]{1,6}"))
    opened, closed = llm.generate([words, words + [start, 5, end]], params)
    tokens = opened.outputs[0].token_ids
    assert tokens[:2] == [start, end] and opened.outputs[0].finish_reason == "stop", tokens
    assert re.fullmatch("[a-z]{1,6}", llm.get_tokenizer().decode(tokens[2:]))
    held = closed.outputs[0]  # the bias cannot lift the <think> the grammar refuses
    assert start not in held.token_ids and re.fullmatch("[a-z]{1,6}", held.text), held


def test_a_budget_that_ends_the_block_where_an_active_grammar_refuses_names_both(thinking_llm):
    """A grammar that holds the think block itself (the prompt opens none; the grammar writes <think> first) does
    not take the budget's forced end: the request ends with an error naming both fields, and the engine serves on."""
    llm, start, end = thinking_llm
    from deltaserve import StructuredOutputsParams

    grammar = "start: <think> /[a-z]{1,40}/"  # llguidance's Lark: the <think> token, then letters
    params = SamplingParams(max_tokens=16, temperature=0, thinking_token_budget=2,
                            structured_outputs=StructuredOutputsParams(grammar=grammar))
    with pytest.raises(InvalidSamplingParamsError, match="thinking_token_budget ended the think block at output "
                                                         "token 3 where structured_outputs does not take its end"):
        llm.generate([[5, 6, 7]], params)
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids
