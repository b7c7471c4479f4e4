"""The task payload a computer session is opened with (`envs/computer_use/env.py: task_to_payload`), validated.

Every field is checked here, at the edge, with a message naming it: the sandbox trusts no caller's validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.sandbox.sessions.registry import SessionError

MAX_HTML = 1 << 20
MAX_CHECK = 64 << 10
MAX_ACTION_TIMEOUT_S = 120.0
MAX_ACTIONS = 256


@dataclass(frozen=True)
class ComputerTask:
    html: str
    width: int
    height: int
    check: str
    """A JS expression over the final page's DOM answering {passed: bool, detail: string}."""
    action_timeout_s: float = 10.0
    max_actions: int = 8
    instance_id: str = ""


def _bad(key: str, why: str) -> SessionError:
    return SessionError(f"task.{key}: {why}", field=f"task.{key}")


def _string(data: dict[str, Any], key: str, limit: int) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _bad(key, "must be a non-empty string")
    if len(value.encode()) > limit:
        raise _bad(key, f"is {len(value.encode())} bytes, more than {limit}")
    return value


def _number(data: dict[str, Any], key: str, default: float, low: float, high: float, *, integer: bool) -> float:
    value = data.get(key, default)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise _bad(key, f"must be {kind} in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def task_from_json(data: Any) -> ComputerTask:
    if not isinstance(data, dict):
        raise SessionError("task: must be a JSON object (envs.computer_use task_to_payload)", field="task")
    viewport = data.get("viewport")
    if (not isinstance(viewport, list) or len(viewport) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or not 16 <= v <= 2048 for v in viewport)):
        raise _bad("viewport", f"must be [width, height], integers in [16, 2048], got {viewport!r}")
    instance = data.get("instance_id", "")
    return ComputerTask(
        html=_string(data, "html", MAX_HTML), width=viewport[0], height=viewport[1],
        check=_string(data, "check", MAX_CHECK),
        action_timeout_s=_number(data, "action_timeout_s", 10.0, 0.1, MAX_ACTION_TIMEOUT_S, integer=False),
        max_actions=int(_number(data, "max_actions", 8, 1, MAX_ACTIONS, integer=True)),
        instance_id=instance if isinstance(instance, str) else "")
