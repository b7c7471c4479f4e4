"""The HTTP face of `SessionManager` (JSON everywhere, errors `{"error": ...}`, 400s name the field):

  POST   /session                 {owner, request_id?, repo_url, base_commit, test_patch?, fail_to_pass?, ...}
                                  -> {session_id, session_key, owner, commit, lease_s}; 503 full/draining,
                                  502 repository/git
  POST   /session/renew           {owner} -> {owner, sessions: [ids]}   (the owner's heartbeat)
  GET    /session?owner=O         -> {sessions: [...]}   (the owner's; `?all=1`: every session, for operators)
  POST   /session/{id}/exec       {command, timeout?, request_id?} -> {exit_code, stdout, stderr, *_bytes,
                                  *_truncated, timed_out, wall_s}   (request_id: never run twice)
  GET    /session/{id}/file?path= -> {path, content, size, truncated}
  PUT    /session/{id}/file       {path, content} -> {path, size}
  POST   /session/{id}/finish     {grade_unchanged?} -> {session_id, patch, **Verdict}   (graded in a fresh tree;
                                  idempotent; grade_unchanged=false: an unchanged tree is `format_error`, not run)
  DELETE /session/{id}            -> {session_id, deleted}

Every request on a session carries the key its open answered (`X-Session-Key`; 403 without it): the token admits a
client to the executor, the key to one session. Bodies with keys a route does not know are refused (400), as are
inputs the policy produced that cannot be run as given (a NUL byte, a lone surrogate, a command longer than the
kernel takes, a name longer than the filesystem's): 400 with `agent_input: true`, which the client turns into an
`error:` observation for the agent -- never a 500 that is retried and ends as an unscored group.

A removed session answers 404 saying why (`reason`: owner_lost, idle, lifetime, finished, deleted,
executor_stopped, unknown). `KindRoutes` holds what every session kind's routes share (the owner's heartbeat,
delete, the draining refusal, the error mapping); `computer/routes.py` is the other kind.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from aiohttp import web

from fleet.contracts.sandbox import SpecError, spec_from_json
from services.sandbox.sessions.files import PathRefused
from services.sandbox.sessions.manager import SessionManager
from services.sandbox.sessions.registry import AgentInputError, SessionError, SessionRegistry, SessionsFull

Handler = Callable[[web.Request], Awaitable[web.Response]]
R = TypeVar("R", bound=SessionRegistry[Any])
_OPEN_KEYS = {"owner", "request_id"}
KEY_HEADER = "X-Session-Key"
MAX_COMMAND_BYTES = 128 * 1024 - 1
"""Linux's MAX_ARG_STRLEN less the NUL: one argv string longer than this fails `execve` with E2BIG."""
# errnos a request's input causes (a name too long, a path through a file): the agent's doing, not the executor's.
_INPUT_ERRNOS = {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.E2BIG, errno.EILSEQ,
                 errno.EINVAL}


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def _body(request: web.Request, allowed: set[str] | None = None) -> dict[str, Any]:
    """The JSON object of the request; `allowed`: the keys the route knows (a misspelt or unsupported one -- `cwd`,
    `env`, `user` -- is refused rather than silently ignored)."""
    try:
        data = await request.json()
    except ValueError:
        raise SessionError("body: not valid JSON", field="body") from None
    except RecursionError:  # json nests by recursion: a deeply nested body is bad input, not a server failure
        raise SessionError("body: JSON nested too deeply", field="body") from None
    if not isinstance(data, dict):
        raise SessionError(f"body: must be a JSON object, got {type(data).__name__}", field="body")
    if allowed is not None and (unknown := sorted(set(data) - allowed)):
        raise SessionError(f"body: unknown key(s) {', '.join(map(repr, unknown))} (this route takes "
                           f"{', '.join(sorted(allowed))})", field=unknown[0])
    return data


