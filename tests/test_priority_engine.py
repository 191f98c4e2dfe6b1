"""Priority scheduling on the engine (the tiny checkpoints on the CPU): LLM.generate's priority and the engine's
add_request(priority=...) decide who is admitted first and who is preempted, and nothing else; under fcfs a
priority other than 0 is refused."""

import random

import numpy as np
import pytest

from deltaserve import LLM, DeltaServeError, InvalidPromptError, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(params=["qwen3.5", "llama"])
def model_path(request, checkpoint_factory):
    return checkpoint_factory(request.param)


def _prompt(rng, low=3, high=20):
    return [rng.randrange(300) for _ in range(rng.randint(low, high))]


def _finish_order(engine, added_later=()):
    """Steps the engine until it is idle, adding each of `added_later` (request id, prompt, priority) after the
    first step; the ids of the requests in the order they finished."""
    order = []
    first = True
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
        if first:
            for request_id, prompt, priority in added_later:
                engine.add_request(request_id, prompt, GREEDY, priority=priority)
            first = False
    return order


def test_generate_admits_prompts_by_priority_then_order(model_path):
    rng = random.Random()
    llm = LLM(model_path, device="cpu", max_num_seqs=1, scheduling_policy="priority")
    prompts = [_prompt(rng) for _ in range(5)]
    priorities = [rng.randint(-2, 2) for _ in prompts]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False, priority=priorities)
    # one sequence at a time: each was scheduled once the one before had finished
    started = sorted(range(len(prompts)), key=lambda i: outputs[i].metrics.scheduled_ts)
    assert started == sorted(range(len(prompts)), key=lambda i: priorities[i])
    alone = llm.generate(prompts, GREEDY, use_tqdm=False)  # priorities 0: the order they came in
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in alone]


def test_a_request_of_higher_priority_added_later_is_admitted_before_earlier_ones(model_path):
    """A full batch of one: the running request is not preempted for it, but it runs next, before the request
    that came before it; under fcfs that one runs first."""
    rng = random.Random()
    prompts = [_prompt(rng) for _ in range(3)]
    for policy, high in (("priority", -1), ("fcfs", 0)):
        engine = LLM(model_path, device="cpu", max_num_seqs=1, scheduling_policy=policy).engine
        engine.add_request("running", prompts[0], GREEDY, priority=0)
        order = _finish_order(engine, [("earlier", prompts[1], 0), ("urgent", prompts[2], high)])
        expected = ["running", "urgent", "earlier"] if policy == "priority" else ["running", "earlier", "urgent"]
        assert order == expected, policy


def test_a_tight_pool_preempts_the_lowest_priority_and_every_request_gets_its_own_tokens(model_path):
    rng = random.Random()
    prompts = [[rng.randrange(300) for _ in range(rng.randint(40, 70))] for _ in range(6)]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    roomy = LLM(model_path, device="cpu").generate(prompts, params, use_tqdm=False)
    # 16 blocks of 16 tokens hold two or three of these sequences at a time; the last added is the most urgent
    small = LLM(model_path, device="cpu", num_kv_blocks=16, max_model_len=256, scheduling_policy="priority")
    engine = small.engine
    priorities = [rng.randint(1, 3) for _ in prompts[:-1]] + [0]
    requests = {}
    for i, (prompt, priority) in enumerate(zip(prompts, priorities)):
        engine.add_request(str(i), prompt, params, priority=priority)
        requests[str(i)] = next(r for r in engine.scheduler.waiting if r.request_id == str(i))
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step() if o.finished)
    assert [finished[str(i)].outputs[0].token_ids for i in range(6)] == [o.outputs[0].token_ids for o in roomy]
    assert engine.stats().num_preemptions > 0 and engine.stats().kv_blocks_used == 0
    assert engine.stats().state_slots_used == 0
    # the most urgent was admitted first and never preempted: another was always served after it
    assert requests["5"].num_preemptions == 0
    preempted = [int(i) for i, r in requests.items() if r.num_preemptions]
    assert all(priorities[i] > 0 for i in preempted)


def test_fcfs_refuses_a_priority_other_than_zero_and_generate_checks_the_list(model_path):
    llm = LLM(model_path, device="cpu")
    prompt = _prompt(random.Random())
    with pytest.raises(InvalidPromptError, match=r"^priority=3: priority scheduling is not enabled .*"
                                                 r"scheduling_policy='priority'"):
        llm.generate([prompt, prompt], GREEDY, use_tqdm=False, priority=[0, 3])
    assert not llm.engine.has_unfinished_requests()  # the first, taken, was let go again
    plain = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate([prompt], GREEDY, use_tqdm=False, priority=[0])[0].outputs[0].token_ids == plain
    assert llm.generate([prompt], GREEDY, use_tqdm=False, priority=[np.int64(0)])[0].outputs[0].token_ids == plain
    for given, named in (([0, 1], "2 values for 1 prompts"), (3, "give a list"), ([True], "must be an integer")):
        with pytest.raises(InvalidPromptError, match=f"^priority.*{named}"):
            llm.generate([prompt], GREEDY, use_tqdm=False, priority=given)
    with pytest.raises(DeltaServeError, match="scheduling_policy='lifo'"):
        LLM(model_path, device="cpu", scheduling_policy="lifo")
