"""The HTTP face of `SessionManager` (JSON everywhere, errors `{"error": ...}`, 400s name the field):

  POST   /session                 {owner, request_id?, repo_url, base_commit, test_patch?, fail_to_pass?, ...}
                                  -> {session_id, owner, commit, lease_s}; 503 full/draining, 502 repository/git
  POST   /session/renew           {owner} -> {owner, sessions: [ids]}   (the owner's heartbeat)
  GET    /session?owner=O         -> {sessions: [...]}
  POST   /session/{id}/exec       {command, timeout?, request_id?} -> {exit_code, stdout, stderr, *_bytes,
                                  *_truncated, timed_out, wall_s}   (request_id: never run twice)
  GET    /session/{id}/file?path= -> {path, content, size, truncated}
  PUT    /session/{id}/file       {path, content} -> {path, size}
  POST   /session/{id}/finish     {grade_unchanged?} -> {session_id, patch, **Verdict}   (graded in a fresh tree;
                                  idempotent; grade_unchanged=false: an unchanged tree is `format_error`, not run)
  DELETE /session/{id}            -> {session_id, deleted}

A removed session answers 404 saying why (`reason`: owner_lost, idle, lifetime, finished, deleted,
executor_stopped, unknown). `KindRoutes` holds what every session kind's routes share (the owner's heartbeat,
delete, the draining refusal, the error mapping); `computer/routes.py` is the other kind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from aiohttp import web

from fleet.contracts.sandbox import SpecError, spec_from_json
from services.sandbox.session_files import PathRefused
from services.sandbox.session_registry import SessionError, SessionRegistry, SessionsFull
from services.sandbox.sessions import SessionManager

Handler = Callable[[web.Request], Awaitable[web.Response]]
R = TypeVar("R", bound=SessionRegistry[Any])
_OPEN_KEYS = {"owner", "request_id"}


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise SessionError("body: not valid JSON", field="body") from None
    except RecursionError:  # json nests by recursion: a deeply nested body is bad input, not a server failure
        raise SessionError("body: JSON nested too deeply", field="body") from None
    if not isinstance(data, dict):
        raise SessionError(f"body: must be a JSON object, got {type(data).__name__}", field="body")
    return data


def _text(data: dict[str, Any], key: str, *, required: bool = True) -> str:
    value = data.get(key, None if required else "")
    if not isinstance(value, str) or (required and not value):
        raise SessionError(f"{key}: must be a non-empty string" if required else f"{key}: must be a string",
                           field=key)
    return value


class KindRoutes(Generic[R]):
    """The routes of one session kind under `/{prefix}`: a kind adds its own (open, list, its verbs) to these."""

    def __init__(self, manager: R, draining: Callable[[], bool]) -> None:
        self.m, self.draining = manager, draining

    def add_common(self, app: web.Application, prefix: str) -> None:
        app.router.add_post(f"/{prefix}/renew", self._guard(self.renew))
        app.router.add_delete(f"/{prefix}/{{sid}}", self._guard(self.delete))

    def refuse_if_draining(self) -> None:
        if self.draining():
            raise SessionsFull("executor is shutting down; open the session elsewhere", draining=True)

    async def renew(self, request: web.Request) -> web.Response:
        owner = _text(await _body(request), "owner")
        return web.json_response({"owner": owner, "sessions": self.m.renew(owner)})

    async def delete(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        deleted = await self.m.delete(sid, "deleted")
        if not deleted and sid not in self.m.ended:
            return _error(404, f"unknown {self.m.kind} {sid}", reason="unknown")
        return web.json_response({"session_id": sid, "deleted": deleted})

    @staticmethod
    def _guard(handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.Response:
            try:
                return await handler(request)
            except SessionError as exc:
                return _error(exc.status, str(exc), **exc.extra)
            except SpecError as exc:
                return _error(400, str(exc), field=exc.field)
            except PathRefused as exc:
                return _error(400, str(exc), field="path")
            except FileNotFoundError:
                return _error(404, f"path: {request.query.get('path', '')!r} does not exist in the session",
                              field="path", reason="no_such_file")
        return guarded


class SessionRoutes(KindRoutes[SessionManager]):
    def add_to(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/session", self._guard(self.open))
        r.add_get("/session", self._guard(self.list))
        r.add_post("/session/{sid}/exec", self._guard(self.exec))
        r.add_get("/session/{sid}/file", self._guard(self.read))
        r.add_put("/session/{sid}/file", self._guard(self.write))
        r.add_post("/session/{sid}/finish", self._guard(self.finish))
        self.add_common(app, "session")

    async def open(self, request: web.Request) -> web.Response:
        self.refuse_if_draining()
        data = await _body(request)
        owner = _text(data, "owner")
        request_id = _text(data, "request_id", required=False)
        spec = spec_from_json({"patch": "", **{k: v for k, v in data.items() if k not in _OPEN_KEYS}},
                              max_timeout=self.m.executor.cfg.max_timeout_s)
        session = await self.m.open(owner, spec, request_id)
        return web.json_response({**session.info(), "lease_s": self.m.cfg.lease_s})

    async def list(self, request: web.Request) -> web.Response:
        owner = request.query.get("owner")
        return web.json_response({"sessions": [self.m.sessions[s].info() for s in self.m.ids(owner)]})

    async def exec(self, request: web.Request) -> web.Response:
        data = await _body(request)
        limit = data.get("timeout")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
            raise SessionError("timeout: must be a number of seconds", field="timeout")
        result = await self.m.exec(request.match_info["sid"], _text(data, "command"),
                                   limit_s=None if limit is None else float(limit),
                                   key=_text(data, "request_id", required=False))
        return web.json_response(result.to_json())

    async def read(self, request: web.Request) -> web.Response:
        path = request.query.get("path", "")
        data, size = await self.m.read_file(request.match_info["sid"], path)
        return web.json_response({"path": path, "content": data.decode(errors="replace"), "size": size,
                                  "truncated": size > len(data)})

    async def write(self, request: web.Request) -> web.Response:
        data = await _body(request)
        path, content = _text(data, "path"), _text(data, "content", required=False)
        raw = content.encode()
        await self.m.write_file(request.match_info["sid"], path, raw)
        return web.json_response({"path": path, "size": len(raw)})

    async def finish(self, request: web.Request) -> web.Response:
        data = await _body(request) if request.can_read_body else {}
        grade = data.get("grade_unchanged", True)
        if not isinstance(grade, bool):
            raise SessionError("grade_unchanged: must be true or false", field="grade_unchanged")
        return web.json_response(await self.m.finish(request.match_info["sid"], grade_unchanged=grade))
