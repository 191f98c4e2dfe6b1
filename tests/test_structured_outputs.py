"""Structured outputs: greedy tokens under a grammar are transformers' argmax over the tokens the grammar
allows, sampled outputs always match it, a constrained request gives what it gives alone beside others, and a
grammar that does not compile is refused by name with nothing held."""

import json
import random
import string

import pytest
import torch

from deltaserve import LLM, SamplingParams, StructuredOutputsParams
from deltaserve.engine.closed_schema import closed_objects
from deltaserve.engine.grammar import RequestGrammar, mask_shape
from deltaserve.kernels.sampling.reference import allowed_tokens, token_bits, without_tokens
from deltaserve.errors import InvalidSamplingParamsError, NoTokenAllowedError
from tests.reference import load_reference

llguidance = pytest.importorskip("llguidance")


def _random_structure(rng: random.Random) -> StructuredOutputsParams:
    """One of each kind, its content drawn afresh."""
    kind = rng.choice(["json", "regex", "choice", "gbnf", "lark"])
    if kind == "json":
        names = rng.sample(["name", "city", "age", "ok", "tags"], rng.randint(1, 3))
        types = {"name": {"type": "string", "maxLength": 6}, "city": {"enum": ["Paris", "Oslo", "Lima"]},
                 "age": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"},
                 "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}}
        return StructuredOutputsParams(json={"type": "object", "properties": {n: types[n] for n in names},
                                             "required": names, "additionalProperties": False})
    if kind == "regex":
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 3)))
        return StructuredOutputsParams(regex=f"{word}[a-z]{{1,4}}( [0-9]{{1,3}}){{1,{rng.randint(1, 3)}}}")
    if kind in ("gbnf", "lark"):  # a word, then one to `most` numbers, each rule of its own
        word, most = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 3))), rng.randint(1, 3)
        if kind == "gbnf":
            return StructuredOutputsParams(grammar=f'root ::= head (" " number){{1,{most}}}\nhead ::= "{word}" '
                                                   f'[a-z]{{1,4}}\nnumber ::= [0-9] [0-9]? [0-9]?')
        tail = "".join(' (" " NUMBER)?' for _ in range(most - 1))
        return StructuredOutputsParams(grammar=f'start: head " " NUMBER{tail}\nhead: "{word}" /[a-z]{{1,4}}/\n'
                                               f'NUMBER: /[0-9]{{1,3}}/')
    words = ["".join(rng.choice(string.ascii_letters + " ") for _ in range(rng.randint(1, 8))) for _ in range(4)]
    return StructuredOutputsParams(choice=[w for w in words if w.strip()] or ["yes"])


def _reference_grammar(path: str, structure: StructuredOutputsParams):
    """An llguidance matcher built apart from the engine's: the checkpoint's own tokenizer and grammar."""
    import llguidance.hf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=320, eos_token=tokenizer.eos_token_id)
    if structure.json is not None:
        text = llguidance.LLMatcher.grammar_from_json_schema(structure.json)
    elif structure.regex is not None:
        text = llguidance.LLMatcher.grammar_from_regex(structure.regex)
    elif structure.grammar is not None:
        text = llguidance.grammar_from("grammar", structure.grammar)
    else:
        text = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in structure.choice))
    return llguidance.LLMatcher(ll_tokenizer, text), tokenizer.eos_token_id


