"""Prefix caching on real (tiny, random) hybrid models and the demo model, fp32 on CPU: a hit returns
what a miss returns, recomputes little, and leaves the pools clean."""

import random

import pytest
import torch

from deltaserve import LLM, SamplingParams
from deltaserve.cache.block_hash import chain_hashes
from deltaserve.errors import DeltaServeError
from tests.checkpoints import every_expert

BS = 16
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
WORDS = ("the capital of France is Paris quick brown fox jumps over lazy dog hybrid models mix gated "
         "delta net layers with full attention numbers symbols def main print hello world return").split()


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _run(llm: LLM, jobs, params=GREEDY):
    """Runs (token ids, capture points) jobs together through the engine; outputs in job order."""
    engine = llm.engine
    ids = [f"job{next(_counter)}" for _ in jobs]
    for request_id, (prompt, points) in zip(ids, jobs):
        engine.add_request(request_id, prompt, params, capture_points=points)
    done = {}
    while len(done) < len(ids):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


_counter = iter(range(10**9))

def _checkpoint(checkpoint_factory, arch: str, **overrides) -> str:
    """A hit agrees with a miss to rounding only: MoE checkpoints route to every expert (see every_expert)."""
    return checkpoint_factory(arch, **every_expert(arch), **overrides)


def _tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def _assert_same(warm, cold):
    """The same tokens, and logprobs of the chosen tokens equal up to rounding (a hit computes in
    other passes than a miss)."""
    assert _tokens(warm) == _tokens(cold)
    for w, c in zip(warm, cold):
        lw = [entry[t].logprob for entry, t in zip(w.outputs[0].logprobs, w.outputs[0].token_ids)]
        lc = [entry[t].logprob for entry, t in zip(c.outputs[0].logprobs, c.outputs[0].token_ids)]
        torch.testing.assert_close(torch.tensor(lw), torch.tensor(lc), rtol=0, atol=1e-4)


def _pools_are_clean(llm: LLM):
    stats = llm.engine.stats()
    assert stats.kv_blocks_used == 0 and stats.state_slots_used == 0
    snapshots = llm.engine.loaded.snapshots
    if snapshots is not None:
        assert snapshots.index.num_referenced == 0 and snapshots.index.num_used == snapshots.index.num_ready


class Chat:
    """A ChatML conversation built token by token, so a reply is resent exactly as generated."""

    def __init__(self, tok, system: str):
        self.tok = tok
        self.ids = self._enc(f"<|im_start|>system\n{system}<|im_end|>\n")
        self.offsets = [0]

    def _enc(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def ask(self, message: str) -> tuple[list[int], list[int], int]:
        """Appends a user message and the generation prompt: (prompt, capture points, new tokens)."""
        before = len(self.ids)
        self.offsets.append(len(self.ids))
        self.ids = self.ids + self._enc(f"<|im_start|>user\n{message}<|im_end|>\n")
        self.offsets.append(len(self.ids))
        self.ids = self.ids + self._enc("<|im_start|>assistant\n")
        return list(self.ids), list(self.offsets), len(self.ids) - before

    def answer(self, reply: list[int]) -> int:
        """Appends the reply as generated and its end; returns how many tokens that added past the reply."""
        end = self._enc("<|im_end|>\n")
        self.ids = self.ids + reply + end
        return len(end)


@pytest.mark.parametrize("arch,budget", [("qwen3.5", 2048), ("qwen3.5-moe", 40)])
def test_six_turn_conversation_equals_uncached_and_recomputes_little(arch, budget, checkpoint_factory):
    path = _checkpoint(checkpoint_factory, arch)
    on = LLM(path, device="cpu", max_num_batched_tokens=budget)
    off = LLM(path, device="cpu", max_num_batched_tokens=budget, enable_prefix_caching=False)
    rng = random.Random()
    chat = Chat(on.get_tokenizer(), _text(rng, 4, 10))
    since_reply = 0
    for turn in range(6):
        prompt, points, asked = chat.ask(_text(rng, 2, 10))
        (warm,), (cold,) = _run(on, [(prompt, points)]), _run(off, [(prompt, points)])
        _assert_same([warm], [cold])
        if turn:
            recomputed = len(prompt) - warm.num_cached_tokens
            assert 0 < warm.num_cached_tokens and recomputed <= since_reply + asked + 2 * BS
        since_reply = chat.answer(warm.outputs[0].token_ids)
    _pools_are_clean(on)
    stats = on.engine.stats()
    assert stats.prefix_cache_hits > 0 and stats.prefix_cache_queries > stats.prefix_cache_hits
    assert stats.snapshot_slots_used > 0 and stats.snapshot_slots_total >= stats.snapshot_slots_used


def _assert_byte_identical(first, second):
    a, b = first.outputs[0], second.outputs[0]
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.logprobs == b.logprobs  # dataclass equality: the same floats, ranks and tokens


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_same_prompt_twice_hits_and_is_byte_identical(arch, checkpoint_factory):
    llm = LLM(_checkpoint(checkpoint_factory, arch), device="cpu", max_num_batched_tokens=64)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(130, 190))]
    for params in (SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3),
                   SamplingParams(max_tokens=12, temperature=0.9, seed=rng.randrange(1000), ignore_eos=True,
                                  logprobs=2)):
        llm.reset_prefix_cache()
        cold = llm.generate([prompt], params)[0]
        warm = llm.generate([prompt], params)[0]
        assert cold.num_cached_tokens == 0
        assert warm.num_cached_tokens == (len(prompt) - 1) // BS * BS
        _assert_byte_identical(cold, warm)
    _pools_are_clean(llm)


