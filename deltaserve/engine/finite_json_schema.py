"""Whether a JSON schema admits a finite value.

A schema may compile and still admit none: where every value it allows must hold another that the same
schema governs (an object whose required property is the schema itself, an array of itself with minItems 1,
definitions that each require the other), a model held to it writes `{"a":{"a":{"a":...` until max_tokens.
llguidance expands a schema's references itself and does not look for this, so it is looked for here, over
the schema's nodes: a node admits a finite value where every part that a value of it must have does (a
required property's schema, each item that minItems asks for, one branch of anyOf / oneOf, each member of
allOf, the target of $ref): the least fixed point, computed in linear time as a circuit of and/or gates.

Each part is a condition a value must meet, so a schema found to admit nothing admits nothing; what is not
read (a keyword, a reference it does not resolve, which patternProperties a name matches) counts as admitting
a value, so a schema that admits a finite value is never refused."""

from __future__ import annotations

from urllib.parse import unquote

_LEAF_TYPES = {"null", "boolean", "integer", "number", "string"}


def admits_a_finite_value(schema) -> bool:
    """False only where no finite JSON value meets `schema` (a parsed JSON schema)."""
    if _has_inner_id(schema):  # a "#/..." reference under a nested $id is relative to that resource: unsure
        return True
    circuit = _SchemaCircuit(schema)
    return circuit.root in circuit.fired()


class _Circuit:
    """And/or gates: a gate fires once all its inputs have fired, or any one of them (a gate of either kind
    without inputs: an "all" fires at once, an "any" never)."""

    def __init__(self):
        self._needed: list[int] = []  # per gate, how many of its inputs must fire
        self._takers: list[list[int]] = []  # per gate, the gates that take it as an input

    def gate(self) -> int:
        self._needed.append(0)
        self._takers.append([])
        return len(self._needed) - 1

    def wire(self, gate: int, inputs: list[int], any_one: bool = False) -> None:
        self._needed[gate] = 1 if any_one else len(inputs)
        for source in inputs:
            self._takers[source].append(gate)

    def all_of(self, inputs: list[int]) -> int:
        gate = self.gate()
        self.wire(gate, inputs)
        return gate

    def any_of(self, inputs: list[int]) -> int:
        gate = self.gate()
        self.wire(gate, inputs, any_one=True)
        return gate

    def fired(self) -> set[int]:
        needed = list(self._needed)
        ready = [gate for gate, count in enumerate(needed) if count == 0]
        fired = set(ready)
        while ready:
            for taker in self._takers[ready.pop()]:
                needed[taker] -= 1
                if needed[taker] == 0 and taker not in fired:
                    fired.add(taker)
                    ready.append(taker)
        return fired


class _SchemaCircuit(_Circuit):
    """One gate per schema node, which fires where the node admits a finite value. Nodes are built from a
    worklist, not by recursion: a schema's depth is the client's."""

    def __init__(self, schema):
        super().__init__()
        self._document = schema
        self.always = self.all_of([])
        self.never = self.any_of([])
        self._node_gates: dict[int, int] = {}  # id(node) -> its gate (the document holds every node alive)
        self._unbuilt: list[tuple[int, dict]] = []
        self.root = self.of(schema)
        while self._unbuilt:
            self._build(*self._unbuilt.pop())

    def of(self, schema) -> int:
        """The gate of a schema node (`true`, and what is not a schema, admit anything)."""
        if schema is False:
            return self.never
        if not isinstance(schema, dict):
            return self.always
        gate = self._node_gates.get(id(schema))
        if gate is None:
            gate = self._node_gates[id(schema)] = self.gate()
            self._unbuilt.append((gate, schema))
        return gate

    def _build(self, gate: int, schema: dict) -> None:
        parts = [self._reference(schema), self._own(schema)]
        if isinstance(schema.get("allOf"), list):
            parts += [self.of(member) for member in schema["allOf"]]
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                parts.append(self.any_of([self.of(branch) for branch in schema[key]]))
        self.wire(gate, parts)

    def _reference(self, schema: dict) -> int:
        """llguidance takes $ref beside the node's other keywords as both holding (as JSON Schema 2019 does)."""
        if "$ref" not in schema:
            return self.always
        target = _resolve(self._document, schema["$ref"])
        return self.always if target is _UNRESOLVED else self.of(target)

    def _own(self, schema: dict) -> int:
        """The node's own type: one of its types must admit a finite value."""
        if "const" in schema or "enum" in schema:  # a listed value is finite
            return self.always
        types = schema.get("type")
        if isinstance(types, str):
            types = [types]
        if (not isinstance(types, list) or not types or not all(isinstance(kind, str) for kind in types)
                or _LEAF_TYPES.intersection(types)):
            return self.always  # any type (llguidance reads `properties` without a type as allowing them all)
        return self.any_of([self._object(schema) if kind == "object" else
                            self._array(schema) if kind == "array" else self.always for kind in types])

    def _object(self, schema: dict) -> int:
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        required = list(dict.fromkeys(name for name in required if isinstance(name, str)))
        parts = [self.of(properties[name]) if name in properties else self._unlisted(schema) for name in required]
        if _count(schema, "minProperties") > len(required):  # one more property, of any name but these
            optional = [self.of(s) for name, s in properties.items() if name not in required]
            parts.append(self.any_of(optional + [self._unlisted(schema)]))
        return self.all_of(parts)

    def _unlisted(self, schema: dict) -> int:
        """A property that `properties` does not list."""
        if schema.get("patternProperties"):  # which pattern a name matches is llguidance's regex: unsure
            return self.always
        return self.of(schema.get("additionalProperties", True))

    def _array(self, schema: dict) -> int:
        least = _count(schema, "minItems")
        items = schema.get("items", True)
        if "prefixItems" in schema:
            prefix, rest = schema["prefixItems"], items
            if not isinstance(prefix, list) or isinstance(items, list):
                return self.always
        elif isinstance(items, list):  # draft 7's tuple
            prefix, rest = items, schema.get("additionalItems", True)
        else:
            prefix, rest = [], items
        parts = [self.of(item) for item in prefix[:least]]
        if least > len(prefix):
            parts.append(self.of(rest))
        return self.all_of(parts)


def _count(schema: dict, key: str) -> int:
    """A minItems-like count (llguidance refuses one that is not an integer)."""
    value = schema.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_UNRESOLVED = object()


def _resolve(document, ref):
    """The node a local reference ("#", "#/$defs/a", JSON pointer escapes) names in the document, or
    _UNRESOLVED (an anchor, another document, a pointer to nothing)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return _UNRESOLVED
    pointer = unquote(ref[1:])
    if not pointer:
        return document
    if not pointer.startswith("/"):
        return _UNRESOLVED
    node = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _UNRESOLVED
    return node


def _has_inner_id(document) -> bool:
    """Whether a node under the root sets $id (or anything under it holds that key: then unsure all the same)."""
    pending = [document]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node is not document and "$id" in node:
                return True
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return False