def _allowed(matcher, vocab: int) -> torch.Tensor:
    bits = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.uint8)
    return ((bits.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()[:vocab].bool()


def _reference_constrained_greedy(model, path, structure, prompt, max_tokens) -> tuple[list[int], str, list]:
    """transformers' logits at each step (the whole sequence again), the argmax over the allowed tokens; and each
    step's log-probabilities under the mask (vLLM's logprobs under a grammar)."""
    matcher, eos = _reference_grammar(path, structure)
    ids = list(prompt)
    out, logprobs = [], []
    with torch.no_grad():
        while len(out) < max_tokens:
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            masked = logits.masked_fill(~_allowed(matcher, logits.numel()), float("-inf"))
            token = int(masked.argmax())
            logprobs.append(torch.log_softmax(masked, -1))
            assert matcher.consume_token(token)
            out.append(token)
            ids.append(token)
            if token == eos or matcher.is_stopped():
                return out, "stop", logprobs
    return out, "length", logprobs


def _assert_logprobs_under_the_mask(entries: list[dict], reference: list[torch.Tensor], top: int) -> None:
    """Each position's logprobs are the reference's under the mask: its best `top` of the tokens the grammar
    allows, none it refuses."""
    assert len(entries) == len(reference)
    for entry, row in zip(entries, reference):
        finite = {t: lp.logprob for t, lp in entry.items() if lp.logprob > float("-inf")}
        best = row.topk(top)
        expected = {int(t): float(v) for v, t in zip(best.values, best.indices) if v > float("-inf")}
        assert set(expected) <= set(finite) and all(row[t] > float("-inf") for t in finite)
        for t, lp in finite.items():
            assert abs(lp - float(row[t])) < 1e-3, (t, lp, float(row[t]))


@pytest.mark.parametrize("arch", ["qwen3.5", "llama"])
def test_greedy_under_a_grammar_is_the_reference_argmax_over_what_it_allows(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    rng = random.Random()
    llm = LLM(path, device="cpu")
    reference = load_reference(path)
    for _ in range(3):
        structure = _random_structure(rng)
        prompt = [rng.randrange(300) for _ in range(rng.randint(1, 30))]
        out = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0, logprobs=5,
                                                    structured_outputs=structure))[0].outputs[0]
        tokens, reason, logprobs = _reference_constrained_greedy(reference, path, structure, prompt, 24)
        assert (out.token_ids, out.finish_reason) == (tokens, reason), structure
        _assert_logprobs_under_the_mask(out.logprobs, logprobs, 5)


def test_sampled_outputs_match_their_grammar_and_a_request_gives_what_it_gives_alone(checkpoint_factory):
    """Seeded samples (n=3, with top-k and top-p) beside unconstrained requests and other grammars, each replayed
    through a fresh matcher: every token taken, and a finished output complete."""
    path = checkpoint_factory("qwen3.5")
    rng = random.Random()
    llm = LLM(path, device="cpu")
    structures = [_random_structure(rng) for _ in range(3)]
    params = [SamplingParams(n=3, max_tokens=40, temperature=1.5, top_k=rng.choice([-1, 50]), top_p=0.95,
                             seed=rng.randrange(2**31), structured_outputs=s) for s in structures]
    free = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[rng.randrange(300) for _ in range(rng.randint(1, 30))] for _ in range(5)]
    together = llm.generate(prompts, params + [free, free])
    for prompt, p, mixed in zip(prompts, params, together):
        alone = llm.generate([prompt], p)[0]
        assert [o.token_ids for o in alone.outputs] == [o.token_ids for o in mixed.outputs]
        matcher, eos = _reference_grammar(path, p.structured_outputs)
        for o in mixed.outputs:
            m = matcher.deep_copy()
            assert all(m.consume_token(t) for t in o.token_ids), (p.structured_outputs, o.token_ids)
            if o.finish_reason == "stop":
                assert m.is_accepting() or m.is_stopped()
            else:
                assert o.finish_reason == "length" and len(o.token_ids) == 40
    for prompt, mixed in zip(prompts[3:], together[3:]):
        assert llm.generate([prompt], free)[0].outputs[0].token_ids == mixed.outputs[0].token_ids