def test_skip_reading_prefix_cache_computes_the_whole_prompt_and_still_caches_it(checkpoint_factory):
    """vLLM's skip_reading_prefix_cache: the request takes nothing from the cache, returns what a hit returns,
    and what it computed is there for the next request."""
    llm = LLM(_checkpoint(checkpoint_factory, "qwen3.5"), device="cpu", max_num_batched_tokens=64)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(70, 130))]
    skipping = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2, skip_reading_prefix_cache=True)
    reading = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2, skip_reading_prefix_cache=False)
    first = llm.generate([prompt], skipping)[0]
    again = llm.generate([prompt], skipping)[0]
    hit = llm.generate([prompt], reading)[0]
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 0)
    assert hit.num_cached_tokens == (len(prompt) - 1) // BS * BS
    _assert_byte_identical(first, again)
    _assert_byte_identical(first, hit)
    _pools_are_clean(llm)


def test_a_cache_salt_shares_the_cache_only_with_its_own_salt(checkpoint_factory):
    """vLLM's cache_salt: a prompt hits the blocks and snapshots of earlier requests of its salt alone (an
    unsalted request hits no salted one's), and what it returns is what a miss returns."""
    llm = LLM(_checkpoint(checkpoint_factory, "qwen3.5"), device="cpu", max_num_batched_tokens=64)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(70, 130))]
    salts = [f"tenant-{rng.randrange(10**6)}", f"tenant-{rng.randrange(10**6, 2 * 10**6)}"]
    hit = (len(prompt) - 1) // BS * BS

    def run(salt):
        dict_prompt = {"prompt_token_ids": prompt} | ({"cache_salt": salt} if salt is not None else {})
        return llm.generate([dict_prompt], GREEDY, use_tqdm=False)[0]

    first = run(salts[0])
    assert first.num_cached_tokens == 0
    for salt, cached in ((salts[1], 0), (None, 0), (salts[0], hit), (salts[1], hit), (None, hit)):
        out = run(salt)
        assert out.num_cached_tokens == cached, salt
        _assert_byte_identical(first, out)
    with pytest.raises(DeltaServeError, match="cache_salt=''"):
        run("")
    _pools_are_clean(llm)


def test_demo_model_same_chat_twice_is_byte_identical(demo_llm):
    messages = [{"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
                {"role": "user", "content": "Why is the sky blue during the day and red at sunset?"}]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=2)
    demo_llm.reset_prefix_cache()
    cold = demo_llm.chat(messages, params)[0]
    warm = demo_llm.chat(messages, params)[0]
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == (len(warm.prompt_token_ids) - 1) // BS * BS > 0
    _assert_byte_identical(cold, warm)


def test_demo_model_follow_up_turn_reuses_the_first(demo_llm):
    first = [{"role": "user", "content": "Name a large mammal that lives in the ocean."}]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=0)
    demo_llm.reset_prefix_cache()
    out = demo_llm.chat(first, params)[0]
    reply = out.outputs[0].text
    second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "How big is it?"}]
    warm = demo_llm.chat(second, params)[0]
    demo_llm.reset_prefix_cache()
    cold = demo_llm.chat(second, params)[0]
    # The template renders the reply as it was generated, so the second turn starts with every token the
    # first computed, and restores all of them from its tail (all but the last token it sampled).
    computed = out.prompt_token_ids + out.outputs[0].token_ids[:-1]
    assert warm.prompt_token_ids[: len(computed)] == computed
    assert warm.num_cached_tokens == len(computed) and cold.num_cached_tokens == 0
    _assert_same([warm], [cold])


