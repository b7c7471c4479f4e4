"""The agent's tools: `shell`, `file_editor` (view, create, exact str_replace, insert) and `submit`.

`TOOL_SPECS` are the OpenAI-style function descriptions handed to the tokenizer's chat template (`tools=`) when the
prompt is built, so the model sees them in its own template's format. `ToolBox.run` executes one parsed call
against a `ToolBackend` (a sandbox session: `sandbox_client.sessions.SandboxSession`) and returns the observation
text. A call the agent got wrong (unknown tool, missing argument, no such file, an `old_str` that is not unique)
is an error observation; only an infrastructure failure (`SessionUnavailable`) escapes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from envs.agent.parser import ToolCall
from sandbox_client.sessions import CommandResult, SessionToolError

SUBMIT = "submit"
TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "shell",
        "description": "Run a shell command in the repository root (a fresh `sh -c` each time: `cd` and variables "
                       "do not persist, files do). Returns its output and exit code.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command, e.g. `grep -rn 'def mean' src`."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "file_editor",
        "description": "View, create or edit a file. view: the file with line numbers (or a folder's files). "
                       "create: a new file with file_text. str_replace: replace old_str, which must occur exactly "
                       "once, with new_str. insert: insert new_str after line insert_line (0: at the top).",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert"]},
            "path": {"type": "string", "description": "Path relative to the repository root."},
            "file_text": {"type": "string"}, "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "insert_line": {"type": "integer"}},
            "required": ["command", "path"]}}},
    {"type": "function", "function": {
        "name": SUBMIT,
        "description": "Submit the repository as it is now: its changes are graded by the hidden tests. Ends the "
                       "episode.",
        "parameters": {"type": "object", "properties": {}}}},
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOL_SPECS)


class ToolBackend(Protocol):
    async def exec(self, command: str, *, limit_s: float | None = None) -> CommandResult: ...

    async def read_file(self, path: str) -> tuple[str, bool]: ...

    async def write_file(self, path: str, content: str) -> None: ...


@dataclass(frozen=True)
class Observation:
    text: str
    error: bool = False
    submitted: bool = False
    image: bytes | None = None
    """Computer use: a screenshot (PNG) shown after the text (rollout/agent/computer.py)."""
    size: tuple[int, int] = (0, 0)
    """(width, height) of `image`."""


class ToolRunner(Protocol):
    """What the episode loop calls tools through: `ToolBox` (a sandbox session) or an environment's in-process
    tools (`envs.lookup.LookupTools`). Optional: `final_answer(text, closed)`, which makes a turn without a call the
    episode's answer (`envs.peek.PeekTools`; `rollout.agent.episode._act`)."""

    async def run(self, call: ToolCall) -> Observation: ...


class _Refused(Exception):
    """The agent's call cannot be carried out; the message is its observation."""


def _arg(call: ToolCall, key: str, kind: type = str, *, required: bool = True) -> Any:
    value = call.arguments.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _Refused(f"{call.name}: argument {key!r} must be a {kind.__name__}")
    return value


class ToolBox:
    def __init__(self, backend: ToolBackend, *, command_timeout_s: float = 30.0) -> None:
        self.backend, self.command_timeout_s = backend, command_timeout_s

    async def run(self, call: ToolCall) -> Observation:
        if call.name == SUBMIT:
            return Observation("submitted", submitted=True)
        if call.name not in TOOL_NAMES:
            return Observation(f"error: unknown tool {call.name!r}; the tools are {', '.join(sorted(TOOL_NAMES))}",
                               error=True)
        try:
            if call.name == "shell":
                return Observation(await self._shell(_arg(call, "command")))
            return Observation(await self._edit(call))
        except _Refused as exc:
            return Observation(f"error: {exc}", error=True)
        except SessionToolError as exc:
            return Observation(f"error: {exc}", error=True)

    async def _shell(self, command: str) -> str:
        r = await self.backend.exec(command, limit_s=self.command_timeout_s)
        parts = []
        if r.stdout_truncated or r.stderr_truncated:
            parts.append("[output truncated: only the end is shown]")
        parts += [r.stdout, r.stderr]
        status = f"[timed out after {self.command_timeout_s:g} s]" if r.timed_out else f"[exit code {r.exit_code}]"
        return "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts if p) + status

    async def _edit(self, call: ToolCall) -> str:
        command, path = _arg(call, "command"), _arg(call, "path")
        if command == "view":
            return await self._view(path)
        if command == "create":
            text = _arg(call, "file_text")
            if await self._exists(path):
                raise _Refused(f"{path} already exists; use str_replace or insert to change it")
            await self.backend.write_file(path, text)
            return f"created {path} ({len(text.splitlines())} lines)"
        if command == "str_replace":
            old, new = _arg(call, "old_str"), _arg(call, "new_str", required=False) or ""
            text = await self._read_whole(path)
            count = text.count(old) if old else 0
            if count != 1:
                raise _Refused(f"old_str occurs {count} times in {path}; it must occur exactly once" if old
                               else "old_str must not be empty")
            await self.backend.write_file(path, text.replace(old, new, 1))
            line = text[: text.index(old)].count("\n") + 1
            return f"replaced in {path} at line {line}"
        if command == "insert":
            new, at = _arg(call, "new_str"), _arg(call, "insert_line", int)
            lines = (await self._read_whole(path)).splitlines(keepends=True)
            if not 0 <= at <= len(lines):
                raise _Refused(f"insert_line must be in [0, {len(lines)}] for {path}")
            lines.insert(at, new if new.endswith("\n") else new + "\n")
            await self.backend.write_file(path, "".join(lines))
            return f"inserted {len(new.splitlines())} lines after line {at} of {path}"
        raise _Refused(f"file_editor: unknown command {command!r} (view, create, str_replace, insert)")

    async def _exists(self, path: str) -> bool:
        try:
            await self.backend.read_file(path)
        except SessionToolError as exc:
            if "not a regular file" in str(exc):  # a folder or a special file is there
                return True
            if "does not exist" in str(exc):
                return False
            raise  # a path the sandbox refuses: the agent sees why, not "already exists"
        return True

    async def _read_whole(self, path: str) -> str:
        text, truncated = await self.backend.read_file(path)
        if truncated:
            raise _Refused(f"{path} is too large to edit here; use shell (sed, python) instead")
        return text

    async def _view(self, path: str) -> str:
        try:
            text, truncated = await self.backend.read_file(path)
        except SessionToolError as exc:
            if "not a regular file" not in str(exc):
                raise
            listing = await self.backend.exec(f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort",
                                              limit_s=self.command_timeout_s)
            return listing.stdout or listing.stderr
        numbered = "".join(f"{i:6}\t{line}" for i, line in enumerate(text.splitlines(keepends=True), 1))
        return numbered + ("\n[file truncated]" if truncated else "")