def test_a_json_output_parses_and_holds_to_its_schema(demo_llm):
    """The demo model, asked for a person: a closed schema's object, every field of its type, no other."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    messages = [{"role": "user", "content": "Describe a person named Ann, aged 31, as JSON."}]
    for structure in [StructuredOutputsParams(json=random.choice([schema, json.dumps(schema)]))]:
        out = demo_llm.chat(messages, SamplingParams(max_tokens=64, temperature=0.8, seed=random.randrange(2**31),
                                                     structured_outputs=structure))[0].outputs[0]
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        assert set(value) == {"name", "age"} and isinstance(value["name"], str) and type(value["age"]) is int
    messages = [{"role": "user", "content": 'Answer with the JSON object {"ok": true} alone.'}]
    out = demo_llm.chat(messages, SamplingParams(max_tokens=32, temperature=0,
                                                 structured_outputs=StructuredOutputsParams(json_object=True)))
    assert out[0].outputs[0].finish_reason == "stop" and isinstance(json.loads(out[0].outputs[0].text), dict)


def test_json_whitespace_follows_the_request(demo_llm):
    """The demo model lays its JSON out over lines; with disable_any_whitespace it writes it compact, and with a
    whitespace pattern of one space it puts one space where whitespace goes and no line break."""
    names = random.sample(["n", "ok", "colour", "size"], 3)
    # every value bounded: unbounded, a compact answer's integer ran on to max_tokens
    types = {"n": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"},
             "colour": {"enum": ["red", "blue"]},
             "size": {"type": "integer", "minimum": 0, "maximum": 9}}
    schema = {"type": "object", "properties": {n: types[n] for n in names}, "required": names}
    messages = [{"role": "user", "content": f"Give a JSON object with {', '.join(names)}."}]

    def answer(**layout):
        structure = StructuredOutputsParams(json=schema, **layout)
        out = demo_llm.chat(messages, SamplingParams(max_tokens=60, temperature=0, structured_outputs=structure))
        text = out[0].outputs[0].text
        assert set(json.loads(text)) == set(names), text
        return text

    assert "\n" in answer()
    compact = answer(disable_any_whitespace=True)
    assert compact == json.dumps(json.loads(compact), separators=(",", ":"))
    spaced = answer(whitespace_pattern="[ ]")
    assert "\n" not in spaced and "  " not in spaced


def _takes(llm, schema: dict, value, **fields) -> bool:
    """Whether a matcher over the schema's compiled grammar takes `value` written as JSON."""
    grammars = llm.engine.grammars
    structure = StructuredOutputsParams(json=schema, **fields)
    grammar = grammars.matcher(structure, grammars.compile(structure))
    tokens = llm.engine.tokenizer.encode(json.dumps(value), add_special_tokens=False)
    return all(grammar.accept(t) for t in tokens) and grammar.matcher.is_accepting()


def test_a_schemas_objects_are_closed(demo_llm):
    """As vLLM's default backend reads a schema (disable_additional_properties, which asks them closed, or not):
    a property the schema does not list is refused, and an object that lists none takes none."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    extra = random.choice(["zz", "b", "other"])
    a = random.randint(0, 99)
    for asked in (False, True):
        assert _takes(demo_llm, schema, {"a": a}, disable_additional_properties=asked)
        assert not _takes(demo_llm, schema, {"a": a, extra: 1}, disable_additional_properties=asked)
    empty = {"type": "object", "properties": {}}
    assert _takes(demo_llm, empty, {}) and not _takes(demo_llm, empty, {extra: a})
    assert _takes(demo_llm, {"type": "object"}, {extra: a})  # lists nothing: any names


def test_an_allofs_branches_describe_one_object(demo_llm):
    """Branches of an allOf, a local $ref among them or beside properties of its own: each branch's properties
    stand beside the others' (closing each branch apart refused every object), and a name none lists is refused."""
    base = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    more = {"properties": {"b": {"type": "string"}}, "required": ["b"]}
    value = {"a": random.randint(0, 99), "b": random.choice(["x", "yz"])}
    schemas = [{"allOf": [base, more]},
               {"$defs": {"Base": base}, "allOf": [{"$ref": "#/$defs/Base"}, more]},
               {"$defs": {"Base": base}, "$ref": "#/$defs/Base", **more}]
    for schema in schemas:
        assert _takes(demo_llm, schema, value), schema
        assert not _takes(demo_llm, schema, {**value, "c": 1}), schema
        assert not _takes(demo_llm, schema, {**value, "b": 3}), schema  # each branch still holds its own


def test_the_grammar_starts_after_its_marker(checkpoint_factory):
    """Free until the output ends with start_after: the marker, pushed to the front by a logit bias, comes
    first; then the grammar alone decides (the bias cannot lift a token it masks)."""
    path = checkpoint_factory("qwen3.5")
    llm = LLM(path, device="cpu")
    marker = llm.engine.tokenizer.encode("<|im_start|>", add_special_tokens=False)
    assert len(marker) == 1
    choices = ["Paris", "Oslo"]
    params = SamplingParams(max_tokens=20, temperature=0, logit_bias={marker[0]: 100.0},
                            structured_outputs=StructuredOutputsParams(choice=choices, start_after="<|im_start|>"))
    out = llm.generate([[random.randrange(300) for _ in range(8)]], params)[0].outputs[0]
    assert out.token_ids[0] == marker[0] and out.finish_reason == "stop"
    assert llm.engine.tokenizer.decode(out.token_ids[1:]) in choices


