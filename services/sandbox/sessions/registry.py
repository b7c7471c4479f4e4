"""The bookkeeping every kind of executor session shares: code sessions (`manager.py`) and computer sessions
(`computer/sessions.py`) each keep only what makes and runs their kind.

- **Bounds**: at most `sandbox.sessions.max_sessions` of a kind (one slot each: a uid, a browser), and a session goes
  when its owner stops renewing (`lease_s`), when it is idle (`idle_timeout_s`, never while a request runs in it)
  or old (`max_lifetime_s`): one reaper per kind applies `overdue`.
- **Ownership**: an owner's lease is renewed by its heartbeat and by any request on one of its sessions; the kinds
  of one executor share one lease table, so one heartbeat keeps all of an owner's sessions alive.
- **Scoping**: a session is reachable only with the key its `open` answered (`X-Session-Key`, `authorize`); the
  owner only labels the lease, and another client with the executor's token can neither act in, read, finish nor
  delete it, nor list it.
- **Removal**: `delete` tombstones the id with why (a later request answers 404 saying so; a finished session's
  result is kept, so a retried `finish` gets the same answer), releases the kind's resources, frees the slot and
  counts what the reaper removed. `close` removes every session (`executor_stopped`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, TypeVar

from fleet.config.infra import SandboxSessionConfig

log = logging.getLogger(__name__)
_TOMBSTONES_KEPT = 4096


class SessionError(Exception):
    """A session request that cannot be served; `status` is the HTTP answer."""

    status = 400

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.extra = extra


class SessionNotFound(SessionError):
    status = 404


class SessionForbidden(SessionError):
    """A request on a session without the key its `open` answered: another client's session."""

    status = 403


class AgentInputError(SessionError):
    """Input the policy produced that cannot be run or stored as given (a NUL byte, a command longer than the kernel
    takes, a file name longer than the filesystem's): the agent's doing, answered 400 with `agent_input: true` so the
    client shows it to the agent as an `error:` observation (never retried, never an infrastructure failure)."""

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message, agent_input=True, **extra)


class SessionsFull(SessionError):
    status = 503


class SessionInfraError(SessionError):
    """The executor could not make or run the session (repository, git, disk, a renderer): infrastructure, never
    the agent's doing."""

    status = 502


