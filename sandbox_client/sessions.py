"""Client of the executors' interactive code sessions (`/session/*`), used by the agent loop.

`SessionClient(urls, owner)` is the shared session client (`session_base.py`: executor choice, retries, the owner's
heartbeat) on the code sessions' routes; a `SandboxSession` runs commands (never twice: each carries a request id),
reads and writes files, and finishes with the verdict of its diff graded in a fresh tree. Methods raise
`SessionUnavailable` (infrastructure) or `SessionToolError` (the agent's mistake, an observation).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from fleet.contracts.sandbox import TaskSpec, Verdict
from sandbox_client.session_base import PinnedSession, SessionClientBase, SessionToolError, SessionUnavailable

__all__ = ["CommandResult", "SandboxSession", "SessionClient", "SessionToolError", "SessionUnavailable"]


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    wall_s: float


class SandboxSession(PinnedSession):
    """One open session. Methods raise SessionUnavailable (infrastructure) or SessionToolError (the agent's)."""

    async def exec(self, command: str, *, limit_s: float | None = None) -> CommandResult:
        body: dict[str, Any] = {"command": command, "request_id": uuid.uuid4().hex}
        if limit_s is not None:
            body["timeout"] = limit_s
        wait = (limit_s or 600.0) + self.client.request_timeout_s
        data = await self.client.call(self, "POST", "exec", json=body, total_s=wait)
        return CommandResult(data["exit_code"], data["stdout"], data["stderr"], bool(data["stdout_truncated"]),
                             bool(data["stderr_truncated"]), bool(data["timed_out"]), float(data["wall_s"]))

    async def read_file(self, path: str) -> tuple[str, bool]:
        """(content, truncated)."""
        data = await self.client.call(self, "GET", "file", params={"path": path})
        return str(data["content"]), bool(data["truncated"])

    async def write_file(self, path: str, content: str) -> None:
        await self.client.call(self, "PUT", "file", json={"path": path, "content": content})

    async def finish(self, *, total_s: float = 900.0, grade_unchanged: bool = True) -> tuple[Verdict, str]:
        """(verdict of the session's diff graded in a fresh tree, the diff). The session is gone afterwards.
        `grade_unchanged=False`: an unchanged tree is not run; its verdict is `format_error`."""
        data = await self.client.call(self, "POST", "finish", json={"grade_unchanged": grade_unchanged},
                                      total_s=total_s)
        self.ended()
        patch = str(data.pop("patch", ""))
        data.pop("session_id", None)
        return Verdict.from_json(data), patch


class SessionClient(SessionClientBase):
    PATH = "session"

    async def open(self, spec: TaskSpec) -> SandboxSession:
        """A session for `spec`'s task on the least loaded executor; SessionUnavailable when none can make one."""
        body = {k: v for k, v in spec.to_json().items() if k not in ("patch", "reference_patch")}
        url, data = await self.open_on_executor(body)
        session = SandboxSession(self, url, str(data["session_id"]), str(data.get("session_key", "")))
        self.track(session)
        return session
