"""Tool-call parsing: the `<tool_call>` tags of Qwen and Hermes models with their two body formats (parser.py), the
bare JSON calls of Llama 3.x and 4 (llama3_json.py), and the Python list of calls of Llama 3.2's and 4's pythonic
templates (pythonic.py)."""

from deltaserve.server.tool_parsers.llama3_json import Llama3JsonToolParser
from deltaserve.server.tool_parsers.parser import ParsedDelta, ToolCallParser, parse_tool_call_body
from deltaserve.server.tool_parsers.pythonic import PythonicToolParser
from deltaserve.server.tool_parsers.tool_call import ToolCall, new_tool_call_id, written_json_value

TAGS, LLAMA_JSON, PYTHONIC = "tags", "llama_json", "pythonic"  # the tool-call formats
_FORMAT_OF_PARSER = {"llama3_json": LLAMA_JSON, "llama4_json": LLAMA_JSON, "pythonic": PYTHONIC,
                     "llama4_pythonic": PYTHONIC}  # vLLM's parser names; the others name the tags


def tool_format_of(parser_name: str | None, chat_template: str | None) -> str:
    """The format a served model's tool calls come in: the one --tool-call-parser names, else the one its chat
    template asks for (a Llama 3.x template speaks of <|python_tag|>, a Qwen or Hermes one of <tool_call>)."""
    if parser_name is not None:
        return _FORMAT_OF_PARSER.get(parser_name, TAGS)
    template = chat_template or ""
    return LLAMA_JSON if "<|python_tag|>" in template and "<tool_call>" not in template else TAGS


def tool_call_parser(tool_format: str, schemas: dict[str, dict] | None):
    parser = {LLAMA_JSON: Llama3JsonToolParser, PYTHONIC: PythonicToolParser}.get(tool_format, ToolCallParser)
    return parser(schemas)


__all__ = ["LLAMA_JSON", "Llama3JsonToolParser", "PYTHONIC", "ParsedDelta", "PythonicToolParser", "TAGS", "ToolCall",
           "ToolCallParser", "new_tool_call_id", "parse_tool_call_body", "tool_call_parser", "tool_format_of",
           "written_json_value"]
