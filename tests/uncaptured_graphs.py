"""A drafting engine on the CPU given verify graphs (and, for the MTP head, drafting graphs) that were never
captured: each step they would replay runs their padded layout eagerly, so the CPU tests the graphs' layout."""

from deltaserve.runner.mtp_drafter import MtpDrafter
from deltaserve.runner.mtp_graphs import MtpGraphs
from deltaserve.runner.step_buffers import StepBuffers
from deltaserve.runner.verify_graphs import VerifyGraphs


def with_uncaptured_graphs(engine) -> list[list[int]]:
    """Gives the engine (an LLMEngine) the graphs; returns the list of the steps run through them, each as its
    sequences' own row counts (the last token and its drafts), appended to as they run."""
    runner, config = engine.runner, engine.config
    k = runner.speculative.num_speculative_tokens
    buffers = StepBuffers(config.max_num_seqs, -(-engine.max_model_len // config.block_size), runner.kv_pool,
                          runner.state_pool, runner.device, max_prefill_rows=config.max_num_seqs * (k + 1))
    graphs = VerifyGraphs(runner.model, buffers, k, config.max_num_seqs, runner.speculative.verify_states,
                          config.block_size)
    replayed, run = [], graphs.run

    def recording(host):
        starts = host.query_start_loc
        replayed.append([b - a for a, b in zip(starts[:-1], starts[1:])])
        return run(host)

    graphs.run = recording
    runner.speculative.graphs = graphs
    if isinstance(runner.speculative.drafter, MtpDrafter):
        runner.speculative.drafter.graphs = MtpGraphs(runner.model, buffers, graphs, k, config.block_size)
    return replayed
