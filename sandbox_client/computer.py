"""Client of the executors' computer sessions (`/computer/sessions/*`), used by the computer-use episode runner.

`ComputerClient` is the shared session client (`session_base.py`) on other routes: the same executor choice
(least of this client's sessions first, another executor when one is full, draining or unreachable), the same owner
heartbeat (a background renewal; when this process dies the executors remove its browsers after
`sandbox.sessions.lease_s`), the same retries and errors. A session is pinned to its executor. Infrastructure
failures -- an executor gone, a renderer that crashed or hung, an `infra_error` verdict -- raise
`SandboxUnavailable` (`SessionUnavailable`): the runner gives the group back, never scores it. An action the
sandbox rejects raises `ActionRejected`: the agent's mistake, an observation.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Protocol

from sandbox_client.results import SandboxError, SandboxRequestError
from sandbox_client.session_base import PinnedSession, SessionClientBase, SessionUnavailable


class Action(Protocol):
    """An action in its wire form: `envs.computer_use.actions` makes them (the client only sends them)."""

    def to_json(self) -> dict[str, Any]: ...


class ActionRejected(SandboxError):
    """The sandbox refused an action (invalid, off screen, past the episode's budget); the message is for the
    model."""


@dataclass(frozen=True)
class Screenshot:
    png: bytes
    width: int
    height: int
    elapsed_s: float
    """Time the sandbox took for the action and the screenshot."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Screenshot:
        return cls(base64.b64decode(data["screenshot"]), int(data["width"]), int(data["height"]),
                   float(data.get("elapsed_s", 0.0)))


@dataclass(frozen=True)
class ComputerVerdict:
    passed: bool
    reward: float
    status: str
    """passed | failed (an `infra_error` verdict raises SandboxUnavailable instead)."""
    detail: str


class ComputerSession(PinnedSession):
    """One open computer session; `first` is the page's screenshot before any action."""

    def __init__(self, client: ComputerClient, url: str, session_id: str, first: Screenshot, key: str = "") -> None:
        super().__init__(client, url, session_id, key)
        self.first = first

    async def act(self, action: Action) -> Screenshot:
        """The screenshot after `action`; ActionRejected for an action the sandbox refused (the page is untouched)."""
        try:
            # Never retried: an action is not idempotent (a second click is a double click).
            data = await self.client.call(self, "POST", "act", json={"action": action.to_json()}, retries=0)
        except SandboxRequestError as exc:
            raise ActionRejected(str(exc).removeprefix("sandbox executor rejected the request: ")) from None
        return Screenshot.from_json(data)

    async def finish(self) -> ComputerVerdict:
        """The verdict of the page as it is now; the session is gone afterwards."""
        data = await self.client.call(self, "POST", "finish")
        self.ended()
        verdict = data.get("verdict", {})
        if verdict.get("status") not in ("passed", "failed"):
            raise SessionUnavailable(f"computer session {self.id} on {self.url} could not be graded: "
                                     f"{verdict.get('detail', verdict)}")
        return ComputerVerdict(verdict["status"] == "passed", float(verdict.get("reward", 0.0)), verdict["status"],
                               str(verdict.get("detail", "")))


class ComputerClient(SessionClientBase):
    PATH = "computer/sessions"

    async def open(self, task_payload: dict[str, Any]) -> ComputerSession:
        """A session showing `task_payload`'s page (`envs.computer_use` `task_to_payload`) on the least loaded
        executor; SessionUnavailable when none can make one."""
        url, data = await self.open_on_executor({"task": task_payload})
        session = ComputerSession(self, url, str(data["session_id"]), Screenshot.from_json(data),
                                  str(data.get("session_key", "")))
        self.track(session)
        return session
