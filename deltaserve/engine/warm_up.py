"""Start-up warm-up: prefill steps of the shapes a server meets, run before the first request, so that
Triton compiles their kernels' variants then rather than in the middle of serving.

Triton compiles a kernel once per specialization: its constexprs (the GDN chunk kernels' BLOCK_B is
the step's sequence count rounded up to a power of two; the pass's row count picks the token loop,
16-row or 64-row chunks, and the token loop's tiles follow the sequence count) and the classes of its
integer arguments (1, a multiple of 16, any other).
Decode steps are compiled when their graphs are captured, prefill steps only when one first needs
them: on an H200 with an empty Triton cache, 36 kernels compiled, 1 to 3 s each, within the first
minute of serving the Qwen3.5-9B shape in closed batches of 32 and 128 requests, and each stalled
every request in flight.

The warm-up sends, through the scheduler like any request, groups of requests for one token each,
whose prompts make one prefill step of each class (the GDN kernels' sequence count and row count, the
conv1d row kernel's run length), then forgets them: the prefix cache is emptied and the counters are
reset. The first request of the first group samples at a temperature, that of the second with top-p too,
that of the third with top-k and that of the fourth takes penalties for two tokens (its second step has an
output to count), so that the sampler's kernels (the race, the nucleus floors and the race that applies
them, the top-k candidates and their race, the penalties) compile before the first request rather than
while it waits. The grammar mask's kernel runs once on its own (Sampler.compile_grammar_mask): a request
with a grammar would build llguidance's view of the vocabulary, which only such a request needs.
"""

from __future__ import annotations

import random

from deltaserve.kernels import SHORT_CHUNK_MAX_ROWS, TOKEN_LOOP_MAX_ROWS
from deltaserve.runner.model_runner import FRESH_PREFILL_MIN_TOKENS
from deltaserve.sampling_params import SamplingParams

# Rows of a prefill step in each of the GDN dispatch's classes (token loop up to 16 rows, 16-row chunks
# up to 128, 64-row chunks above; kernels/__init__.py), as (target, bound), the last one a long pass. A pass
# whose sequences are all within the token loop's rows takes it at any row count, in tiles by its sequence
# count (triton_recurrent.ragged_tiles): many sequences in the larger targets are such passes.
ROW_TARGETS = ((12, 16), (100, 128), (1000, None))
# Sequence counts at both ends of each power-of-two class of BLOCK_B (16 at least), and 1; 96, the
# largest multiple of 16 of the class of 128 that a pass of 16-row chunks can hold with two prompts past the
# token loop's rows (one-token prompts beside them); 8, whose short rows
# make the 64-row tiles of paged attention split their keys 8 ways at Qwen3.5-9B's 4 KV heads.
SEQUENCE_COUNTS = (1, 2, 8, 16, 17, 32, 33, 64, 65, 96, 128, 129, 256, 257, 512, 513, 1024)
# Rows of a pass in each class of the conv1d row kernel's run length (conv1d row_tiles_for: at the
# Qwen3.5 and Qwen3-Next shapes' 8192 channels 8, 16, 32, 64 and 128 rows a program from 65, 1009, 2017,
# 4033 and 8065 rows), each as a multiple of 16 and not, over one sequence, a multiple of 16 of them
# and another count: the classes Triton compiles the kernel for (those within the step's token budget).
# With the GDN groups alone four of them compiled while a fresh server on an empty Triton cache served
# its first closed batches.
CONV_ROW_TARGETS = (96, 100, 352, 360, 1024, 1020, 2032, 2040, 4048, 4050, 8080, 8090)
CONV_SEQUENCE_COUNTS = (1, 16, 17)
# Two prompts of 176 rows, and two of 180: passes whose paged attention splits the keys of its 128-row tiles 4
# and 2 ways, kernels of their own (one prompt of 352 or 360 rows would run as a prefill graph).
ATTENTION_SPLIT_GROUPS = ([176, 176], [180, 180])
EAGER_SHORT_PASS = [SHORT_CHUNK_MAX_ROWS]  # the group whose request asks for prompt logprobs
# One first prompt long enough for the dense attention of fresh prompts, past the prefill graphs' last rung
# (eager), where the step budget holds it (not the server's default of 2048 tokens, under which no step takes
# that attention): cuDNN starts at start-up rather than under the first step that needs it (its first calls
# took about 1 s; each new length after them still builds a plan of its own, 54-57 ms,
# fresh_attention_new_lengths_at_1c13f5a.json).
FRESH_PROMPT = [FRESH_PREFILL_MIN_TOKENS]


