"""What every kind of executor session's client shares: `SessionClientBase` and `PinnedSession`.

A client opens sessions on the executor with the fewest of its own sessions, retrying another one when an executor
is full, draining or unreachable (the same request id on every retry: never two sessions), and renews its owner's
lease on every executor it holds sessions on (a background heartbeat): when its process dies, the heartbeats stop and
the executors remove its sessions after `sandbox.sessions.lease_s`. A session is pinned to its executor, so
transport failures are retried there; a session that is gone raises `SessionUnavailable` -- an infrastructure
failure, never something the agent did. A kind names its routes (`PATH`) and adds its session's verbs:
`sessions.py` (code sessions, `/session/*`), `computer.py` (browsers, `/computer/sessions/*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

import aiohttp

from fleet.contracts.sandbox import TOKEN_ENV
from sandbox_client.endpoints import http_session, stop_task
from sandbox_client.results import SandboxAuthError, SandboxError, SandboxRequestError, SandboxUnavailable

if TYPE_CHECKING:
    from fleet.config.env import CodeEnvConfig

log = logging.getLogger(__name__)
_TRANSPORT = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class SessionUnavailable(SandboxUnavailable):
    """The session, or its executor, is gone (or unreachable after retries): the episode cannot go on."""


class SessionToolError(SandboxError):
    """A request the agent got wrong (no such file, a path outside the tree, a file too large): an observation."""


class PinnedSession:
    """One open session, pinned to the executor at `url`; a kind adds its verbs (each a `client.call`)."""

    def __init__(self, client: SessionClientBase, url: str, session_id: str, key: str = "") -> None:
        self.client, self.url, self.id = client, url, session_id
        self.key = key
        """The capability the executor's open answered (`session_key`): sent with every request on the session."""
        self.closed = False

    def ended(self) -> None:
        """The executor removed the session (it finished): no more heartbeat, no delete."""
        self.closed = True
        self.client.forget(self)

    async def close(self) -> None:
        """Remove the session (best effort: the executor's lease removes it anyway)."""
        if not self.closed:
            self.ended()
            with contextlib.suppress(SandboxError, *_TRANSPORT):
                await self.client.call(self, "DELETE", "", retries=0)


