"""requested_structure: the request's fields as one StructuredOutputsParams, or a 400 naming the field."""

import random

import pytest

from deltaserve.server.errors import APIError
from deltaserve.server.protocol import ChatCompletionRequest, CompletionRequest
from deltaserve.server.sampling import requested_structure

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def test_each_field_maps_to_its_kind_and_an_open_think_block_delays_it():
    schema = {"type": "object", "properties": {"k": {"type": "integer", "maximum": random.randint(1, 99)}}}
    opens = random.choice([True, False])
    cases = [(_chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}),
              "json", schema),
             (_chat(response_format={"type": "json_object"}), "json_object", True),
             (_chat(structured_outputs={"regex": "[0-9]+"}), "regex", "[0-9]+"),
             (_chat(structured_outputs={"choice": ["a", "b"]}), "choice", ["a", "b"]),
             (_chat(structured_outputs={"json": schema}), "json", schema)]
    for req, kind, value in cases:
        structure = requested_structure(req, opens)
        assert getattr(structure, kind) == value
        assert structure.start_after == ("</think>" if opens else None)
    assert requested_structure(_chat(response_format={"type": "text"}), opens) is None
    assert requested_structure(_chat(), opens) is None
    completion = CompletionRequest.model_validate({"prompt": "a", "response_format": {"type": "json_object"}})
    assert requested_structure(completion).json_object and requested_structure(completion).start_after is None


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(fields, param):
    with pytest.raises(APIError) as caught:
        requested_structure(_chat(**fields))
    assert caught.value.status == 400 and caught.value.param == param


def test_structured_outputs_options_alone_stand_beside_a_response_format():
    # as vLLM's: the response_format says what the output is, the structured_outputs options how it is written
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}}
    options = {"disable_any_whitespace": random.choice([True, False]),
               "disable_additional_properties": random.choice([True, False])}
    for response_format, kind, value in (({"type": "json_object"}, "json_object", True),
                                         ({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
                                          "json", schema)):
        structure = requested_structure(_chat(response_format=response_format, structured_outputs=options))
        assert getattr(structure, kind) == value
        assert {name: getattr(structure, name) for name in options} == options


def test_a_structural_tag_is_refused_by_name():
    with pytest.raises(APIError) as caught:
        requested_structure(_chat(structured_outputs={"structural_tag": {"type": "structural_tag"}}))
    assert caught.value.status == 400 and caught.value.param == "structured_outputs.structural_tag"
    assert "structural_tag is not supported" in caught.value.message
