"""A JSON schema whose every value nests without end is refused when it is compiled, naming why; one that is
recursive but admits a finite value compiles, takes that value, and a model held to it finishes one."""

import json
import random

import pytest

from deltaserve import LLM, SamplingParams, StructuredOutputsParams
from deltaserve.engine.finite_json_schema import admits_a_finite_value
from deltaserve.errors import InvalidSamplingParamsError

llguidance = pytest.importorskip("llguidance")

NO_FINITE_VALUE = "structured_outputs: the schema admits no finite value"

SELF_PROPERTY = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"],
                 "additionalProperties": False}
FOREVER = [
    SELF_PROPERTY,
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
               "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
     "$ref": "#/$defs/a"},
    {"anyOf": [SELF_PROPERTY, {"type": "array", "items": {"$ref": "#"}, "minItems": 2}]},  # every branch
    {"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1},
    {"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#"}], "minItems": 2},
    {"type": "object", "properties": {"self": {"type": "object", "properties": {"again": {
        "$ref": "#/properties/self"}}, "required": ["again"]}}, "required": ["self"]},  # a pointer below the root
    {"$defs": {"pair": {"type": "array", "items": [{"type": "string"}, {"$ref": "#/$defs/pair"}], "minItems": 2}},
     "type": "object", "properties": {"p": {"$ref": "#/$defs/pair"}}, "required": ["p"]},  # draft 7's tuple
]

TREE = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                         "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["name", "children"]}
LINKED_LIST = {"type": "object", "properties": {"value": {"type": "integer", "minimum": 0, "maximum": 99},
                                                "next": {"$ref": "#"}}, "required": ["value"]}
EXPRESSION = {"$defs": {"expr": {"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": 9},
    {"type": "object", "properties": {"add": {"type": "array", "items": {"$ref": "#/$defs/expr"}, "minItems": 2,
                                              "maxItems": 2}}, "required": ["add"]}]}},
    "$ref": "#/$defs/expr"}
MUTUAL_WITH_AN_EXIT = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                                 "b": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}},
                       "$ref": "#/$defs/a"}
# (schema, a finite value it admits)
FINITE = [
    (TREE, {"name": "a", "children": [{"name": "b", "children": []}]}),
    (LINKED_LIST, {"value": 1, "next": {"value": 2}}),
    (EXPRESSION, {"add": [1, {"add": [2, 3]}]}),
    (MUTUAL_WITH_AN_EXIT, {"b": {"b": None}}),
    ({"type": "array", "items": {"$ref": "#"}}, [[], [[]]]),
    ({"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, {"a": {"a": None}}),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#"}], "minItems": 1}, [1, [2]]),
]


def _random_chain(rng: random.Random, broken: bool) -> tuple[dict, object]:
    """$defs d0 -> d1 -> ... -> d0, each link a required property, required items, every branch of an anyOf or a
    member of allOf; `broken`: one link may be left out (and the finite value that leaves it out), else None."""
    size = rng.randint(1, 4)
    kinds = [rng.choice(["property", "items", "any_of", "all_of"]) for _ in range(size)]
    exit_at = rng.randrange(size) if broken else None
    defs = {f"d{i}": _link(kind, {"$ref": f"#/$defs/d{(i + 1) % size}"}, rng, i == exit_at)
            for i, kind in enumerate(kinds)}
    value = _chain_value(kinds, exit_at) if broken else None
    return {"$defs": defs, "$ref": "#/$defs/d0"}, value


def _link(kind: str, target: dict, rng: random.Random, optional: bool) -> dict:
    member = {"type": "object", "properties": {"k": target, "x": {"type": "integer"}}, "required": [] if optional
              else ["k"]}
    if kind == "property":
        return member
    if kind == "items":
        return {"type": "array", "items": target, "minItems": 0 if optional else 1}
    if kind == "any_of":
        array = {"type": "array", "items": target, "minItems": rng.randint(1, 2)}
        return {"anyOf": [member | {"required": ["k"]}, array] + ([{"type": "integer"}] if optional else [])}
    return {"allOf": [{"type": "object"}, member]}


def _chain_value(kinds: list[str], exit_at: int):
    """d0's value that follows the chain to its optional link and leaves it out there."""
    value = {"items": [], "any_of": 0}.get(kinds[exit_at], {})
    for kind in reversed(kinds[:exit_at]):
        value = [value] if kind == "items" else {"k": value}
    return value