def warm_up_groups(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int) -> list[list[int]]:
    """Prompt lengths of each group, every group within one step's token budget: one prefill step
    apiece (with prefix caching on, prompts that end inside a block take a second step for that tail,
    as they do when served)."""
    groups: list[list[int]] = []

    def add(lengths: list[int], bound: int | None = None) -> None:
        """Keeps a group that one step takes, whose rows stay within `bound` (its class), seen once."""
        rows = sum(lengths)
        if (len(lengths) <= max_num_seqs and rows <= max_num_batched_tokens and (bound is None or rows <= bound)
                and max(lengths) <= max_model_len - 2 and lengths not in groups):
            groups.append(lengths)

    for seqs in SEQUENCE_COUNTS:
        for rows, bound in ROW_TARGETS:
            lengths = _ragged(seqs, min(rows, max_num_batched_tokens), max_model_len)
            if bound is not None and sum(lengths) > bound:
                # Many sequences in few rows, as when decode rows share a step with short chunks: one-token
                # prompts beside two longer ones (one-token prompts alone would run as a decode step, and beside
                # one longer prompt as a decode graph and a prefill graph: model_runner.mixed_split_max_rows).
                rest = max(4, min(rows, bound) - (seqs - 2))
                lengths = [1] * (seqs - 2) + [rest // 2, rest - rest // 2]
            add(lengths, bound)
            if seqs > 1 and max(lengths) <= TOKEN_LOOP_MAX_ROWS and bound != TOKEN_LOOP_MAX_ROWS:
                # Sequences this short take the token loop whatever the pass's rows: the same count with two
                # prompts past it runs the chunk kernels of the row class.
                longer = TOKEN_LOOP_MAX_ROWS + 1
                add([1] * (seqs - 2) + [longer, max(longer, sum(lengths) - (seqs - 2) - longer)], bound)
    for seqs in CONV_SEQUENCE_COUNTS:
        for rows in CONV_ROW_TARGETS:
            base, extra = divmod(rows, seqs)  # exactly `rows` rows: their count is the class
            if base >= 2:
                add([base + (i < extra) for i in range(seqs)])
    for lengths in ATTENTION_SPLIT_GROUPS:
        add(lengths)
    add(FRESH_PROMPT)
    # One prompt of as many rows as a short pass takes, sent with prompt logprobs (EAGER_SHORT_PASS), so that it
    # runs eagerly, where the one-sequence passes above up to the prefill graphs' last rung ran as graphs, whose
    # kernels take their metadata from the step buffers: as a pass that asks for prompt logprobs or holds more
    # captures than a graph does runs. On the H200 its GDN prepare kernel (one sequence, 16-row chunks) compiled
    # while the server served 128 requests of 128 tokens, when such a prompt still ran eagerly.
    add(EAGER_SHORT_PASS)
    return groups


def _ragged(seqs: int, rows: int, max_model_len: int) -> list[int]:
    """About `rows` rows over `seqs` prompts of alternating lengths (length, length + 1): ragged, and
    the total not always a multiple of 16; at least two tokens each."""
    length = min(max(2, (rows - seqs // 2) // seqs), max_model_len - 2)
    return [length + (i % 2) for i in range(seqs)]


def warm_up(engine, groups: list[list[int]] | None = None) -> int:
    """Runs the warm-up groups (or `groups`, some of them) through `engine` (an LLMEngine with no
    requests); returns the steps run."""
    assert not engine.has_unfinished_requests(), "warm up an engine before it takes requests"
    config = engine.config
    if groups is None:
        groups = warm_up_groups(config.max_num_seqs, config.max_num_batched_tokens, engine.max_model_len)
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    greedy = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False)
    # a group's rows sample in one step: one kind a group; seeded, so that the engine's generator, which
    # seeds the rows of requests that bring no seed, starts serving where a cold engine's would
    sampled = [SamplingParams(max_tokens=1, temperature=1.0, top_p=top_p, top_k=top_k, ignore_eos=True, seed=0,
                              detokenize=False) for top_p, top_k in ((1.0, -1), (0.9, -1), (1.0, 20))]
    sampled.append(SamplingParams(max_tokens=2, temperature=0, repetition_penalty=1.1, frequency_penalty=0.1,
                                  presence_penalty=0.1, ignore_eos=True, detokenize=False))
    eager = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, detokenize=False, prompt_logprobs=0)
    steps = 0
    for g, lengths in enumerate(groups):
        for i, length in enumerate(lengths):
            params = eager if lengths == EAGER_SHORT_PASS else sampled[g] if i == 0 and g < len(sampled) else greedy
            engine.add_request(f"warm-up-{g}-{i}", [rng.randrange(vocab) for _ in range(length)], params)
        while engine.has_unfinished_requests():
            engine.step(final_only=True)
            steps += 1
    engine.runner.sampler.compile_grammar_mask()
    engine.reset_prefix_cache()
    engine.reset_stats()
    return steps
