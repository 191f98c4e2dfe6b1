"""Tool-call parsing: the `<tool_call>` tags of Qwen and Hermes models with their two body formats (parser.py), and
the bare JSON calls of Llama 3.x and 4 (llama3_json.py)."""

from deltaserve.server.tool_parsers.llama3_json import Llama3JsonToolParser
from deltaserve.server.tool_parsers.parser import ParsedDelta, ToolCallParser, parse_tool_call_body
from deltaserve.server.tool_parsers.tool_call import ToolCall, new_tool_call_id, written_json_value

TAGS, LLAMA_JSON = "tags", "llama_json"  # the tool-call formats


def tool_format_of(parser_name: str | None, chat_template: str | None) -> str:
    """The format a served model's tool calls come in: the one --tool-call-parser names, else the one its chat
    template asks for (a Llama 3.x template speaks of <|python_tag|>, a Qwen or Hermes one of <tool_call>)."""
    if parser_name is not None:
        return LLAMA_JSON if parser_name in ("llama3_json", "llama4_json") else TAGS
    template = chat_template or ""
    return LLAMA_JSON if "<|python_tag|>" in template and "<tool_call>" not in template else TAGS


def tool_call_parser(tool_format: str, schemas: dict[str, dict] | None):
    return Llama3JsonToolParser(schemas) if tool_format == LLAMA_JSON else ToolCallParser(schemas)


__all__ = ["LLAMA_JSON", "Llama3JsonToolParser", "ParsedDelta", "TAGS", "ToolCall", "ToolCallParser",
           "new_tool_call_id", "parse_tool_call_body", "tool_call_parser", "tool_format_of", "written_json_value"]
