"""relocated_schema: a schema moved into another document reaches through each local reference the node it
reached where it was; every other reference, and every value that is data, stays as written."""

import copy
import random
from urllib.parse import quote, unquote

import pytest

from deltaserve.server.relocated_schema import local_ref, pointer_token, relocated

# Names that need JSON pointer escapes (~, /), percent-encoding (%, space, é, #) or look like keywords.
NAMES = ["a", "b~c", "d/e", "f%g", "h i", "é", "$ref", "default", "const", "#", "~1", "x"]
DATA = [{"$ref": "#/properties"}, [{"$ref": "#"}], "#/a"]  # instances that only look like references
OTHER_DOCUMENTS = ["other.json#/$defs/a", "https://example.com/s.json", "urn:x#/a", "#anchor-name"]


def resolve_ref(document, ref: str):
    """The node a local JSON-pointer reference names in `document` (RFC 6901: percent-decoded, then ~1, ~0)."""
    pointer = unquote(ref[1:])
    node = document
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


class _RandomSchema:
    """A random nested schema with references to its own nodes (written every way a pointer may be),
    references to other documents and anchors, data that looks like references, and a subschema with an
    $id of its own, whose local references are its own."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nodes: list[tuple[list, bool]] = []  # (path, whether under an $id of its own) per schema node
        self.data: list[tuple[list, str]] = []  # (path of the node, data keyword) per value that is data
        self.root = self._schema([], depth=rng.randint(1, 4), in_resource=False)
        self.refs = [self._add_ref(path, in_resource) for path, in_resource in self.nodes
                     if rng.random() < 0.5]

    def _schema(self, path: list, depth: int, in_resource: bool) -> dict:
        rng, node = self.rng, {}
        if path and rng.random() < 0.1:
            node["$id"] = rng.choice(["https://example.com/inner.json", "inner.json"])
            in_resource = True
        elif rng.random() < 0.1:
            node["$id"] = "#draft-7-anchor"  # only a name: the node stays in its document
        self.nodes.append((path, in_resource))
        node["type"] = rng.choice(["object", "array", "string", "integer"])
        if rng.random() < 0.3:
            keyword = rng.choice(["const", "enum", "default", "examples"])
            node[keyword] = copy.deepcopy(rng.choice(DATA))
            self.data.append((path, keyword))
        for keyword in rng.sample(["properties", "$defs", "definitions", "items", "prefixItems", "anyOf",
                                   "allOf", "additionalProperties", "x-extension"], rng.randint(0, 3) * (depth > 0)):
            node[keyword] = self._children(keyword, path + [keyword], depth - 1, in_resource)
        return node

    def _children(self, keyword: str, path: list, depth: int, in_resource: bool):
        if keyword in ("properties", "$defs", "definitions"):
            names = self.rng.sample(NAMES, self.rng.randint(1, 3))
            return {name: self._schema(path + [name], depth, in_resource) for name in names}
        if keyword in ("prefixItems", "anyOf", "allOf"):
            return [self._schema(path + [i], depth, in_resource) for i in range(self.rng.randint(1, 3))]
        if keyword == "x-extension":  # a keyword no validator reads; a reference may still name a node in it
            return {"held": self._schema(path + ["held"], depth, in_resource)}
        return self._schema(path, depth, in_resource)

    def _add_ref(self, path: list, in_resource: bool) -> tuple[list, str, bool]:
        """(the referring node's path, its reference, whether it is local to the schema's root)."""
        rng = self.rng
        if rng.random() < 0.2:
            ref = rng.choice(OTHER_DOCUMENTS)
        else:
            target, _ = rng.choice(self.nodes)
            pointer = "".join("/" + pointer_token(str(token)) for token in target)
            ref = "#" + rng.choice([quote(pointer, safe="/$~"), quote(pointer, safe=""), quote(pointer)])
        _node_at(self.root, path)["$ref"] = ref
        local = ref.startswith("#") and (unquote(ref) == "#" or unquote(ref).startswith("#/"))
        return path, ref, local and not in_resource


def _node_at(document, path: list):
    for token in path:
        document = document[token]
    return document


def _refs_blanked(node):
    """The schema with every reference's text left out: what relocating must keep as it was."""
    if isinstance(node, list):
        return [_refs_blanked(item) for item in node]
    if isinstance(node, dict):
        return {key: None if key == "$ref" and isinstance(value, str) else _refs_blanked(value)
                for key, value in node.items()}
    return node


def _document_holding(schema, place_tokens: list[str]) -> dict:
    document = node = {}
    for token in place_tokens[:-1]:
        node = node.setdefault(token, {})
    node[place_tokens[-1]] = schema
    return document


@pytest.mark.parametrize("seed", range(200))
def test_each_reference_reaches_where_it_reached_and_the_rest_is_kept(seed):
    rng = random.Random(seed)
    schema = _RandomSchema(rng)
    original = copy.deepcopy(schema.root)
    place_tokens = ["$defs", rng.choice(NAMES + ["tool"])] + rng.sample(NAMES, rng.randint(0, 2))
    place = "".join("/" + pointer_token(token) for token in place_tokens)
    moved = relocated(schema.root, place)
    document = _document_holding(moved, place_tokens)
    assert schema.root == original  # the client's schema is not changed
    assert resolve_ref(document, local_ref(place)) is moved
    assert _refs_blanked(moved) == _refs_blanked(original)
    for path, keyword in schema.data:
        assert _node_at(moved, path)[keyword] == _node_at(original, path)[keyword]
    for path, ref, local in schema.refs:
        rewritten = _node_at(moved, path)["$ref"]
        if local:  # the same node: the copy's, at the place the original's reached in the original
            assert resolve_ref(document, rewritten) is resolve_ref(moved, ref)
        else:
            assert rewritten == ref


def test_a_pointer_percent_encoded_whole_is_a_pointer_and_an_anchor_is_not():
    schema = {"$defs": {"A": {"type": "integer"}},
              "properties": {"p": {"$ref": "#%2F$defs%2FA"}, "q": {"$ref": "#A"}, "r": {"$ref": "#/"}}}
    moved = relocated(schema, "/$defs/t")
    assert [moved["properties"][k]["$ref"] for k in "pqr"] == ["#/$defs/t%2F$defs%2FA", "#A", "#/$defs/t/"]


def test_a_schema_nested_deeper_than_the_stack_is_relocated():
    depth = 5000  # the JSON parser takes bodies as deep as Python's recursion limit; the walk takes any
    schema = node = {}
    for _ in range(depth):
        node["items"] = {}
        node = node["items"]
    node["$ref"] = "#"
    moved = relocated(schema, "/$defs/deep")
    for _ in range(depth):
        moved = moved["items"]
    assert moved == {"$ref": "#/$defs/deep"}