def test_a_grammar_and_allowed_tokens_that_leave_nothing_end_the_request_there(checkpoint_factory):
    """allowed_token_ids of just "{" under any JSON object: the "{" comes, then nothing the grammar takes is
    allowed. The request ends with an error at output token 1 and keeps the "{"; with no allowed token the
    grammar takes, at output token 0; beside it a request under the same grammar runs to its end."""
    llm = LLM(checkpoint_factory(random.choice(["qwen3.5", "llama"])), device="cpu")
    brace = llm.engine.tokenizer.encode("{", add_special_tokens=False)
    assert len(brace) == 1
    prompt = [random.randrange(300) for _ in range(8)]
    json_object = StructuredOutputsParams(json_object=True)

    def params(**fields):
        return SamplingParams(max_tokens=12, temperature=0, structured_outputs=json_object, **fields)

    engine = llm.engine
    engine.add_request("brace", prompt, params(allowed_token_ids=brace))
    engine.add_request("free", prompt, params())
    finished = {}
    while engine.has_unfinished_requests():
        finished.update((o.request_id, o) for o in engine.step(final_only=True))
    stuck, free = finished["brace"], finished["free"]
    assert isinstance(stuck.error, NoTokenAllowedError) and "output token 1" in str(stuck.error)
    assert stuck.error.fields == ["allowed_token_ids", "structured_outputs"]
    assert (stuck.outputs[0].finish_reason, stuck.outputs[0].token_ids) == ("abort", brace)
    assert free.error is None and free.outputs[0].finish_reason in ("stop", "length")
    assert free.outputs[0].token_ids == llm.generate([prompt], params())[0].outputs[0].token_ids
    letters = llm.engine.tokenizer.encode("abc", add_special_tokens=False)  # no JSON text starts with a letter
    with pytest.raises(NoTokenAllowedError, match="structured output together refuse every token for output token 0"):
        llm.generate([prompt], params(allowed_token_ids=letters))
    # after "a" the regex takes "b" or "c": made stop tokens that min_tokens holds back, they leave nothing there
    regex = StructuredOutputsParams(regex="a[bc]d{1,9}")
    b, c = (llm.engine.tokenizer.encode(x, add_special_tokens=False) for x in "bc")
    held = SamplingParams(max_tokens=12, min_tokens=5, temperature=0, stop_token_ids=b + c, structured_outputs=regex)
    with pytest.raises(NoTokenAllowedError, match="min_tokens and the structured output together refuse") as info:
        llm.generate([prompt], held)
    assert info.value.fields == ["min_tokens", "structured_outputs"]
    one_held = SamplingParams(max_tokens=12, min_tokens=5, temperature=0, stop_token_ids=b, structured_outputs=regex)
    text = llm.engine.tokenizer.decode(llm.generate([prompt], one_held)[0].outputs[0].token_ids)
    assert text.startswith("ac") and set(text[2:]) == {"d"}


def test_a_grammar_finished_short_of_min_tokens_ends_the_request_there(checkpoint_factory):
    """A choice written whole leaves only the end, which min_tokens holds back: the request ends with an error at
    the token after the choice (it once stopped there as if min_tokens were met); at min_tokens the choice's
    length it stops as ever."""
    llm = LLM(checkpoint_factory(random.choice(["qwen3.5", "llama"])), device="cpu")
    word = random.choice(["yes", "no", "maybe", "Paris"])
    length = len(llm.engine.tokenizer.encode(word, add_special_tokens=False))
    prompt = [random.randrange(300) for _ in range(8)]
    choice = StructuredOutputsParams(choice=[word])

    def params(min_tokens):
        return SamplingParams(max_tokens=length + 4, min_tokens=min_tokens, temperature=0, structured_outputs=choice)

    short = random.randint(length + 1, length + 4)
    with pytest.raises(NoTokenAllowedError, match=f"together refuse every token for output token {length},") as info:
        llm.generate([prompt], params(short))
    assert info.value.fields == ["min_tokens", "structured_outputs"]
    out = llm.generate([prompt], params(length))[0].outputs[0]
    assert (llm.engine.tokenizer.decode(out.token_ids), out.finish_reason) == (word, "stop")


