"""The HTTP face of `ComputerSessions` (JSON, errors `{"error": ...}` naming the field, as `/session/*`):

  POST   /computer/sessions             {owner, request_id?, task: <envs.computer_use task_to_payload>}
                                        -> {session_id, lease_s, screenshot (base64 PNG), width, height, elapsed_s}
                                        503 full / draining / no browser here, 502 the renderer failed to start
  GET    /computer/sessions?owner=O     -> {sessions: [...], computer_unavailable, ...}
  POST   /computer/sessions/renew       {owner} -> {owner, sessions: [ids]}   (the owner's heartbeat; the lease is the
                                        code sessions' one: `POST /session/renew` renews it as well)
  POST   /computer/sessions/{id}/act    {action: {name, arguments}} -> {screenshot, width, height, elapsed_s,
                                        actions_left}; 400 names an invalid action (the page is untouched),
                                        502 the renderer crashed or hung (the session is gone)
  POST   /computer/sessions/{id}/finish -> {session_id, actions, verdict: {status: passed|failed|infra_error,
                                        reward, detail}}   (idempotent; the session is removed)
  DELETE /computer/sessions/{id}        -> {session_id, deleted}

One lease per owner covers both kinds of session. Installed by the
sandbox app with `ComputerRoutes.install(app, code_sessions, draining)`, which also ties the sessions' start and
close to the app's (`on_startup` / `on_cleanup`), so stopping the executor kills every browser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from services.sandbox.computer.sessions import ComputerSession, ComputerSessions
from services.sandbox.computer.task import task_from_json
from services.sandbox.sessions.http import KindRoutes, _body, _owner_query, _text
from services.sandbox.sessions.manager import SessionManager


def _info(s: ComputerSession) -> dict[str, Any]:
    return {"session_id": s.id, "owner": s.owner, "instance_id": s.task.instance_id, "actions": s.actions}


class ComputerRoutes(KindRoutes[ComputerSessions]):
    @classmethod
    def install(cls, app: web.Application, code: SessionManager, draining: Callable[[], bool]) -> ComputerRoutes:
        routes = cls(ComputerSessions(code, code.executor.cfg), draining)

        async def start(_: web.Application) -> None:
            await routes.m.start()

        async def close(_: web.Application) -> None:
            await routes.m.close()

        app.on_startup.append(start)
        app.on_cleanup.append(close)
        guard, r = routes._guard, app.router
        r.add_post("/computer/sessions", guard(routes.open))
        r.add_get("/computer/sessions", guard(routes.list))
        r.add_post("/computer/sessions/{sid}/act", guard(routes.act))
        r.add_post("/computer/sessions/{sid}/finish", guard(routes.finish))
        routes.add_common(app, "computer/sessions")
        return routes

    async def open(self, request: web.Request) -> web.Response:
        self.refuse_if_draining()
        data = await _body(request)
        owner, request_id = _text(data, "owner"), _text(data, "request_id", required=False)
        session, shot = await self.m.open(owner, task_from_json(data.get("task")), request_id)
        return web.json_response({"session_id": session.id, "session_key": session.key,
                                  "lease_s": self.m.bounds.lease_s, **shot.to_json()})

    async def list(self, request: web.Request) -> web.Response:
        owner = _owner_query(request)
        sessions = [_info(s) for s in self.m.sessions.values() if owner is None or s.owner == owner]
        return web.json_response({"sessions": sessions, **self.m.health()})

    async def act(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        action = self.m.parse(sid, (await _body(request, {"action"})).get("action"))
        shot = await self.m.act(sid, action)
        session = self.m.sessions.get(sid)
        left = session.task.max_actions - session.actions if session else 0
        return web.json_response({**shot.to_json(), "actions_left": left})

    async def finish(self, request: web.Request) -> web.Response:
        return web.json_response(await self.m.finish(request.match_info["sid"]))