def test_a_reply_that_ends_on_a_block_boundary_is_restored_whole(checkpoint_factory):
    """No tail, and no decode capture there (they come every 256 tokens): the finished request's state
    is saved under its last full block's name."""
    path = _checkpoint(checkpoint_factory, "qwen3.5")
    on = LLM(path, device="cpu", async_scheduling=False)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(40, 70))]
    max_tokens = 2 + (-(len(prompt) + 1)) % BS  # the tokens it computes, prompt and reply, fill whole blocks
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=0)
    reply = on.generate([prompt], params)[0].outputs[0].token_ids
    computed = len(prompt) + len(reply) - 1
    assert computed % BS == 0 and computed % on.engine.config.decode_snapshot_interval
    follow_up = prompt + reply + [rng.randrange(300) for _ in range(rng.randint(3, 20))]
    (warm,), (cold,) = on.generate([follow_up], GREEDY), off.generate([follow_up], GREEDY)
    assert warm.num_cached_tokens == computed
    _assert_same([warm], [cold])
    _pools_are_clean(on)


@pytest.mark.parametrize("arch,async_scheduling", [("qwen3.5", True), ("qwen3.5-moe", False), ("llama", True)])
def test_a_follow_up_turn_restores_from_the_end_of_the_reply(arch, async_scheduling, checkpoint_factory):
    path = _checkpoint(checkpoint_factory, arch)
    on = LLM(path, device="cpu", max_num_batched_tokens=64, async_scheduling=async_scheduling)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    new_tokens = lambda: [rng.randrange(300) for _ in range(rng.randint(3, 20))]  # noqa: E731
    prompt = [rng.randrange(300) for _ in range(rng.randint(40, 70))]
    reply = on.generate([prompt], GREEDY)[0].outputs[0].token_ids
    # Its last token was sampled, not computed: the turn before cached everything up to it.
    follow_up = prompt + reply + new_tokens()
    warm, again = (on.generate([follow_up], GREEDY)[0] for _ in range(2))
    assert warm.num_cached_tokens == again.num_cached_tokens == len(prompt) + len(reply) - 1
    _assert_same([warm], off.generate([follow_up], GREEDY))
    _assert_byte_identical(warm, again)
    # Stopped by a token: with asynchronous scheduling the row after it ran before the stop was known,
    # and that row counts too (its input was the stop token), unless the prefill itself sampled the stop
    # token in a step that reads its token back before the next is planned: one of more than one row. A
    # prompt sent again that restores to its last token recomputes one row, a step that looks like decode
    # and is launched as one.
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[reply[3]])
    stop_at = reply.index(reply[3])
    one_row_pass = on.generate([prompt], params)[0].num_cached_tokens == len(prompt) - 1
    new = new_tokens()
    new[0] = (reply[stop_at + 1] + 1 + new[0] % 299) % 300  # not the greedy turn's next token: no longer match
    follow_up = prompt + reply[: stop_at + 1] + new
    (warm,), (cold,) = on.generate([follow_up], GREEDY), off.generate([follow_up], GREEDY)
    # (When the stop token ends a decode snapshot's interval, the greedy turn's decode saved that block and
    # its state: better. Without GDN layers a block is all there is to save: the greedy turn's full blocks
    # reach as far.)
    interval = BS if on.engine.loaded.snapshots is None else on.engine.config.decode_snapshot_interval
    ends_a_block = (len(prompt) + stop_at + 1) // interval * interval
    ran_on = async_scheduling and (stop_at > 0 or one_row_pass)
    assert warm.num_cached_tokens == max(len(prompt) + stop_at + ran_on, ends_a_block)
    _assert_same([warm], [cold])
    _pools_are_clean(on)


