"""A JSON schema moved into another document, its local references rewritten to reach the same nodes there.

A "#..." reference is a JSON pointer (RFC 6901) in a URI fragment, resolved against the root of the document
that holds it: a schema nested in another (a tool's parameters in the schema of a demanded call) would resolve
its `#/$defs/Item`, or `#` itself, against the outer root instead of its own. The copy's pointers get the
schema's new place in front. The rest of each is kept as written, its escapes (~0, ~1, percent-encoding)
included: putting whole reference tokens in front leaves the escaping of the others as it was.

Left as written: references to other documents; anchors (`#name`), which name a node wherever it sits; and
any under a subschema with an `$id` of its own, which resolve against that subschema wherever it sits. Values
that are data rather than schemas (const, enum, default, examples) are kept whole, whatever they hold."""

from __future__ import annotations

from urllib.parse import quote, unquote

# Keywords whose value is an instance, never read as a schema.
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names (any string, "$ref" and "default" among them) to schemas.
_NAME_MAP_KEYS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                            "dependencies"})


def pointer_token(name: str) -> str:
    """A name as one reference token of a JSON pointer."""
    return name.replace("~", "~0").replace("/", "~1")


def local_ref(pointer: str) -> str:
    """The "#..." reference to a node at `pointer` (its tokens escaped) in the same document."""
    return "#" + quote(pointer, safe="/$~")


def relocated(schema, pointer: str):
    """A copy of `schema` for the place `pointer` (a JSON pointer, its tokens escaped) in another document, its
    local references rewritten to reach there what they reached in `schema`. Walked with a worklist, not by
    recursion: a schema's depth is the client's."""
    prefix = local_ref(pointer)
    top = [schema]
    pending = [(top, 0, False)]  # (container, key, whether the value there is a map of names to schemas)
    while pending:
        container, key, is_name_map = pending.pop()
        node = container[key]
        if isinstance(node, list):
            node = container[key] = list(node)
            pending.extend((node, i, False) for i in range(len(node)))
        elif isinstance(node, dict) and (is_name_map or not _is_own_resource(node)):
            node = container[key] = dict(node)
            pending.extend(_schema_slots(node, is_name_map, prefix))
    return top[0]


def _schema_slots(node: dict, is_name_map: bool, prefix: str) -> list[tuple]:
    """The places in a copied node where a schema may sit, for the walk to copy; the node's own reference is
    rewritten here."""
    if is_name_map:
        return [(node, name, False) for name, value in node.items() if isinstance(value, (dict, list))]
    slots = []
    for key, value in node.items():
        if key == "$ref":
            node[key] = _moved_ref(value, prefix)
        elif key not in _DATA_KEYS and isinstance(value, (dict, list)):
            slots.append((node, key, key in _NAME_MAP_KEYS and isinstance(value, dict)))
    return slots


def _moved_ref(ref, prefix: str):
    """A local pointer with the new place in front; anything else as it was. Whether a fragment is a pointer
    is read after percent-decoding, as RFC 6901 has it ("#%2Fa" is the pointer /a)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return ref
    fragment = ref[1:]
    decoded = unquote(fragment)
    if decoded and not decoded.startswith("/"):  # an anchor
        return ref
    return prefix + fragment


def _is_own_resource(node: dict) -> bool:
    """Whether the node's `$id` makes it a document of its own (an `$id` that is only a fragment, draft 7's
    way of naming an anchor, does not)."""
    identifier = node.get("$id")
    return isinstance(identifier, str) and not identifier.startswith("#")
