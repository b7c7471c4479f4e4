"""`grpo-fleet serve sandbox`: the seed-compatible HTTP API in front of an `Executor`.

  POST   /task/submit          TaskSpec JSON -> {"task_id"}            400 names the bad field, 503 when full/draining
  GET    /task/{id}/result     202 {"status": pending|running} while it runs, then 200 {task_id, **Verdict}
                               (`?wait=S` long-polls up to S seconds, at most 60)
  DELETE /task/{id}            cancels it (the sandbox is killed) and forgets it
  GET    /healthz              200 when ready, 503 when the sandbox cannot start or the server is draining
  POST   /image/prefetch       {"image"} -> 202: start pulling a task's image now (best effort; `docs/swe-datasets.md`)

Everything but /healthz needs `Authorization: Bearer TOKEN` when a token is set (`sandbox.auth_token` or
GRPO_FLEET_SANDBOX_TOKEN). A verdict is always a 200, even `infra_error`: 5xx means this server itself failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TOKEN_ENV, SpecError, TaskSpec, Verdict, spec_from_json
from fleet.entry import service_main
from services.sandbox.computer.routes import ComputerRoutes
from services.sandbox.executor import Executor
from services.sandbox.sessions.http import SessionRoutes
from services.sandbox.sessions.manager import SessionManager

if TYPE_CHECKING:
    from fleet.config import MasterConfig

log = logging.getLogger(__name__)
_MAX_WAIT_S = 60.0
_MAX_BODY = 64 << 20


@dataclass
class TaskRecord:
    id: str
    spec: TaskSpec
    state: str = "pending"
    """pending -> running -> done, or cancelled (server shutting down)."""
    verdict: Verdict | None = None
    finished: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


class SandboxServer:
    """The aiohttp app, its task table and its lifecycle: `port = await start()`, then `await stop(grace_s)`."""

    def __init__(self, cfg: SandboxConfig, host: str = "127.0.0.1", port: int = 0,
                 executor: Executor | None = None) -> None:
        self.cfg, self.host, self.port = cfg, host, port
        self.executor = executor or Executor(cfg)
        self.sessions = SessionManager(self.executor, cfg.sessions)
        self.token = cfg.auth_token or os.environ.get(TOKEN_ENV) or None
        self.tasks: dict[str, TaskRecord] = {}
        self.draining = False
        self.failed: asyncio.Future[None] | None = None
        self._runner: web.AppRunner | None = None
        self._janitor: asyncio.Task[None] | None = None

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY, middlewares=[self._errors, self._auth])
        app.router.add_post("/task/submit", self.submit)
        app.router.add_get("/task/{task_id}/result", self.result)
        app.router.add_delete("/task/{task_id}", self.delete)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_post("/image/prefetch", self.prefetch)
        SessionRoutes(self.sessions, lambda: self.draining).add_to(app)
        ComputerRoutes.install(app, self.sessions, lambda: self.draining)
        return app

    async def start(self) -> int:
        """Start the executor (raises if the sandbox cannot run here) and listen; returns the bound port."""
        await self.executor.start()
        await self.sessions.start()
        self.failed = asyncio.get_running_loop().create_future()
        self._runner = web.AppRunner(self.make_app(), access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        # reuse_port: `grpo-fleet up` keeps the port it gave the sandbox bound until the sandbox listens
        # (launch/ports.py); only a socket with SO_REUSEPORT can bind it meanwhile.
        site = web.TCPSite(self._runner, self.host, self.port, reuse_port=True)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the real port when 0 was asked for
        self._janitor = asyncio.create_task(self._expire_loop(), name="sandbox-result-janitor")
        self._janitor.add_done_callback(self._supervise)
        log.info("listening on %s:%d", self.host, self.port)
        return self.port

    def _supervise(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self.failed is None or self.failed.done():
            return
        exc = task.exception()
        log.error("background task %s died: %r", task.get_name(), exc)
        self.failed.set_exception(exc or RuntimeError(f"{task.get_name()} exited"))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Refuse new tasks, let running ones finish for `grace_s` (results stay fetchable), then close."""
        self.draining = True
        running = [r.task for r in self.tasks.values() if r.task is not None and not r.task.done()]
        if running:
            log.info("draining: %d task(s), up to %.1f s", len(running), grace_s)
            _, late = await asyncio.wait(running, timeout=grace_s) if grace_s > 0 else (set(), set(running))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._janitor is not None:
            self._janitor.cancel()
            await asyncio.gather(self._janitor, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.sessions.close()
        await self.executor.close()
        log.info("stopped")

    async def _expire_loop(self) -> None:
        interval = min(self.cfg.result_ttl_s / 4, 30.0)
        while True:
            await asyncio.sleep(interval)
            self.expire(time.monotonic())

    def expire(self, now: float) -> int:
        """Forget results finished more than `result_ttl_s` ago; returns how many went."""
        old = [k for k, r in self.tasks.items() if r.state in ("done", "cancelled")
               and now - r.finished > self.cfg.result_ttl_s]
        for key in old:
            del self.tasks[key]
        return len(old)

    # -- middlewares ---------------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except web.HTTPException as exc:  # unknown route, wrong method, body too large
            return _error(exc.status, exc.reason)
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token is not None and request.path != "/healthz":
            header = request.headers.get("Authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                why = "missing" if not header else "wrong"
                return web.json_response(
                    {"error": f"unauthorized: {why} bearer token (send 'Authorization: Bearer <sandbox.auth_token>')"},
                    status=401, headers={"WWW-Authenticate": "Bearer"})
        response: web.StreamResponse = await handler(request)
        return response

    # -- handlers ------------------------------------------------------------------------------------------------
    async def submit(self, request: web.Request) -> web.Response:
        if self.draining:
            return _error(503, "executor is shutting down; submit elsewhere", draining=True)
        active = sum(r.state in ("pending", "running") for r in self.tasks.values())
        if active >= self.cfg.max_pending:
            return _error(503, f"executor is full ({active} tasks pending, sandbox.max_pending={self.cfg.max_pending})")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body: not valid JSON", field="body")
        except RecursionError:  # json nests by recursion: a deeply nested body is bad input, not a server failure
            return _error(400, "body: JSON nested too deeply", field="body")
        try:
            spec = spec_from_json(body, max_timeout=self.cfg.max_timeout_s)
        except SpecError as exc:
            return _error(400, str(exc), field=exc.field)
        record = TaskRecord(id=uuid.uuid4().hex, spec=spec)
        self.tasks[record.id] = record
        record.task = asyncio.create_task(self._run(record), name=f"sandbox-task-{record.id}")
        return web.json_response({"task_id": record.id, "status": "pending"})

    async def _run(self, record: TaskRecord) -> None:
        def started() -> None:
            record.state = "running"

        try:
            record.verdict = await self.executor.run(record.spec, on_start=started)
            record.state = "done"
        except asyncio.CancelledError:
            record.state = "cancelled"
            raise
        except Exception as exc:  # Executor.run turns failures into verdicts; this is a last line of defence
            log.exception("task %s failed", record.id)
            record.verdict = Verdict(status="infra_error", error=f"executor error: {type(exc).__name__}: {exc}")
            record.state = "done"
        finally:
            record.finished = time.monotonic()
            record.done.set()

    def _record(self, request: web.Request) -> TaskRecord | web.Response:
        record = self.tasks.get(request.match_info["task_id"])
        if record is None:
            return _error(404, f"unknown task id (results expire after {self.cfg.result_ttl_s:g} s)")
        return record

    async def result(self, request: web.Request) -> web.Response:
        record = self._record(request)
        if isinstance(record, web.Response):
            return record
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return _error(400, "wait: must be a number of seconds", field="wait")
        if not 0 <= wait <= _MAX_WAIT_S:
            return _error(400, f"wait: must be in [0, {_MAX_WAIT_S:g}] seconds", field="wait")
        if wait > 0 and not record.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(record.done.wait(), wait)
        if record.state == "cancelled":
            return _error(503, "task cancelled: the executor is shutting down; submit it again elsewhere",
                          draining=True)
        if record.verdict is None:
            return web.json_response({"task_id": record.id, "status": record.state}, status=202)
        return web.json_response({"task_id": record.id, **record.verdict.to_json()})

    async def delete(self, request: web.Request) -> web.Response:
        record = self._record(request)
        if isinstance(record, web.Response):
            return record
        del self.tasks[record.id]
        state = record.state
        if record.task is not None and not record.task.done():
            record.task.cancel()
            await asyncio.gather(record.task, return_exceptions=True)
        return web.json_response({"task_id": record.id, "deleted": True, "state": state})

    async def prefetch(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body: not valid JSON", field="body")
        image = body.get("image") if isinstance(body, dict) else None
        if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
            return _error(400, "image: must be an image reference like repo/name:tag", field="image")
        images = self.executor.images
        if images is None:
            return _error(503, f"no image runtime: {self.executor.image_error or 'sandbox.runtime is bwrap'}")
        try:
            ref = images.ref(image)
        except ValueError as exc:
            return _error(400, f"image: {exc}", field="image")
        images.prefetch(image)
        return web.json_response({"image": ref, "prefetching": True}, status=202)

    async def healthz(self, request: web.Request) -> web.Response:
        health = {**self.executor.health(), **self.sessions.health(), "draining": self.draining,
                  "tasks": sum(r.state in ("pending", "running") for r in self.tasks.values())}
        ok = health["status"] == "ok" and not self.draining
        return web.json_response(health, status=200 if ok else 503)


async def serve(cfg: SandboxConfig, host: str, port: int, grace_s: float) -> int:
    """Run until SIGTERM/SIGINT (0) or until a background task dies (1)."""
    server = SandboxServer(cfg, host, port)
    try:
        await server.start()
    except Exception as exc:
        log.error("sandbox executor cannot start: %s", exc)
        await server.executor.close()
        return 1
    assert server.failed is not None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stopper, server.failed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop(grace_s)
    return 1 if server.failed.done() and server.failed.exception() is not None else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpo-fleet serve sandbox [--config FILE] [overrides...]`."""
    return service_main("grpo-fleet serve sandbox", argv, serve_config)


def serve_config(cfg: MasterConfig) -> int:
    endpoint = cfg.services.sandbox
    return asyncio.run(serve(cfg.sandbox, endpoint.host, endpoint.port, cfg.services.grace_s))