def test_an_empty_choice_is_the_empty_answer(demo_llm):
    """As vLLM's, a choice may be "": the answer may then end at once, and where it is the only choice it does."""
    words = ["".join(random.choice("abcxyz") for _ in range(random.randint(1, 6))) for _ in range(2)]
    for choices in ([""], ["", *words], [*words, ""]):
        params = SamplingParams(max_tokens=8, temperature=1.0, n=3, seed=random.randrange(2**31),
                                structured_outputs=StructuredOutputsParams(choice=choices))
        out = demo_llm.generate(["The answer is"], params, use_tqdm=False)[0]
        assert all(o.text in choices and o.finish_reason == "stop" for o in out.outputs), (choices, out)
        if choices == [""]:
            assert all(o.token_ids == [demo_llm.get_tokenizer().eos_token_id] for o in out.outputs), out


def test_a_choice_among_thousands_is_one_of_them(demo_llm):
    """Past CHOICES_IN_A_RULE the choices are one terminal: llguidance's parser holds at most 2000 items a row,
    and a rule of 2001 choices failed at the first token (the request aborted, the grammar logged whole)."""
    from deltaserve.engine.grammar import CHOICES_IN_A_RULE

    count = random.randint(2 * CHOICES_IN_A_RULE + 1, 3 * CHOICES_IN_A_RULE)
    choices = list({"".join(random.choice('abcxyz é"\\') for _ in range(random.randint(1, 8))) for _ in range(count)})
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=random.randrange(2**31),
                            structured_outputs=StructuredOutputsParams(choice=choices))
    outs = demo_llm.generate(["Pick one:", "The answer is"], params, use_tqdm=False)
    assert all(o.outputs[0].text in choices and o.outputs[0].finish_reason == "stop" for o in outs), outs


def test_request_grammar_waits_for_the_whole_marker():
    matcher = _FakeMatcher()
    grammar = RequestGrammar(matcher, start_after=[7, 8])
    for token in (8, 7, 9, 7):
        assert grammar.accept(token) and not grammar.active
    assert grammar.accept(8) and grammar.active and matcher.consumed == []
    assert grammar.accept(5) and matcher.consumed == [5]


class _FakeMatcher:
    def __init__(self):
        self.consumed = []

    def consume_token(self, token):
        self.consumed.append(token)
        return True


