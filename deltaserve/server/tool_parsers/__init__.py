"""Tool-call parsing for the two formats Qwen models emit (see parser.py)."""

from deltaserve.server.tool_parsers.parser import ParsedDelta, ToolCallParser, parse_tool_call_body
from deltaserve.server.tool_parsers.tool_call import ToolCall, new_tool_call_id, written_json_value

__all__ = ["ParsedDelta", "ToolCall", "ToolCallParser", "new_tool_call_id", "parse_tool_call_body",
           "written_json_value"]
