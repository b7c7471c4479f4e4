"""`grpo-fleet up` keeps each port it picked bound until the service it gave the port to listens there: nothing
else can bind the port in between, yet the real services (a `GrpcService`, the sandbox's HTTP server) bind it, a
second time too (a restart), and answer; released, the launcher holds nothing."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
from pathlib import Path

import pytest

from fleet.config.infra import Endpoint, SandboxConfig, ServicesConfig
from launch.ports import HeldPorts, listening
from launch.supervisor import probe
from services.runtime.server import GrpcService
from services.sandbox.server import SandboxServer


def _plain_bind(port: int) -> int:
    """errno of a plain bind of 127.0.0.1:port (SO_REUSEADDR set, as most servers do; no SO_REUSEPORT), 0 if bound."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno or -1
    return 0


async def _serving_grpc(port: int) -> GrpcService:
    service = GrpcService("held", Endpoint(port=port), ServicesConfig())
    await service.start()
    await service.set_serving(True)
    return service


def test_a_held_port_refuses_a_plain_bind_until_released() -> None:
    with HeldPorts(2) as held:
        first, second = held.ports
        assert first != second
        assert _plain_bind(first) == _plain_bind(second) == errno.EADDRINUSE
        held.release(first)
        assert held.held == [second]
        assert _plain_bind(first) == 0
        assert _plain_bind(second) == errno.EADDRINUSE
    assert held.held == []
    assert _plain_bind(second) == 0


async def test_a_grpc_service_serves_a_held_port_and_binds_it_again_after_a_restart() -> None:
    with HeldPorts(1) as held:
        (port,) = held.ports
        assert not await listening("127.0.0.1", port)  # the held socket binds, it never listens
        first = await _serving_grpc(port)
        try:
            assert await probe(f"127.0.0.1:{port}")
        finally:
            await first.stop(0)
        # The supervisor restarts a service that died before the launcher let its port go.
        assert held.held == [port]
        again = await _serving_grpc(port)
        try:
            assert await probe(f"127.0.0.1:{port}")
            assert _plain_bind(port) == errno.EADDRINUSE
            await asyncio.wait_for(held.release_when_listening(interval_s=0.05), 10)
            assert held.held == []
            assert await probe(f"127.0.0.1:{port}")  # the service's own socket keeps it
        finally:
            await again.stop(0)


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="the sandbox's executor needs bubblewrap and root")
async def test_the_sandbox_serves_a_held_port(tmp_path: Path) -> None:
    with HeldPorts(1) as held:
        (port,) = held.ports
        server = SandboxServer(SandboxConfig(pool_size=1, work_root=str(tmp_path / "work"), uid_base=64000),
                               port=port)
        await server.start()
        try:
            assert server.port == port
            assert await probe(f"http://127.0.0.1:{port}/healthz")
            await asyncio.wait_for(held.release_when_listening(interval_s=0.05), 10)
            assert held.held == []
            assert await probe(f"http://127.0.0.1:{port}/healthz")
        finally:
            await server.stop(0)


async def test_a_port_whose_service_never_listens_stays_held() -> None:
    with HeldPorts(2) as held:
        quiet, served = held.ports
        service = await _serving_grpc(served)
        try:
            releaser = asyncio.create_task(held.release_when_listening(interval_s=0.05))
            await asyncio.sleep(1.0)
            assert held.held == [quiet]
            assert not releaser.done()
            releaser.cancel()
        finally:
            await service.stop(0)
        assert _plain_bind(quiet) == errno.EADDRINUSE
