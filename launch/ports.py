"""The loopback ports of a local fleet, held by the launcher until the services that were given them listen.

A port picked free and let go before its service binds it is free for anyone in between: the ephemeral range is
shared with every outgoing connection on the host, and a rollout worker once died with `Address already in use`
after its vLLM engine took 30 s to start (docs/performance.md). So `HeldPorts` keeps each picked port bound by a
socket of its own, which makes the kernel skip it for ephemeral ports and any plain `bind()` of it fail, yet lets the
service bind it too: both sockets set SO_REUSEPORT (gRPC servers do by default, `GrpcService` asks for it, the
sandbox's TCPSite passes `reuse_port=True`). The held socket only binds, never listens, so it takes no share of the
service's connections. `release_when_listening` lets each go once something accepts connections on its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import TracebackType

from fleet.config.infra import RolloutConfig
from launch.topology import Ports

log = logging.getLogger(__name__)


class HeldPorts:
    """`n` distinct free ports on `host`, each kept bound (SO_REUSEPORT, never listening) until `release(port)` or
    `close()`. Every socket is bound before any is let go, so the ports are all different."""

    def __init__(self, n: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self._socks: dict[int, socket.socket] = {}
        try:
            for _ in range(n):
                sock = socket.socket()
                # SO_REUSEPORT and never SO_REUSEADDR: with SO_REUSEADDR on both, any other socket that sets it could
                # bind the port while neither listens.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((host, 0))
                self._socks[int(sock.getsockname()[1])] = sock
        except BaseException:
            self.close()
            raise
        self.ports: list[int] = list(self._socks)
        """Every picked port, in pick order (released ones included)."""

    @property
    def held(self) -> list[int]:
        """The ports still held."""
        return list(self._socks)

    def release(self, port: int) -> None:
        """Let `port` go (its service has bound it, or will not); a port not held is ignored."""
        sock = self._socks.pop(port, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for port in self.held:
            self.release(port)

    def __enter__(self) -> HeldPorts:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def release_when_listening(self, interval_s: float = 0.5) -> None:
        """Release each port once a connection to it is accepted, i.e. its service listens there (only sockets of
        this user that set SO_REUSEPORT can bind a held port); returns when none is held. A port whose service never
        listens stays held until `close()`."""
        while self._socks:
            for port in self.held:
                if await listening(self.host, port):
                    log.debug("port %d: its service listens; released", port)
                    self.release(port)
            if self._socks:
                await asyncio.sleep(interval_s)


async def listening(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port (a held socket that only binds refuses them)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct free ports, let go at once: for a process that binds without SO_REUSEPORT (torch's TCPStore for
    an NCCL rendezvous), which a held port would keep out. The port is free for anyone until it is bound."""
    with HeldPorts(n, host) as held:
        return held.ports


def pick_ports(rollout: RolloutConfig) -> tuple[Ports, HeldPorts]:
    """Free loopback ports for every service of a local fleet, all different (each rollout worker its own), and the
    holder that keeps them bound until the caller releases them (`release_when_listening`, `close()`)."""
    held = HeldPorts(3 + rollout.num_workers)
    replay_buffer, sandbox, trainer, *rollout_ports = held.ports
    return Ports(replay_buffer=replay_buffer, sandbox=sandbox, trainer=trainer, rollout=rollout_ports), held