def _command(data: dict[str, Any]) -> str:
    """The command to run, or an AgentInputError the agent sees: empty, NUL bytes, not UTF-8, or too long."""
    command = data.get("command")
    if not isinstance(command, str):
        raise SessionError("command: must be a string", field="command")
    if not command.strip():
        raise AgentInputError("command: is empty", field="command")
    if "\0" in command:
        raise AgentInputError("command: contains a NUL byte, which no shell command can", field="command")
    try:
        size = len(command.encode())
    except UnicodeEncodeError:
        raise AgentInputError("command: is not valid UTF-8 (a lone surrogate)", field="command") from None
    if size > MAX_COMMAND_BYTES:
        raise AgentInputError(f"command: {size} bytes is longer than a command can be ({MAX_COMMAND_BYTES}); write "
                              "the script to a file and run the file", field="command")
    return command


def _owner_query(request: web.Request) -> str | None:
    """The owner whose sessions to list; None only for the operator's view (`?all=1`: ids and ages, which are of no
    use without the sessions' keys). A client lists its own sessions, never another's by accident."""
    owner = request.query.get("owner", "")
    if owner:
        return owner
    if request.query.get("all") in ("1", "true"):
        return None
    raise SessionError("owner: the query must name the owner whose sessions to list (?owner=...; ?all=1 is the "
                       "operator's view of every session)", field="owner")


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
        owner = _text(await _body(request, {"owner"}), "owner")
        return web.json_response({"owner": owner, "sessions": self.m.renew(owner)})

    async def delete(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        deleted = await self.m.delete(sid, "deleted")
        if not deleted and sid not in self.m.ended:
            return _error(404, f"unknown {self.m.kind} {sid}", reason="unknown")
        return web.json_response({"session_id": sid, "deleted": deleted})

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.Response:
            try:
                if (sid := request.match_info.get("sid")) is not None:
                    self.m.authorize(sid, request.headers.get(KEY_HEADER, ""))
                return await handler(request)
            except SessionError as exc:
                return _error(exc.status, str(exc), **exc.extra)
            except SpecError as exc:
                return _error(400, str(exc), field=exc.field)
            except PathRefused as exc:
                return _error(400, str(exc), field="path", agent_input=True)
            except FileNotFoundError:
                return _error(404, f"path: {request.query.get('path', '')!r} does not exist in the session",
                              field="path", reason="no_such_file")
            except UnicodeError as exc:  # a lone surrogate somewhere in what the agent sent
                return _error(400, f"request: not valid UTF-8 ({str(exc)[:120]})", field="body", agent_input=True)
            except OSError as exc:
                if exc.errno not in _INPUT_ERRNOS:
                    raise
                return _error(400, f"{exc.strerror or exc} (the request's path or input)", field="path",
                              agent_input=True)
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
        return web.json_response({**session.info(), "session_key": session.key, "lease_s": self.m.cfg.lease_s})

    async def list(self, request: web.Request) -> web.Response:
        owner = _owner_query(request)
        return web.json_response({"sessions": [self.m.sessions[s].info() for s in self.m.ids(owner)]})

    async def exec(self, request: web.Request) -> web.Response:
        data = await _body(request, {"command", "timeout", "request_id"})
        command = _command(data)
        limit = data.get("timeout")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)):
            raise SessionError("timeout: must be a number of seconds", field="timeout")
        result = await self.m.exec(request.match_info["sid"], command,
                                   limit_s=None if limit is None else float(limit),
                                   key=_text(data, "request_id", required=False))
        return web.json_response(result.to_json())

    async def read(self, request: web.Request) -> web.Response:
        path = request.query.get("path", "")
        data, size = await self.m.read_file(request.match_info["sid"], path)
        return web.json_response({"path": path, "content": data.decode(errors="replace"), "size": size,
                                  "truncated": size > len(data)})

    async def write(self, request: web.Request) -> web.Response:
        data = await _body(request, {"path", "content"})
        path, content = _text(data, "path"), _text(data, "content", required=False)
        raw = content.encode()
        await self.m.write_file(request.match_info["sid"], path, raw)
        return web.json_response({"path": path, "size": len(raw)})

    async def finish(self, request: web.Request) -> web.Response:
        data = await _body(request, {"grade_unchanged"}) if request.can_read_body else {}
        grade = data.get("grade_unchanged", True)
        if not isinstance(grade, bool):
            raise SessionError("grade_unchanged: must be true or false", field="grade_unchanged")
        return web.json_response(await self.m.finish(request.match_info["sid"], grade_unchanged=grade))
