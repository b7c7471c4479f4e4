"""The computer-use actions: what a model may do to the screen, as tool calls, and their JSON form.

`parse_action(name, arguments)` validates one tool call (as `envs/agent/parser.py` extracts it from
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) and raises `ActionError` with a message written for the
model: it becomes the error observation of that turn. `COMPUTER_TOOLS` are the JSON-schema descriptions handed to
the chat template (`tools=`). `action.to_json()` / `action_from_json` carry an action over HTTP to the sandbox,
which validates it again with the same rules (it trusts nobody's parsing but its own).

Coordinates are screenshot pixels, origin top left; with `viewport=` the parser also checks they are on screen.
This module imports nothing of the project, so the sandbox, the client and the rollout side share it freely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

KEYS = ("Enter", "Tab", "Backspace", "Escape", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight")
MAX_TEXT = 200
MAX_SCROLL = 2000


class ActionError(ValueError):
    """A tool call that is not a valid action; the message is meant for the model (what was wrong, what to send)."""


@dataclass(frozen=True)
class Action:
    name: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        """`{"name": ..., "arguments": {...}}`, the tool-call shape (and the sandbox's wire form)."""
        return {"name": self.name, "arguments": asdict(self)}


@dataclass(frozen=True)
class Click(Action):
    name: ClassVar[str] = "click"
    x: int
    y: int


@dataclass(frozen=True)
class Type(Action):
    name: ClassVar[str] = "type"
    text: str


@dataclass(frozen=True)
class Key(Action):
    name: ClassVar[str] = "key"
    key: str


@dataclass(frozen=True)
class Scroll(Action):
    name: ClassVar[str] = "scroll"
    dx: int
    dy: int


@dataclass(frozen=True)
class Done(Action):
    name: ClassVar[str] = "done"


ACTIONS: dict[str, type[Action]] = {a.name: a for a in (Click, Type, Key, Scroll, Done)}
_SIGNATURES = {"click": "click(x, y)", "type": "type(text)", "key": "key(key)", "scroll": "scroll(dx, dy)",
               "done": "done()"}


def _int(name: str, arguments: dict[str, Any], key: str) -> int:
    value = arguments.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # small models often quote numbers; the meaning is not in doubt
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"{name}: {key} must be an integer, got {value!r} (call {_SIGNATURES[name]})")
    return value


def _text(name: str, arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ActionError(f"{name}: {key} must be a string, got {value!r} (call {_SIGNATURES[name]})")
    return value


def parse_action(name: Any, arguments: Any, *, viewport: tuple[int, int] | None = None) -> Action:
    """One validated action, or ActionError saying what to fix. `viewport` (width, height): click coordinates must
    lie on the screenshot."""
    if not isinstance(name, str) or name not in ACTIONS:
        raise ActionError(f"unknown action {name!r}; the actions are {', '.join(_SIGNATURES.values())}")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError(f"{name}: arguments must be a JSON object, e.g. {_example(name)}")
    expected = {f.name for f in fields(ACTIONS[name])}
    extra = sorted(set(arguments) - expected)
    if extra:
        raise ActionError(f"{name}: unexpected argument {extra[0]!r} (call {_SIGNATURES[name]})")
    missing = sorted(expected - set(arguments))
    if missing:
        raise ActionError(f"{name}: missing argument {missing[0]!r} (call {_SIGNATURES[name]}, e.g. {_example(name)})")
    return _build(name, arguments, viewport)


def _build(name: str, arguments: dict[str, Any], viewport: tuple[int, int] | None) -> Action:
    if name == "click":
        x, y = _int(name, arguments, "x"), _int(name, arguments, "y")
        if viewport is not None and not (0 <= x < viewport[0] and 0 <= y < viewport[1]):
            raise ActionError(f"click: ({x}, {y}) is outside the {viewport[0]}x{viewport[1]} screen; x must be in "
                              f"0..{viewport[0] - 1} and y in 0..{viewport[1] - 1}")
        return Click(x, y)
    if name == "type":
        text = _text(name, arguments, "text")
        if not text or len(text) > MAX_TEXT:
            raise ActionError(f"type: text must be 1 to {MAX_TEXT} characters, got {len(text)}")
        return Type(text)
    if name == "key":
        key = _text(name, arguments, "key")
        if key not in KEYS and len(key) != 1:
            raise ActionError(f"key: {key!r} is not a key; use one of {', '.join(KEYS)} or a single character")
        return Key(key)
    if name == "scroll":
        dx, dy = _int(name, arguments, "dx"), _int(name, arguments, "dy")
        if abs(dx) > MAX_SCROLL or abs(dy) > MAX_SCROLL:
            raise ActionError(f"scroll: dx and dy must be within -{MAX_SCROLL}..{MAX_SCROLL} pixels")
        return Scroll(dx, dy)
    return Done()


def _example(name: str) -> str:
    return {"click": '{"x": 112, "y": 40}', "type": '{"text": "hello"}', "key": '{"key": "Enter"}',
            "scroll": '{"dx": 0, "dy": 100}', "done": "{}"}[name]


def action_from_json(data: Any, *, viewport: tuple[int, int] | None = None) -> Action:
    """The inverse of `Action.to_json` (ActionError for anything else)."""
    if not isinstance(data, dict) or "name" not in data:
        raise ActionError('action: must be an object {"name": ..., "arguments": {...}}')
    return parse_action(data["name"], data.get("arguments", {}), viewport=viewport)


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


_INT = {"type": "integer"}
COMPUTER_TOOLS: list[dict[str, Any]] = [
    _tool("click", "Click the left mouse button at pixel (x, y) of the screenshot (origin: top left).",
          {"x": {**_INT, "description": "Pixels from the left edge."},
           "y": {**_INT, "description": "Pixels from the top edge."}}),
    _tool("type", "Type text into the focused field (click the field first).",
          {"text": {"type": "string", "description": "The text to type."}}),
    _tool("key", "Press one key.", {"key": {"type": "string", "description": f"One of {', '.join(KEYS)}, or a "
                                                                            "single character."}}),
    _tool("scroll", "Scroll the page by (dx, dy) pixels (positive dy scrolls down).",
          {"dx": {**_INT, "description": "Horizontal pixels."}, "dy": {**_INT, "description": "Vertical pixels."}}),
    _tool("done", "Say the task is done: the page is checked as it is now. Ends the episode.", {}),
]
TOOL_NAMES = frozenset(ACTIONS)
