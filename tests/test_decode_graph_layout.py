"""The layout of graph-replayed decode steps, run eagerly on CPU: steps padded to a rung of the ladder,
their inputs completed on the device (pending input ids from the tokens the step before sampled, block
tables unpacked) and their greedy tokens taken from the step itself, give what plain steps give, with
asynchronous scheduling, preemption and mixed sampling."""

import random

from deltaserve.engine.llm_engine import LLMEngine
from deltaserve.engine.request import PENDING_TOKEN
from deltaserve.runner.cuda_graphs import DecodeGraphs
from deltaserve.runner.step_buffers import StepBuffers
from tests.test_async_scheduling import _mixed_requests, _run


def _with_uncaptured_decode_graphs(engine: LLMEngine) -> list[bool]:
    """Gives the engine decode graphs that were never captured (each step runs its padded batch eagerly);
    returns a list recording, for each step, whether some row's input id was pending (taken by the step
    from the tokens the last one left, however they were sampled)."""
    loaded, config = engine.loaded, engine.config
    runner = loaded.runner
    buffers = StepBuffers(config.max_num_seqs, -(-loaded.max_model_len // config.block_size), runner.kv_pool,
                          runner.state_pool, runner.device)
    graphs = DecodeGraphs(runner.model, buffers, config.max_num_seqs, loaded.model_config.vocab_size)
    arrivals, run = [], graphs.run

    def recorded(host, token_sources=None):
        pending = [row for row, token in enumerate(host.input_ids) if token == PENDING_TOKEN]
        assert all(token_sources[row] >= 0 for row in pending)
        arrivals.append(bool(pending))
        return run(host, token_sources)

    graphs.run = recorded
    runner.graphs = graphs
    return arrivals


def test_padded_decode_steps_equal_plain_ones(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    seed = rng.randrange(10**6)
    results = []
    for padded in (False, True):
        engine = LLMEngine.from_args(path, device="cpu", num_kv_blocks=12, max_model_len=128, max_num_seqs=6)
        arrivals = _with_uncaptured_decode_graphs(engine) if padded else None
        results.append(_run(engine, _mixed_requests(random.Random(seed), stop_token=3)))
        assert engine.stats().num_preemptions > 0
    assert any(arrivals)  # steps did take pending input ids themselves (after greedy and other sampling)
    assert results[0] == results[1]