@pytest.fixture(scope="module")
def tiny_llm(checkpoint_factory):
    return LLM(checkpoint_factory("llama"), device="cpu")


def test_a_schema_whose_every_value_nests_without_end_is_refused_and_nothing_is_held(tiny_llm):
    rng = random.Random()
    schemas = FOREVER + [_random_chain(rng, broken=False)[0] for _ in range(4)]
    for schema in schemas:
        structure = StructuredOutputsParams(json=rng.choice([schema, json.dumps(schema)]))
        with pytest.raises(InvalidSamplingParamsError, match=NO_FINITE_VALUE):
            tiny_llm.engine.add_request("r", [1, 2, 3], SamplingParams(structured_outputs=structure))
        assert not tiny_llm.engine.has_unfinished_requests() and tiny_llm.engine.loaded.blocks.num_used == 0
    assert tiny_llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].outputs[0].finish_reason == "length"


def test_a_recursive_schema_with_a_finite_value_compiles_and_takes_that_value(tiny_llm):
    rng = random.Random()
    cases = FINITE + [_random_chain(rng, broken=True) for _ in range(6)]
    grammars = tiny_llm.engine.grammars
    for schema, value in cases:
        structure = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        grammar = grammars.matcher(structure, grammars.compile(structure))
        text = json.dumps(value, separators=(",", ":"))
        tokens = tiny_llm.engine.tokenizer.encode(text, add_special_tokens=False)
        assert all(grammar.accept(t) for t in tokens) and grammar.matcher.is_accepting(), (schema, text)


def test_what_is_not_read_counts_as_admitting_a_value():
    """Each of these nests without end if the part it leaves unread is read as it looks, and none is refused."""
    unsure = [
        {"type": "object", "patternProperties": {"^a": {"$ref": "#"}}, "required": ["ab"]},
        {"$defs": {"s": {"$id": "http://x/s", "type": "object", "properties": {"a": {"$ref": "#"}},
                         "required": ["a"]}}, "$ref": "#/$defs/s"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]},
        {"$defs": {"x": {"$anchor": "x", "type": "object", "properties": {"a": {"$ref": "#x"}}, "required": ["a"]}},
         "$ref": "#/$defs/x/properties/a"},
        {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # without a type it may be a number
        {"allOf": [{"type": "object"}, {"properties": {"a": {"$ref": "#"}}, "required": ["a"]}]},
    ]
    assert all(admits_a_finite_value(schema) for schema in unsure)
    assert not any(admits_a_finite_value(schema) for schema in FOREVER)


def _holds(value, schema: dict, root: dict) -> bool:
    """Whether `value` meets `schema` (the keywords FINITE's schemas use)."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]] if schema["$ref"] != "#" else root
    if "anyOf" in schema:
        return any(_holds(value, branch, root) for branch in schema["anyOf"])
    kinds = {"object": dict, "array": list, "integer": int, "string": str, "null": type(None)}
    if not isinstance(value, kinds[schema["type"]]) or isinstance(value, bool):
        return False
    if isinstance(value, dict):
        return (set(schema.get("required", [])) <= set(value) <= set(schema["properties"])
                and all(_holds(v, schema["properties"][k], root) for k, v in value.items()))
    if isinstance(value, list):
        return (schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value))
                and all(_holds(item, schema["items"], root) for item in value))
    if isinstance(value, int):
        return schema.get("minimum", value) <= value <= schema.get("maximum", value)
    return value is None or len(value) <= schema.get("maxLength", len(value))


def test_the_demo_model_finishes_a_value_of_a_recursive_schema(demo_llm):
    """Greedy, asked to copy a small value: each answer stops, parses and holds to its schema."""
    cases = [(LINKED_LIST, {"value": 7}), (EXPRESSION, {"add": [1, 2]}), (MUTUAL_WITH_AN_EXIT, {"b": None})]
    messages = [[{"role": "user", "content": f"Answer with the JSON {json.dumps(value)} alone."}] for _, value in cases]
    params = [SamplingParams(max_tokens=32, temperature=0, structured_outputs=StructuredOutputsParams(
        json=schema, disable_any_whitespace=True)) for schema, _ in cases]
    for (schema, _), out in zip(cases, demo_llm.chat(messages, params, use_tqdm=False)):
        answer = out.outputs[0]
        assert answer.finish_reason == "stop" and _holds(json.loads(answer.text), schema, schema), answer.text