def test_a_prompt_restored_to_its_last_token_runs_on_past_a_stop_like_decode(checkpoint_factory):
    """The corner of the test above where the stop token is the first one sampled and the prompt sent again
    restores to its last token: that one-row pass is launched like a decode step, so the row after the
    stop token runs before the stop is known, and its state is cached too."""
    path = _checkpoint(checkpoint_factory, "qwen3.5")
    on = LLM(path, device="cpu", max_num_batched_tokens=64, async_scheduling=True)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(2, 4) * BS + 1)]
    reply = on.generate([prompt], GREEDY)[0].outputs[0].token_ids
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[reply[0]])
    stopped = on.generate([prompt], params)[0]
    assert stopped.num_cached_tokens == len(prompt) - 1 and stopped.outputs[0].token_ids == reply[:1]
    follow_up = prompt + reply[:1] + [rng.randrange(300) for _ in range(rng.randint(3, 20))]
    (warm,), (cold,) = on.generate([follow_up], GREEDY), off.generate([follow_up], GREEDY)
    assert warm.num_cached_tokens == len(prompt) + 1
    _assert_same([warm], [cold])
    _pools_are_clean(on)


@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_eight_chats_sharing_a_long_history_recompute_only_their_last_message(arch, checkpoint_factory):
    path = _checkpoint(checkpoint_factory, arch, max_position_embeddings=1024)  # a context the history fits in
    on = LLM(path, device="cpu", max_model_len=1024)
    off = LLM(path, device="cpu", max_model_len=1024, enable_prefix_caching=False)
    tok = on.get_tokenizer()
    rng = random.Random()
    history = [{"role": "system", "content": _text(rng, 60, 70)}]
    for _ in range(2):
        history += [{"role": "user", "content": _text(rng, 10, 20)},
                    {"role": "assistant", "content": _text(rng, 10, 20)}]
    while tok.message_offsets(history + [{"role": "user", "content": "x"}])[-1] < 400:  # words of few tokens
        history[0]["content"] += " " + _text(rng, 10, 10)
    chats = [history + [{"role": "user", "content": _text(rng, 2, 12)}] for _ in range(8)]
    shared = tok.message_offsets(chats[0])[-1]
    assert 400 <= shared <= 900  # a long history, and room in max_model_len for the last message and reply
    cold = off.chat(chats, GREEDY)
    warm = on.chat(chats[:1], GREEDY) + on.chat(chats[1:], GREEDY)
    _assert_same(warm, cold)
    for chat, out in zip(chats[1:], warm[1:]):
        last_message = len(out.prompt_token_ids) - tok.message_offsets(chat)[-1]
        assert out.num_cached_tokens > 0
        assert len(out.prompt_token_ids) - out.num_cached_tokens <= last_message + BS
    _pools_are_clean(on)


