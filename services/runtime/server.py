"""`GrpcService`: a grpc.aio server with health, reflection, auth, error mapping and a graceful stop.

Lifecycle: `start()` binds (port 0 picks a free port) and serves with health NOT_SERVING; the owner calls
`set_serving(True)` once ready; on SIGTERM/SIGINT `run_service` flips health to NOT_SERVING, stops accepting, lets
in-flight RPCs finish within `grace_s`, runs the owner's shutdown hook and returns 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fleet.config.infra import Endpoint, ServicesConfig
from services.runtime.interceptors import AuthInterceptor, ErrorInterceptor

log = logging.getLogger(__name__)

TOKEN_ENV = "GRPO_FLEET_TOKEN"


def auth_token(cfg: ServicesConfig) -> str | None:
    """The bearer token: config first, then the environment (so it need not sit in a YAML file)."""
    return cfg.auth_token or os.environ.get(TOKEN_ENV) or None


def channel_options(cfg: ServicesConfig) -> list[tuple[str, Any]]:
    size = cfg.max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.keepalive_time_ms", int(cfg.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class GrpcService:
    """One gRPC server process-part. Servicers are added before `start()`."""

    def __init__(self, name: str, endpoint: Endpoint, services: ServicesConfig) -> None:
        self.name = name
        self.endpoint = endpoint
        self.services = services
        interceptors: list[aio.ServerInterceptor] = []
        token = auth_token(services)
        if token:
            interceptors.append(AuthInterceptor(token))
        interceptors.append(ErrorInterceptor())
        # SO_REUSEPORT (gRPC's default, asked for here so that nothing turns it off unnoticed): `grpo-fleet up` keeps
        # the port it gave this service bound until the service listens (launch/ports.py), and only a socket that
        # sets it too can bind the port meanwhile.
        options = [*channel_options(services), ("grpc.so_reuseport", 1)]
        self.server = aio.server(interceptors=interceptors, options=options)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._service_names: list[str] = [health.SERVICE_NAME, reflection.SERVICE_NAME]
        self.port: int = 0

    def add(self, register: Callable[[Any, aio.Server], None], servicer: Any, full_name: str) -> None:
        """Add a servicer: `register` is the generated `add_XServicer_to_server`, `full_name` e.g.
        `grpofleet.v1.ReplayBuffer`."""
        register(servicer, self.server)
        self._service_names.append(full_name)

    @property
    def address(self) -> str:
        return f"{self.endpoint.host}:{self.port}"

    def bind(self) -> int:
        """Bind the listen address (port 0 picks a free port) before start, so that a service can advertise its
        address to others before it serves."""
        if not self.port:
            self.port = self.server.add_insecure_port(f"{self.endpoint.host}:{self.endpoint.port}")
            if self.port == 0:
                raise OSError(f"services.{self.name}: cannot bind {self.endpoint.host}:{self.endpoint.port}")
        return self.port

    async def start(self) -> int:
        self.bind()
        reflection.enable_server_reflection(self._service_names, self.server)
        await self.server.start()
        await self.set_serving(False)
        log.info("%s listening on %s", self.name, self.address)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._service_names[2:]]:
            await self.health.set(name, status)

    async def stop(self, grace: float | None = None) -> None:
        await self.set_serving(False)
        await self.server.stop(self.services.grace_s if grace is None else grace)


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def supervise(tasks: Iterable[asyncio.Task[Any]], stop: asyncio.Event) -> BaseException | None:
    """Wait until `stop` is set or a background task ends; a task that ends on its own is a failure (background
    tasks run until cancelled), returned so the service exits loudly instead of hanging."""
    tasks = list(tasks)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    for task in done:
        if task is stopper:
            continue
        exc = task.exception() if not task.cancelled() else None
        log.error("background task %s ended unexpectedly: %r", task.get_name(), exc)
        return exc or RuntimeError(f"background task {task.get_name()} ended")
    return None


async def run_service(
    service: GrpcService,
    *,
    background: Iterable[Callable[[], Coroutine[Any, Any, Any]]] = (),
    on_stop: Callable[[], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Start `service`, mark it SERVING, run its background coroutines supervised, and stop gracefully on
    SIGTERM/SIGINT (or when `stop` is set). Returns the process exit code."""
    stop = stop or asyncio.Event()
    install_stop_signals(stop)
    await service.start()
    tasks = [asyncio.create_task(fn(), name=getattr(fn, "__name__", "task")) for fn in background]
    await service.set_serving(True)
    failure: BaseException | None = None
    try:
        failure = await supervise(tasks, stop)
    finally:
        log.info("%s stopping (grace %.1fs)", service.name, service.services.grace_s)
        await service.set_serving(False)
        await service.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if on_stop is not None:
            await on_stop()
        log.info("%s stopped", service.name)
    return 1 if failure is not None else 0


def run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run an async entry point on uvloop."""
    import uvloop

    return uvloop.run(main())