@dataclass
class SessionRecord:
    """What the registry keeps of every session; a kind adds its own fields (positional after `owner`)."""

    id: str
    owner: str
    _: KW_ONLY
    slot: int = -1
    """Index of the session's slot (its uid in the kind's uid range): given back when it goes."""
    request_id: str = ""
    created: float = field(default_factory=time.monotonic)
    active: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    work: set[Any] = field(default_factory=set)
    """What runs in the session now (a long command is not idleness)."""
    ready: bool = True
    """Only a ready session is reaped: one still opening is its owner's request in flight."""
    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The capability its `open` answered (`session_key`): every request on the session must carry it."""


def overdue(sessions: Iterable[SessionRecord], leases: dict[str, float], cfg: SandboxSessionConfig,
            now: float) -> list[tuple[str, str]]:
    """(id, why) of each session to remove now: its owner stopped renewing, idle, or too old."""
    out = []
    for s in sessions:
        if now - leases.get(s.owner, s.created) > cfg.lease_s:
            out.append((s.id, "owner_lost"))
        elif now - s.active > cfg.idle_timeout_s and not s.work:  # a long command is not idleness
            out.append((s.id, "idle"))
        elif now - s.created > cfg.max_lifetime_s:
            out.append((s.id, "lifetime"))
    return out


S = TypeVar("S", bound=SessionRecord)


class SessionRegistry(Generic[S]):
    """The live sessions of one kind, their owners' leases and the tombstones of removed ones. A kind subclasses
    it, names itself (`kind`, for messages) and releases what a session holds in `_release`."""

    kind = "session"

    def __init__(self, bounds: SandboxSessionConfig, leases: dict[str, float] | None = None) -> None:
        self.bounds = bounds
        self.sessions: dict[str, S] = {}
        self.leases: dict[str, float] = {} if leases is None else leases  # owner -> last renewal (monotonic)
        self.ended: OrderedDict[str, tuple[str, dict[str, Any] | None]] = OrderedDict()  # id -> (why, result)
        self._ended_keys: dict[str, str] = {}  # a retried finish of an ended session needs its key too
        self.reaped: dict[str, int] = {}
        self._free: list[int] = list(range(bounds.max_sessions - 1, -1, -1))
        self._reaper: asyncio.Task[None] | None = None

    async def _release(self, session: S) -> None:
        """Free what `session` holds (its tree, its browser); it is out of the registry already."""

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start_reaper(self) -> None:
        self._reaper = asyncio.create_task(self._reap_loop(), name=f"sandbox-{self.kind.replace(' ', '-')}-reaper")

    async def close_all(self) -> None:
        """Stop the reaper and remove every session (the executor stops)."""
        if self._reaper is not None:
            # Cancelled until it is done: on Python 3.11 `asyncio.wait_for` drops a cancellation that arrives as its
            # inner wait ends (a renderer's exit, mid-removal), and the reaper would go on forever.
            while not self._reaper.done():
                self._reaper.cancel()
                await asyncio.wait([self._reaper], timeout=1.0)
            self._reaper = None
        for sid in list(self.sessions):
            await self.delete(sid, "executor_stopped")

    # -- ownership -----------------------------------------------------------------------------------------------
    def renew(self, owner: str) -> list[str]:
        """Renew `owner`'s lease; returns the ids of its live sessions (so it can tell which ones it lost)."""
        self.leases[owner] = time.monotonic()
        return self.ids(owner)

    def ids(self, owner: str | None = None) -> list[str]:
        return [s.id for s in self.sessions.values() if owner is None or s.owner == owner]

    def authorize(self, sid: str, key: str) -> None:
        """SessionForbidden unless `key` is the one `sid`'s open answered (unknown ids pass: `get` answers 404)."""
        live = self.sessions.get(sid)
        want = live.key if live is not None else self._ended_keys.get(sid)
        if want is not None and not hmac.compare_digest(want.encode(), key.encode()):
            raise SessionForbidden(f"{self.kind} {sid}: X-Session-Key missing or wrong (a session is reachable only "
                                   "with the key its open answered)", field="X-Session-Key")

    def get(self, sid: str) -> S:
        session = self.sessions.get(sid)
        if session is None:
            ended = self.ended.get(sid)
            why = f"{self.kind} {sid} was removed ({ended[0]})" if ended else f"unknown {self.kind} {sid}"
            raise SessionNotFound(why, reason=ended[0] if ended else "unknown")
        session.active = time.monotonic()
        self.leases[session.owner] = session.active  # a request on it is a sign of life of its owner
        return session

    def retried(self, owner: str, request_id: str) -> S | None:
        """The session a first request with this owner and request id made (a retry gets it, never a second)."""
        if request_id:
            for s in self.sessions.values():
                if s.owner == owner and s.request_id == request_id:
                    return s
        return None

    def finished(self, sid: str) -> dict[str, Any] | None:
        """The result of `sid`'s finish, if it finished (a retried finish gets the same answer)."""
        ended = self.ended.get(sid)
        return ended[1] if ended is not None else None

    def claim_slot(self, opening: int = 0) -> int:
        """A free slot, or SessionsFull (`opening`: sessions being made that hold one already)."""
        if not self._free or len(self.sessions) + opening >= self.bounds.max_sessions:
            raise SessionsFull(f"executor holds {len(self.sessions)} {self.kind}s "
                               f"(sandbox.sessions.max_sessions={self.bounds.max_sessions})")
        return self._free.pop()

    def free_slot(self, slot: int) -> None:
        self._free.append(slot)

    def add(self, session: S) -> None:
        self.sessions[session.id] = session
        self.leases[session.owner] = time.monotonic()

    # -- removal -------------------------------------------------------------------------------------------------
    def reap(self, now: float) -> list[tuple[str, str]]:
        """Sessions to remove now, with why: the owner stopped renewing, idle, or too old."""
        return overdue([s for s in self.sessions.values() if s.ready], self.leases, self.bounds, now)

    async def _reap_loop(self) -> None:
        interval = max(0.05, min(1.0, self.bounds.lease_s / 4))
        while True:
            await asyncio.sleep(interval)
            for sid, why in self.reap(time.monotonic()):
                log.info("%s %s removed: %s", self.kind, sid, why)
                try:
                    await self.delete(sid, why)
                except Exception:  # the reaper must outlive any one session's removal
                    log.exception("removing %s %s failed", self.kind, sid)
            # A stale lease is safe to drop: a session's lease never predates its start (fallback in `overdue`).
            live = {s.owner for s in self.sessions.values()}
            for owner in [o for o, t in self.leases.items() if o not in live
                          and time.monotonic() - t > self.bounds.lease_s]:
                self.leases.pop(owner, None)

    async def delete(self, sid: str, why: str = "deleted", result: dict[str, Any] | None = None) -> bool:
        session = self.sessions.pop(sid, None)
        if session is None:
            return False
        self.ended[sid] = (why, result)
        self._ended_keys[sid] = session.key
        while len(self.ended) > _TOMBSTONES_KEPT:
            self._ended_keys.pop(self.ended.popitem(last=False)[0], None)
        await self._release(session)
        self.free_slot(session.slot)  # not after a failed release: its uid may still run something
        if why not in ("deleted", "finished"):
            self.reaped[why] = self.reaped.get(why, 0) + 1
        return True