class SessionClientBase:
    PATH = ""
    """The executor's routes of this kind of session (`session`, `computer/sessions`)."""

    def __init__(self, urls: Sequence[str], owner: str, *, token: str | None = None, request_timeout_s: float = 30.0,
                 max_retries: int = 3, backoff_s: float = 0.2) -> None:
        if not urls:
            raise ValueError("env.code.sandbox_urls must list at least one executor URL")
        self.urls = [u.rstrip("/") for u in dict.fromkeys(urls)]
        self.owner = owner
        self.token = token or os.environ.get(TOKEN_ENV) or None
        self.request_timeout_s, self.max_retries, self.backoff_s = request_timeout_s, max_retries, backoff_s
        self.open_sessions: dict[str, PinnedSession] = {}
        self.lease_s = 30.0
        self._http: aiohttp.ClientSession | None = None
        self._renewer: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, code: CodeEnvConfig, owner: str) -> Self:
        """From the config's `env.code` section (the executors, the token, the retries)."""
        return cls(code.sandbox_urls, owner, token=code.auth_token, max_retries=code.max_retries)

    async def close(self) -> None:
        for session in list(self.open_sessions.values()):
            await session.close()
        await stop_task(self._renewer)
        self._renewer = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = http_session(self.token)
        return self._http

    def forget(self, session: PinnedSession) -> None:
        self.open_sessions.pop(session.id, None)

    # -- open ----------------------------------------------------------------------------------------------------
    async def open_on_executor(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(executor URL, answer) of `POST {url}/{PATH}` on the least loaded executor that takes it (the same
        request id on every retry: never two sessions)."""
        body = {**body, "owner": self.owner, "request_id": uuid.uuid4().hex}
        load = {u: 0 for u in self.urls}
        for s in self.open_sessions.values():
            load[s.url] += 1
        errors: list[str] = []
        failed: dict[str, int] = dict.fromkeys(self.urls, 0)
        for attempt in range(self.max_retries + 1):
            url = min(self.urls, key=lambda u: (failed[u], load[u]))  # the same retry id: never two sessions
            try:
                data = await self._request("POST", f"{url}/{self.PATH}", json=body)
            except _Retry as exc:
                errors.append(f"{url}: {exc}")
                failed[url] += 1
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
                continue
            self.lease_s = float(data.get("lease_s", self.lease_s))
            return url, data
        raise SessionUnavailable(f"no executor could open a session: {'; '.join(errors[-3:])}")

    def track(self, session: PinnedSession) -> None:
        """Keep `session` under this client's heartbeat."""
        self.open_sessions[session.id] = session
        if self._renewer is None or self._renewer.done():  # started once the executor told the lease
            self._renewer = asyncio.create_task(self._renew_loop(), name="sandbox-session-renewer")

    # -- requests ------------------------------------------------------------------------------------------------
    async def call(self, session: PinnedSession, method: str, verb: str, *, json: Any = None,
                   params: dict[str, str] | None = None, total_s: float | None = None,
                   retries: int | None = None) -> dict[str, Any]:
        url = f"{session.url}/{self.PATH}/{session.id}" + (f"/{verb}" if verb else "")
        tries = self.max_retries if retries is None else retries
        headers = {"X-Session-Key": session.key} if session.key else None
        for attempt in range(tries + 1):
            try:
                return await self._request(method, url, json=json, params=params, total_s=total_s, headers=headers)
            except _Gone as exc:
                self.forget(session)
                raise SessionUnavailable(f"session {session.id} on {session.url} is gone: {exc}") from None
            except _Retry as exc:
                if attempt >= tries:
                    raise SessionUnavailable(f"session {session.id} on {session.url}: {exc}") from None
                await asyncio.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")

    async def _request(self, method: str, url: str, *, json: Any = None, params: dict[str, str] | None = None,
                       total_s: float | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=total_s or self.request_timeout_s)
        try:
            async with self._session().request(method, url, json=json, params=params, timeout=timeout,
                                               headers=headers) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    data = {"error": f"HTTP {resp.status} without a JSON body"}
                status = resp.status
        except _TRANSPORT as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        if status == 200:
            return data
        message = str(data.get("error", f"HTTP {status}"))
        if status == 401:
            raise SandboxAuthError(f"sandbox executor rejected the token: {message} (env.code.auth_token)")
        if status == 404 and data.get("reason") == "no_such_file":
            raise SessionToolError(message)
        if status == 404:
            raise _Gone(message)
        if status == 400 and (data.get("agent_input") or data.get("field") in ("path", "content")):
            raise SessionToolError(message)  # the agent's input: an observation, never retried
        if status == 403:
            raise SandboxRequestError(f"sandbox executor refused the session request: {message}", data.get("field"))
        if status == 400:
            raise SandboxRequestError(f"sandbox executor rejected the request: {message}", data.get("field"))
        raise _Retry(f"HTTP {status}: {message}")

    # -- lease ---------------------------------------------------------------------------------------------------
    async def renew(self) -> None:
        """Renew the owner's lease on every executor holding one of its sessions; forget sessions it lost."""
        for url in {s.url for s in self.open_sessions.values()}:
            try:
                data = await self._request("POST", f"{url}/{self.PATH}/renew", json={"owner": self.owner})
            except (_Retry, _Gone, SandboxError) as exc:
                log.warning("renewing sessions on %s failed: %s", url, exc)
                continue
            alive = set(data.get("sessions", []))
            for s in [s for s in self.open_sessions.values() if s.url == url and s.id not in alive]:
                log.warning("session %s on %s was removed by the executor", s.id, url)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.lease_s / 3))
            try:
                await self.renew()
            except Exception:  # the heartbeat must not die: without it every session is reaped
                log.exception("session lease renewal failed")


class _Retry(Exception):
    pass


class _Gone(Exception):
    pass