def _nested(depth: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("structure", [
    StructuredOutputsParams(regex="a(b"),
    StructuredOutputsParams(json={"type": "objectx"}),
    StructuredOutputsParams(json="{not json"),
    StructuredOutputsParams(json="[1, 2]"),
    StructuredOutputsParams(json=_nested(200)),  # past llguidance's own bound
    StructuredOutputsParams(json=_nested(5000)),  # past Python's stack
    StructuredOutputsParams(grammar='root ::= ("a"'),  # GBNF that does not parse
    StructuredOutputsParams(grammar='start: a b\na: "x"'),  # Lark naming a rule it does not define
    # compiles, but admits nothing: only a reference to itself (a request once ended at once, its output empty)
    StructuredOutputsParams(json={"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
])
def test_a_grammar_that_does_not_compile_is_refused_by_name_and_nothing_is_held(structure, checkpoint_factory):
    llm = LLM(checkpoint_factory("llama"), device="cpu")
    with pytest.raises(InvalidSamplingParamsError, match="structured_outputs"):
        llm.engine.add_request("r", [1, 2, 3], SamplingParams(structured_outputs=structure))
    assert not llm.engine.has_unfinished_requests() and llm.engine.loaded.blocks.num_used == 0
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].finish_reason == "length"


def test_structured_outputs_params_need_exactly_one_kind():
    for fields in ({}, {"regex": "a", "choice": ["a"]}, {"json_object": True, "json": {}}, {"grammar": "start: \"a\"",
                                                                                             "regex": "a"}):
        with pytest.raises(InvalidSamplingParamsError, match="exactly one"):
            StructuredOutputsParams(**fields)
    for fields in ({"choice": []}, {"choice": ["a", 3]}, {"json": 3}, {"regex": 3}, {"json_object": 1},
                   {"choice": ["a"], "start_after": ""}, {"grammar": " "}, {"grammar": 3}):
        with pytest.raises(InvalidSamplingParamsError, match="structured_outputs"):
            StructuredOutputsParams(**fields)
    with pytest.raises(InvalidSamplingParamsError, match="structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})


def test_closed_objects_close_every_object_that_lists_properties_and_nothing_else():
    inner = {"type": "object", "properties": {"x": {"type": "integer"}}}
    schema = {"type": "object",
              "properties": {"properties": inner, "open": {"type": "object"},
                             "kept": {"type": "object", "properties": {"y": {}}, "additionalProperties": True}},
              "$defs": {"d": inner}, "anyOf": [inner], "items": inner}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert "additionalProperties" not in closed["properties"]["open"]
    assert closed["properties"]["kept"]["additionalProperties"] is True
    assert all(s["additionalProperties"] is False for s in (closed["$defs"]["d"], closed["anyOf"][0], closed["items"]))
    assert "additionalProperties" not in inner and "additionalProperties" not in schema  # copies


def test_allowed_tokens_reads_bit_t_mod_32_of_word_t_div_32():
    vocab = random.randint(1, 200)
    bitmask = torch.randint(-2**31, 2**31 - 1, mask_shape(3, vocab), dtype=torch.int32)
    expected = torch.tensor([[(int(bitmask[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(3)])
    assert torch.equal(allowed_tokens(bitmask, vocab), expected.bool())


def test_a_rows_bits_for_some_tokens_and_with_some_cleared_read_as_allowed_tokens():
    vocab = random.randint(33, 300)
    row = torch.randint(-2**31, 2**31 - 1, mask_shape(1, vocab), dtype=torch.int32)[0]
    every = allowed_tokens(row[None], vocab)[0]
    tokens = torch.randint(0, vocab, (random.randint(1, 40),))
    assert torch.equal(token_bits(row, tokens), every[tokens])
    cleared = [int(t) for t in torch.randint(0, vocab, (random.randint(1, 40),))] + [31, 31]  # bit 31, twice
    expected = every.clone()
    expected[cleared] = False
    assert torch.equal(allowed_tokens(without_tokens(row, cleared)[None], vocab)[0], expected)
    assert torch.equal(allowed_tokens(row[None], vocab)[0], every)  # a copy: the row is as it was


class _RowRequest:
    """What the dead-end check reads of a request (the sampler keeps its allowed ids by a weak reference)."""

    def __init__(self, params, refused: list[int]):
        self.params, self._refused = params, refused

    def refused_tokens(self) -> list[int]:
        return self._refused


def test_a_grammar_row_is_a_dead_end_exactly_where_the_reference_leaves_no_token():
    # the sampler reads a few bits of the row; the reference unpacks all of it, and bits past the vocabulary
    # (the last word's, set here at random) are no tokens
    from types import SimpleNamespace

    from deltaserve.runner.sampler import Sampler

    vocab = 32 * random.randint(1, 8) + random.randint(1, 31)
    sampler = Sampler(vocab, torch.device("cpu"), seed=0)
    for _ in range(200):
        row = torch.zeros(mask_shape(1, vocab), dtype=torch.int32)[0]
        tail = vocab % 32  # bits past the vocabulary, and now and then the last word's tokens as well
        past = random.randint(0, 2**32 - 1) & ~((1 << tail) - 1) | random.choice([0, random.randint(0, 2**tail - 1)])
        row[-1] = past - 2**32 if past >= 2**31 else past
        for token in random.sample(range(vocab), random.randint(0, 3)):
            row[token // 32] |= torch.tensor(1 << (token % 32), dtype=torch.int64).to(torch.int32)
        refused = random.sample(range(vocab), random.randint(0, 6))
        allowed = random.choice([None, random.sample(range(vocab), random.randint(1, 8))])
        request = _RowRequest(SimpleNamespace(allowed_token_ids=allowed), refused)
        kept = allowed_tokens(row[None], vocab)[0]
        kept[refused] = False
        if allowed is not None:
            kept &= torch.zeros(vocab, dtype=torch.bool).index_fill_(0, torch.tensor(allowed), True)
        if allowed is None and not refused:
            continue  # the sampler asks nothing of such a row
        assert sampler._grammar_leaves_nothing(row, request) == (not kept.any()), (vocab, allowed, refused)
