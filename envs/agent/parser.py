"""Tool calls in model output, in the Qwen / Hermes format the chat templates of those models imply:

    <tool_call>
    {"name": "shell", "arguments": {"command": "ls"}}
    </tool_call>

Several calls may follow each other in one turn. Text around them is the model's own (reasoning) and is ignored.
Anything that looks like a call but is not one (an unclosed tag, JSON that does not parse, no `name`, arguments
that are not an object) is a `ToolCallError`: the loop answers it with an error observation, it never crashes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


class ToolCallError(ValueError):
    """Model output that tried to call a tool and got the format wrong (the message is shown to the model)."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in `text`, in order ([] when there is none); ToolCallError for a malformed one."""
    calls = [_parse_one(m.group(1)) for m in _BLOCK.finditer(text)]
    rest = _BLOCK.sub("", text)
    if OPEN in rest:
        raise ToolCallError(f"a {OPEN} was not closed with {CLOSE}")
    return calls


def _parse_one(body: str) -> ToolCall:
    try:
        data = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the tool call is not valid JSON ({exc.msg} at char {exc.pos}); write "
                            '{"name": ..., "arguments": {...}} inside the tags') from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise ToolCallError('a tool call must be a JSON object with a "name" string and an "arguments" object')
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):  # some models send the arguments as JSON text
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise ToolCallError(f'the "arguments" of {data["name"]} are a string that is not JSON') from None
    if not isinstance(args, dict):
        raise ToolCallError(f'the "arguments" of {data["name"]} must be a JSON object')
    return ToolCall(data["name"], args)
