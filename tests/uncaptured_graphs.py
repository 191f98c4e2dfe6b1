"""A drafting engine on the CPU given the graphs a GPU engine captures but never captured: verify graphs, prefill
graphs, and the MTP head's drafting graphs or prompt lookup's decode graphs. Each step they would replay runs
their padded layout eagerly, so the CPU tests the graphs' layout."""

from dataclasses import dataclass, field

from deltaserve.runner.cuda_graphs import DecodeGraphs
from deltaserve.runner.mtp_drafter import MtpDrafter
from deltaserve.runner.mtp_graphs import MtpGraphs
from deltaserve.runner.prefill_graphs import PrefillGraphs, prefill_graph_rows
from deltaserve.runner.step_buffers import StepBuffers
from deltaserve.runner.verify_graphs import VerifyGraphs


@dataclass
class GraphSteps:
    """The passes run through the graphs, appended to as they run: each verify pass as its sequences' own row
    counts (the last token and its drafts), each decode pass as its row count, each prefill pass as its
    chunk's."""

    verify: list[list[int]] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)
    prefill: list[int] = field(default_factory=list)


def with_uncaptured_graphs(engine) -> GraphSteps:
    """Gives the engine (an LLMEngine) the graphs; returns the steps they run."""
    runner, config = engine.runner, engine.config
    speculative = runner.speculative
    k = speculative.num_speculative_tokens
    prompt_rows = prefill_graph_rows(config.max_num_batched_tokens)
    buffers = StepBuffers(config.max_num_seqs, -(-engine.max_model_len // config.block_size), runner.kv_pool,
                          runner.state_pool, runner.device, max_prefill_rows=max(config.max_num_seqs * (k + 1),
                                                                                 prompt_rows))
    steps = GraphSteps()
    speculative.graphs = VerifyGraphs(runner.model, buffers, k, config.max_num_seqs, speculative.verify_states,
                                      config.block_size, speculative.stash)
    _record(speculative.graphs, lambda host: steps.verify.append(_row_counts(host)))
    if isinstance(speculative.drafter, MtpDrafter):
        speculative.drafter.graphs = MtpGraphs(runner.model, buffers, speculative.graphs, k, config.block_size)
    else:  # as a GPU engine's runner holds them (model_setup)
        runner.graphs = DecodeGraphs(runner.model, buffers, config.max_num_seqs, engine.model_config.vocab_size)
        _record(runner.graphs, lambda host: steps.decode.append(len(host.input_ids)))
    runner.prefill_graphs = PrefillGraphs(runner.model, buffers, runner.snapshots, prompt_rows,
                                          every_row=speculative.drafter.reads_hidden)
    _record(runner.prefill_graphs, lambda host: steps.prefill.append(len(host.input_ids)))
    return steps


def _record(graphs, note) -> None:
    run = graphs.run

    def recording(host, *args):
        note(host)
        return run(host, *args)

    graphs.run = recording


def _row_counts(host) -> list[int]:
    starts = host.query_start_loc
    return [b - a for a, b in zip(starts[:-1], starts[1:])]


def recorded_splits(engine) -> list[tuple[int, int]]:
    """The steps run as a verify graph and a prompt chunk's prefill graph (SpeculativeStep._execute_split), as they
    run: (the decoding sequences beside the chunk, none where it ran alone; the chunk's rows)."""
    speculative, splits = engine.runner.speculative, []
    execute_split = speculative._execute_split

    def recorded(runner, plan, decoding, prefill, captures):
        splits.append((len(decoding.chunks) if decoding is not None else 0, prefill.chunks[0].num_tokens))
        return execute_split(runner, plan, decoding, prefill, captures)

    speculative._execute_split = recorded
    return splits