def test_snapshots_mid_chunk_at_chunk_edges_at_zero_and_at_the_last_token(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    # passes [0, 48) [48, 96) [96, 100); decode captures at every block
    on = LLM(path, device="cpu", max_num_batched_tokens=48, decode_snapshot_interval=BS)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(100)]
    (out,) = _run(on, [(prompt, [0, 20, 48, 69, 99])], SamplingParams(max_tokens=14, temperature=0, ignore_eos=True))
    tokens = prompt + out.outputs[0].token_ids
    snapshots = on.engine.loaded.snapshots
    names = chain_hashes(tokens, BS)
    # 16 and 64 mid-chunk (messages), 80 mid-chunk (a block before the cut), 48 at a chunk edge (a
    # message), 96 at the cut (the last token, 99, floored), 112 during decode; nothing at 0.
    expected = [16, 48, 64, 80, 96, 112]
    saved = [(i + 1) * BS for i, name in enumerate(names) if snapshots.index.find(name) is not None]
    assert saved == expected
    for position in expected:
        _run(off, [(tokens[:position], [])], SamplingParams(max_tokens=1))  # leaves its state in slot 0
        slot = snapshots.index.find(names[position // BS - 1])
        for layer in snapshots.h:
            state = off.engine.runner.state_pool
            torch.testing.assert_close(snapshots.h[layer][slot], state.h[layer][0], rtol=1e-4, atol=1e-5)
            # The conv state holds projections of values up to about 4: the passes' different splits move
            # them by up to 1.5e-5 over twelve seeded prompts, past 1e-5 where a value is small.
            torch.testing.assert_close(snapshots.conv[layer][slot], state.conv[layer][0], rtol=1e-4, atol=1e-4)
    # A prompt that ends on a block boundary saves the state at its end, and each point restores exactly
    # where it was saved, to the same tokens as a cold run.
    # (Each job leaves the text at `position`: none continues the tail the run above left at 113.)
    jobs = [(tokens[:position] + [(tokens[position] + rng.randrange(1, 300)) % 300]
             + [rng.randrange(300) for _ in range(4)], []) for position in expected]
    jobs.append((tokens[:64] + [rng.randrange(300) for _ in range(64)], []))  # 128 tokens, a multiple of 16
    warm = _run(on, jobs)
    assert [o.num_cached_tokens for o in warm] == expected + [64]
    _assert_same(warm, _run(off, jobs))
    assert snapshots.index.find(chain_hashes(jobs[-1][0], BS)[-1]) is not None
    _pools_are_clean(on)


def test_eviction_with_few_blocks_and_two_snapshot_slots_keeps_outputs_correct(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    tight = LLM(path, device="cpu", num_kv_blocks=20, max_model_len=256, ssm_snapshot_slots=2,
                max_num_batched_tokens=40)
    roomy = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    chat = Chat(tight.get_tokenizer(), _text(rng, 4, 8))
    for _ in range(2):
        # The conversation beside two other prompts: 20 blocks hardly hold them all.
        prompt, points, _ = chat.ask(_text(rng, 2, 6))
        jobs = [(prompt, points)] + [([rng.randrange(300) for _ in range(rng.randint(40, 90))], []) for _ in range(2)]
        outs = _run(tight, jobs)
        _assert_same(outs, _run(roomy, jobs))
        chat.answer(outs[0].outputs[0].token_ids)
        # Its next turn alone, twice: the second restarts where the first's last pass started (where it
        # restored from, or its last block boundary when it restored nothing), whose snapshot is still there.
        prompt, points, _ = chat.ask(_text(rng, 2, 6))
        first, again = _run(tight, [(prompt, points)]), _run(tight, [(prompt, points)])
        _assert_same(first, _run(roomy, [(prompt, points)]))
        _assert_byte_identical(first[0], again[0])
        assert again[0].num_cached_tokens == (first[0].num_cached_tokens or (len(prompt) - 1) // BS * BS)
        chat.answer(first[0].outputs[0].token_ids)
    blocks, snapshots = tight.engine.loaded.blocks, tight.engine.loaded.snapshots.index
    assert blocks.num_evictions > 0 and snapshots.num_evictions > 0
    _pools_are_clean(tight)


@pytest.mark.parametrize("arch", ["llama", "qwen3.5"])
def test_a_prompt_leaving_a_preempted_reply_takes_none_of_the_blocks_it_named_later(arch, checkpoint_factory):
    """A preempted request's names are remembered as far as its tokens then went; it goes on naming blocks,
    and a later prompt that leaves its reply past that point must not take those names (with them, the
    blocks and snapshots of tokens it does not have)."""
    path = checkpoint_factory(arch)
    tight = LLM(path, device="cpu", block_size=4, num_kv_blocks=16, max_model_len=64)
    roomy = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    x, z = ([rng.randrange(300) for _ in range(20)] for _ in range(2))
    reply = tight.generate([x, z], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[1].outputs[0]
    assert tight.engine.stats().num_preemptions >= 1
    for leave in rng.sample(range(1, 29), 8):
        y = z + reply.token_ids[:leave] + [(reply.token_ids[leave] + 1) % 300] + [rng.randrange(300) for _ in range(5)]
        got = tight.generate([y], GREEDY)[0]
        _assert_same([got], roomy.generate([y], GREEDY))
        assert got.num_cached_tokens <= 20 + leave
    _pools_are_clean(tight)


def test_two_interleaved_conversations_sharing_a_system_prompt(checkpoint_factory):
    path = _checkpoint(checkpoint_factory, "qwen3.5-moe")
    on = LLM(path, device="cpu", max_num_batched_tokens=64)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    rng = random.Random()
    tok = on.get_tokenizer()
    system = _text(rng, 25, 35)
    a, b = Chat(tok, system), Chat(tok, system)
    schedule = [[a], [b], [a, b], [b], [a], [a, b]]  # who sends this round (together when two)
    for turn, senders in enumerate(schedule):
        jobs = [chat.ask(_text(rng, 2, 8))[:2] for chat in senders]
        warm = _run(on, jobs)
        _assert_same(warm, _run(off, jobs))
        if turn:
            assert all(o.num_cached_tokens > 0 for o in warm)
        for chat, out in zip(senders, warm):
            chat.answer(out.outputs[0].token_ids)
    _pools_are_clean(on)


def test_aborted_request_releases_its_blocks_and_snapshot_references(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    on = LLM(path, device="cpu", max_num_batched_tokens=32)
    off = LLM(path, device="cpu", enable_prefix_caching=False)
    engine = on.engine
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(150)]
    engine.add_request("long", prompt, GREEDY, capture_points=[40, 90])
    for _ in range(3):  # three prefill passes of 32 tokens
        engine.step()
    assert engine.stats().kv_blocks_used == 6 and engine.loaded.snapshots.index.num_ready > 0
    engine.abort("long")
    _pools_are_clean(on)
    # What it cached before the abort still serves a request with the same start, correctly.
    follow = prompt[:96] + [rng.randrange(300) for _ in range(20)]
    (warm,) = _run(on, [(follow, [])])
    assert warm.num_cached_tokens == 80  # its snapshots: 16 (pass end) .. 80 (last block boundary inside)
    _assert_same([warm], _run(off, [(follow, [])]))
    # Aborted while decoding after a restore, too.
    engine.add_request("again", follow, SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine.stats().kv_blocks_used > 0
    engine.abort("again")
    _pools_are_clean(on)


def test_prefix_caching_knobs_are_validated(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    with pytest.raises(DeltaServeError, match="ssm_snapshot_slots"):
        LLM(path, device="cpu", ssm_snapshot_slots=-1)
    with pytest.raises(DeltaServeError, match="ssm_snapshot_interval"):
        LLM(path, device="cpu", ssm_snapshot_interval=0)
    with pytest.raises(DeltaServeError, match="decode_snapshot_interval"):
        LLM(path, device="cpu", decode_snapshot_interval=-16)
    llm = LLM(path, device="cpu", ssm_snapshot_slots=3)
    assert llm.engine.stats().snapshot_slots_total == 3
    assert LLM(path, device="cpu", enable_prefix_caching=False).engine.loaded.snapshots is None


def test_metrics_report_hit_rate_cached_tokens_and_snapshot_slots(checkpoint_factory):
    from deltaserve.server.metrics import ServerMetrics

    llm = LLM(checkpoint_factory("qwen3.5"), device="cpu", ssm_snapshot_slots=5)
    prompt = [random.randrange(300) for _ in range(40)]
    llm.generate([prompt, prompt[:36]], GREEDY)
    llm.generate([prompt], GREEDY)  # 32 of its 40 tokens found
    stats = llm.engine.stats()
    assert stats.prefix_cache_queries == 40 + 36 + 40 and stats.prefix_cache_hits == 32
    text = ServerMetrics(llm.engine.stats).render().decode()
    assert f"deltaserve_prefix_cache_hit_rate {32 / 116}" in text
    assert "deltaserve_prefix_cache_hits_total 32.0" in text
    assert f"deltaserve_snapshot_slots_used {float(stats.snapshot_slots_used)}" in text
    assert "deltaserve_snapshot_slots_total 5.0" in text and stats.snapshot_slots_used > 0


def test_a_bfloat16_gdn_state_replays_exactly_and_stays_near_float32(checkpoint_factory):
    path = checkpoint_factory("qwen3.5")
    half = LLM(path, device="cpu", max_num_batched_tokens=64, gdn_state_dtype="bfloat16")
    full = LLM(path, device="cpu", max_num_batched_tokens=64)
    loaded = half.engine.loaded
    snapshot_states = next(iter(loaded.snapshots.h.values()))
    assert loaded.runner.state_pool.h_all.dtype == snapshot_states.dtype == torch.bfloat16
    rng = random.Random()
    prompt = [rng.randrange(300) for _ in range(rng.randint(130, 190))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    cold, warm = (half.generate([prompt], params)[0] for _ in range(2))
    assert warm.num_cached_tokens > 0
    _assert_byte_identical(cold, warm)
    # The state rounds to bf16 between passes only: the first token is fp32's choice or, on a near tie, its
    # runner-up, with about the same logprob.
    reference = full.generate([prompt], params)[0].outputs[0].logprobs[0]
    first = cold.outputs[0]
    chosen = first.token_ids[0]
    assert chosen in reference and reference[chosen].rank <= 2
    assert abs(first.logprobs[0][chosen].logprob - reference[chosen].logprob) < 2e-2
    with pytest.raises(DeltaServeError, match="gdn_state_dtype"):
        LLM(path, device="cpu", gdn_state_dtype="float16")
