"""Computer sessions: one headless Chromium per session, showing one task page, driven by the agent's actions.

- **Open**: a browser starts in its own sandbox (`renderer.py`: bwrap, no network, the session's own uid and a
  per-task cgroup when the executor has them), loads the task page, and answers its first screenshot.
- **Act**: one action at a time per session (click, type, key, scroll; `done` changes nothing), validated with the
  same rules as the rollout side (`envs/computer_use/actions.py`), then a screenshot. An invalid action, or one past
  the task's `max_actions`, is a 400 the agent sees; the page is untouched.
- **Finish**: the task's check runs in an isolated world of the page (`Renderer.evaluate_isolated`): passed or
  failed, reward 1 or 0. The session is removed; a retry gets the same verdict.
- **Infrastructure**: a renderer that exits, closes its pipe, crashes or misses `action_timeout_s` is removed at
  once; `act` answers 502 and `finish` an `infra_error` verdict, never `failed`.
- **Bounds and ownership** are every session kind's (`services/sandbox/sessions/registry.py`): the code sessions'
  owner leases (one heartbeat, `POST /session/renew`, keeps both kinds alive; any request on a session renews
  too), and the same rule (`overdue`: owner lost, idle, lifetime; a browser still opening is not reaped). At most
  `sandbox.sessions.max_sessions` browsers at once. When the executor stops, every browser is killed; when it
  dies, bwrap's `--die-with-parent` takes each browser with it.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any

from envs.computer_use.actions import Action, ActionError, Click, Done, Key, Scroll, Type, action_from_json
from fleet.config.infra import SandboxConfig
from services.sandbox.bwrap import UidRange
from services.sandbox.cgroups import CgroupRoot
from services.sandbox.computer.cdp import CdpError, RendererGone
from services.sandbox.computer.renderer import Renderer, RendererSpec, find_chromium
from services.sandbox.computer.task import ComputerTask
from services.sandbox.sessions.manager import SessionManager
from services.sandbox.sessions.registry import (
    SessionError,
    SessionInfraError,
    SessionNotFound,
    SessionRecord,
    SessionRegistry,
    SessionsFull,
)

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0  # a cold browser start on a loaded 2-core host takes seconds, not a minute


@dataclass
class Screenshot:
    png: bytes
    width: int
    height: int
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        return {"screenshot": base64.b64encode(self.png).decode(), "width": self.width, "height": self.height,
                "elapsed_s": round(self.elapsed_s, 4)}


@dataclass
class ComputerSession(SessionRecord):
    """`ready` once opened (browser started, first screenshot taken): only then do the bounds apply."""

    task: ComputerTask
    renderer: Renderer | None = None
    actions: int = 0


def renderer_spec(cfg: SandboxConfig, task: ComputerTask, marker: str, uid: int | None,
                  tools: dict[str, str]) -> RendererSpec:
    """The sandbox a session's browser gets: the executor's host view and limits (`sandbox.*`)."""
    return RendererSpec(task.width, task.height, marker, uid=uid, use_bwrap=cfg.use_bwrap,
                        visible_paths=tuple(cfg.visible_paths), tmpfs_mb=cfg.tmpfs_mb,
                        max_processes=cfg.max_processes, max_file_mb=cfg.max_file_mb, tools=tools)


class ComputerSessions(SessionRegistry[ComputerSession]):
    """The computer sessions of one executor, sharing the code sessions' owner leases."""

    kind = "computer session"

    def __init__(self, code: SessionManager, cfg: SandboxConfig) -> None:
        # The same lease dict: one heartbeat renews an owner's sessions of both kinds.
        super().__init__(cfg.sessions, leases=code.leases)
        self.cfg = cfg
        self.unavailable: str | None = "not started"
        self._chromium = ""
        self._tools: dict[str, str] = {}
        self._uids: UidRange | None = None
        self._cgroups: CgroupRoot | None = None

    async def start(self) -> None:
        """Find the browser and the tools; without them every open answers 503 saying why (code tasks still run)."""
        try:
            self._chromium = find_chromium()
            names = ("prlimit", "bwrap", "setpriv") if self.cfg.use_bwrap else ("prlimit",)
            self._tools = {n: p for n in names if (p := shutil.which(n))}
            if len(self._tools) < len(names):
                raise RuntimeError(f"missing tools: {', '.join(set(names) - set(self._tools))}")
        except RuntimeError as exc:
            self.unavailable = f"computer sessions unavailable: {exc}"
            log.warning("%s", self.unavailable)
        else:
            self.unavailable = None
        if os.geteuid() == 0 and self.cfg.use_bwrap:  # the next free uid range after the code sessions'
            self._uids = UidRange(self.cfg.uid_base, self.bounds.max_sessions)
        if self.cfg.cgroups != "off" and self.cfg.use_bwrap:
            self._cgroups = CgroupRoot.detect()
            if self._cgroups is None and self.cfg.cgroups == "required":
                self.unavailable = "computer sessions unavailable: sandbox.cgroups=required but no cgroups here"
        self.start_reaper()

    async def close(self) -> None:
        await self.close_all()
        if self._cgroups is not None:
            self._cgroups.remove()
            self._cgroups = None
        if self._uids is not None:
            self._uids.release()
            self._uids = None

    def health(self) -> dict[str, Any]:
        return {"computer_sessions": len(self.sessions), "computer_unavailable": self.unavailable,
                "computer_sessions_reaped": dict(self.reaped)}

    # -- open / delete -------------------------------------------------------------------------------------------
    async def open(self, owner: str, task: ComputerTask, request_id: str = "") -> tuple[ComputerSession, Screenshot]:
        """A new session showing `task`'s page, and its first screenshot. A retried request (same owner and
        request_id) gets the first one's session and a fresh screenshot."""
        if self.unavailable is not None:
            raise SessionsFull(self.unavailable, infra=True)
        if (first := self.retried(owner, request_id)) is not None:
            return first, await self.act(first.id, Done())
        session = ComputerSession(uuid.uuid4().hex, owner, task, slot=self.claim_slot(), request_id=request_id,
                                  ready=False)
        self.add(session)
        session.work.add(self)
        try:
            t0 = time.monotonic()
            renderer = await self._launch(session)
            if session.id not in self.sessions:  # deleted while the browser started (executor stopping)
                await renderer.close()
                raise SessionNotFound(f"computer session {session.id} was removed while it opened", reason="deleted")
            session.renderer = renderer
            await renderer.load(task.html, limit_s=max(task.action_timeout_s, 10.0))
            shot = await self._shoot(session, t0)
        except (RendererGone, CdpError, OSError) as exc:
            await self.delete(session.id, "renderer_failed")
            raise SessionInfraError(f"the renderer failed: {exc}", infra=True) from None
        except BaseException:
            await self.delete(session.id, "renderer_failed")
            raise
        finally:
            session.work.discard(self)
        # The owner's lease counts from now: its heartbeat starts once it has the session, and a browser start on a
        # loaded host can take longer than the lease.
        session.ready = True
        self.leases[owner] = session.active = time.monotonic()
        return session, shot

    async def _launch(self, session: ComputerSession) -> Renderer:
        uid = self._uids.base + session.slot if self._uids is not None else None
        cgroup = self._cgroups.task(self.cfg.task_memory_mb << 20, self.cfg.max_processes) if self._cgroups else None
        spec = renderer_spec(self.cfg, session.task, session.id, uid, self._tools)
        try:
            return await Renderer.launch(spec, chromium=self._chromium, cgroup=cgroup, timeout_s=START_TIMEOUT_S)
        except BaseException:
            if cgroup is not None:
                await cgroup.remove()
            raise

    async def _release(self, session: ComputerSession) -> None:
        if session.renderer is not None:
            await session.renderer.close()

    # -- act / finish --------------------------------------------------------------------------------------------
    def parse(self, sid: str, data: Any) -> Action:
        """The action of a request body's `action`, checked against the session's screen and budget (400s)."""
        session = self.get(sid)
        try:
            action = action_from_json(data, viewport=(session.task.width, session.task.height))
        except ActionError as exc:
            raise SessionError(str(exc), field="action") from None
        if not isinstance(action, Done) and session.actions >= session.task.max_actions:
            raise SessionError(f"action: this episode's {session.task.max_actions} actions are used up "
                               "(task.max_actions); call done", field="action", reason="max_actions")
        return action

    async def act(self, sid: str, action: Action) -> Screenshot:
        """Apply `action` and answer the screenshot after it; SessionInfraError (502) if the renderer failed."""
        session = self.get(sid)
        session.work.add(action)
        try:
            async with session.lock:
                t0 = time.monotonic()
                if not isinstance(action, Done):
                    session.actions += 1
                    await self._apply(session, action)
                return await self._shoot(session, t0)
        except (RendererGone, CdpError, OSError) as exc:
            if sid not in self.sessions:
                raise SessionNotFound(f"computer session {sid} was removed while it acted",
                                      reason=self.ended.get(sid, ("deleted",))[0]) from None
            await self.delete(sid, "renderer_failed")
            raise SessionInfraError(f"the renderer failed: {exc}", infra=True) from None
        finally:
            session.work.discard(action)

    async def _apply(self, session: ComputerSession, action: Action) -> None:
        r, limit = session.renderer, session.task.action_timeout_s
        assert r is not None
        if isinstance(action, Click):
            await r.click(action.x, action.y, limit_s=limit)
        elif isinstance(action, Type):
            await r.type_text(action.text, limit_s=limit)
        elif isinstance(action, Key):
            await r.key(action.key, limit_s=limit)
        elif isinstance(action, Scroll):
            await r.scroll(action.dx, action.dy, limit_s=limit)

    async def _shoot(self, session: ComputerSession, t0: float) -> Screenshot:
        assert session.renderer is not None
        png = await session.renderer.screenshot(limit_s=session.task.action_timeout_s)
        return Screenshot(png, session.task.width, session.task.height, time.monotonic() - t0)

    async def finish(self, sid: str) -> dict[str, Any]:
        """`{"verdict": {status: passed|failed|infra_error, reward, detail}}`; the session is removed. Idempotent."""
        if (done := self.finished(sid)) is not None:
            return done
        session = self.get(sid)
        async with session.lock:
            verdict = await self._grade(session)
        result = {"session_id": sid, "actions": session.actions, "verdict": verdict}
        await self.delete(sid, "finished", result)
        return result

    async def _grade(self, session: ComputerSession) -> dict[str, Any]:
        assert session.renderer is not None
        try:
            value = await session.renderer.evaluate_isolated(session.task.check,
                                                             limit_s=session.task.action_timeout_s)
        except RendererGone as exc:
            return {"status": "infra_error", "reward": 0.0, "detail": f"the renderer failed: {exc}"}
        except CdpError as exc:  # the task's check is broken: not the agent's doing either
            return {"status": "infra_error", "reward": 0.0, "detail": f"the task's check failed: {exc}"}
        if not isinstance(value, dict) or not isinstance(value.get("passed"), bool):
            return {"status": "infra_error", "reward": 0.0,
                    "detail": f"the task's check answered {str(value)[:200]!r}, not {{passed: bool, detail}}"}
        passed = value["passed"]
        return {"status": "passed" if passed else "failed", "reward": 1.0 if passed else 0.0,
                "detail": str(value.get("detail", ""))[:500]}
