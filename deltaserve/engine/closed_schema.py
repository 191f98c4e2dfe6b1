"""A JSON schema with its objects closed, as vLLM's default grammar backend (xgrammar, strict) reads a schema and
as a client that lists an object's fields means it: an object that lists its properties (none, or patterns of
names) takes no others where it does not say (`additionalProperties: false`). llguidance reads a schema as it is
written, so the closing is written into a copy.

An allOf's branches describe one object together: closing each branch apart would refuse every object (each
branch's names would be extra to the others), so the object that holds them is closed to the names that any of
them lists and the branches are left open at their own level. A local `$ref` among the branches is read in place
(a copy of its target, unless the target holds the reference again), and a `$ref` beside properties of its own
is read as one more branch."""

from __future__ import annotations

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas (JSON Schema 2020-12 and
# draft 7's): where the closing looks for objects.
SCHEMA_KEYS = ("items", "additionalItems", "contains", "not", "if", "then", "else", "additionalProperties",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LIST_KEYS = ("anyOf", "allOf", "oneOf", "prefixItems", "items")
SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
OPENING_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")  # say what else is taken
UNREAD_BRANCH_KEYS = ("$ref", "anyOf", "oneOf", "allOf", "if", "then", "else", "dependentSchemas", "not")


def closed_objects(schema):
    """A copy of `schema` with its objects closed."""
    return _Closer(schema).close(schema)


class _Closer:
    def __init__(self, root):
        self.root = root

    def close(self, node, open_here: bool = False, expanding: tuple[str, ...] = ()):
        """`node` closed, its subschemas too; `open_here`: not at its own level (an allOf's branch)."""
        if not isinstance(node, dict):
            return node
        node = self._ref_beside_properties(node)
        closed = dict(node)
        for key in SCHEMA_KEYS:
            if isinstance(closed.get(key), dict):
                closed[key] = self.close(closed[key], expanding=expanding)
        for key in SCHEMA_LIST_KEYS:
            if isinstance(closed.get(key), list) and key != "allOf":
                closed[key] = [self.close(s, expanding=expanding) for s in closed[key]]
        for key in SCHEMA_MAP_KEYS:
            if isinstance(closed.get(key), dict):
                closed[key] = {name: self.close(s, expanding=expanding) for name, s in closed[key].items()}
        branches = None
        if isinstance(closed.get("allOf"), list):
            branches = [self._in_place(b, expanding) for b in closed["allOf"]]
            closed["allOf"] = [self.close(b, open_here=True, expanding=expanding + self._refs(b0))
                               for b, b0 in zip(branches, closed["allOf"])]
        if not open_here:
            self._close_level(closed, branches or [])
        return closed

    def _close_level(self, closed: dict, branches: list) -> None:
        """The object `closed` describes, with its allOf's `branches`, takes no names past those they list."""
        levels = [closed] + [b for b in branches if isinstance(b, dict)]
        if "additionalProperties" in closed or any(k in b for b in levels[1:] for k in OPENING_KEYS):
            return  # the schema says what else it takes
        if any(k in b for b in levels[1:] for k in UNREAD_BRANCH_KEYS):
            return  # a branch whose names are not read here (a reference kept, alternatives): left open
        if not any("properties" in b or "patternProperties" in b for b in levels):
            return  # lists nothing: an object of any names
        if branches:  # every branch's names stand at this level too, as anything (the branches say what), in the
            # order the branches list them and then this level's own (llguidance writes properties in order)
            own = closed.get("properties") if isinstance(closed.get("properties"), dict) else {}
            names = [name for b in levels[1:] + [closed] if isinstance(b.get("properties"), dict)
                     for name in b["properties"]]
            closed["properties"] = {name: own.get(name, {}) for name in dict.fromkeys(names)}
        closed["additionalProperties"] = False

    def _ref_beside_properties(self, node: dict) -> dict:
        """A `$ref` beside properties (or an allOf) of the node's own: one more branch of an allOf."""
        if "$ref" not in node or not any(k in node for k in ("properties", "allOf", "patternProperties")):
            return node
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**rest, "allOf": [{"$ref": node["$ref"]}, *(node.get("allOf") or [])]}

    def _in_place(self, branch, expanding: tuple[str, ...]):
        """A branch that is a local `$ref` alone: a copy of its target, where the target is not being read
        already (a schema that holds itself stays a reference)."""
        if not isinstance(branch, dict) or set(branch) != {"$ref"}:
            return branch
        ref = branch["$ref"]
        target = self._target(ref)
        return branch if target is None or ref in expanding else target

    def _refs(self, branch) -> tuple[str, ...]:
        return (branch["$ref"],) if isinstance(branch, dict) and "$ref" in branch else ()

    def _target(self, ref):
        """The schema a local reference ("#/$defs/Name", "#/definitions/Name", any JSON pointer) names."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, dict) else None
