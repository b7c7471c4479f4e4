"""transport=tcp (the default, the CPU fast path): the tensor bytes over one plain TCP stream per worker.

The gRPC `PushWeights` call carries the contract (header: version, epoch, names/shapes/dtypes) plus where the bytes
are served and a one-time token. The worker opens a connection there, presents the token and the byte count it
expects, and reads the bytes with `recv_into` straight into the buffers its engine staged for them. Both ends move
the bytes with one kernel copy each (`sendall` from the trainer's snapshot, `recv_into` the staging memory):
streaming them inside gRPC messages instead copies every slice several times in Python and protobuf, which held a
push to 0.1-0.35 GB/s against 0.7-2 GB/s for a plain socket on the same machine (docs/performance.md).

Wire format (network byte order):
    receiver -> sender:  token (16 bytes) | expected bytes (u64)
    sender -> receiver:  status (u8: 0 ok, 1 unknown token, 2 size mismatch) | then, on 0, the tensors' raw bytes
                         in header order, unpadded
Blocking sockets on threads: a `sendall` / `recv_into` of a large buffer releases the GIL for the whole syscall,
whereas an asyncio transport would copy whatever the kernel did not take at once into its own buffer. Socket
buffer sizes are left to the kernel: setting SO_RCVBUF turns off its autotuning, and a fixed 4 MiB measured ~10%
slower on loopback here.

`TcpSender` (trainer) serves a snapshot's bytes from one `StreamServer` for the life of the transport, under a fresh
token per worker and push; `TcpReceiver` (worker) reads them with `receive_into`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import torch

from fleet.config.infra import ServicesConfig
from fleet.config.policy import NcclWeightSyncConfig, TcpWeightSyncConfig
from fleet.contracts.weights import WorkerRef
from grpofleet.v1 import common_pb2
from services.runtime.errors import InvalidArgument, Unavailable
from weightsync.base import PushResult, StagedReceiver, WeightSender, header_only
from weightsync.header import TensorMeta, WeightSnapshot, byte_view

log = logging.getLogger(__name__)

TOKEN_BYTES = 16
HELLO = struct.Struct("!16sQ")
OK, UNKNOWN_TOKEN, SIZE_MISMATCH = 0, 1, 2
_STATUS_TEXT = {UNKNOWN_TOKEN: "the sender has no push for this token (expired, or already served)",
                SIZE_MISMATCH: "the sender holds a different number of bytes for this token"}
_RECV_SLICE = 64 << 20  # one recv_into asks for at most this much; the kernel returns what it has


class StreamError(ConnectionError):
    """The byte stream of a push failed; the message says where and after how many bytes."""


@dataclass
class _Offer:
    buffers: Sequence[memoryview]
    nbytes: int


class StreamServer:
    """Serves offered byte sequences to whoever presents their token (trainer side). One listening socket for the
    life of the transport; one thread per connection, so several workers are fed concurrently."""

    def __init__(self, host: str = "", port: int = 0, *, timeout_s: float = 600.0) -> None:
        if host in ("", "0.0.0.0", "::") and socket.has_dualstack_ipv6():
            # Workers connect to whatever address they saw the push come from, IPv4 or IPv6 (gRPC may well reach
            # "localhost" over ::1): listen on both.
            self._listener = socket.create_server(("::", port), family=socket.AF_INET6, backlog=64,
                                                  dualstack_ipv6=True)
        else:
            self._listener = socket.create_server((host or "0.0.0.0", port), backlog=64)
        self.port: int = self._listener.getsockname()[1]
        self.timeout_s = timeout_s
        self._offers: dict[bytes, _Offer] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._accepter = threading.Thread(target=self._accept_loop, name="weight-stream-accept", daemon=True)
        self._accepter.start()

    def offer(self, token: bytes, buffers: Sequence[memoryview]) -> None:
        """Serve `buffers` (each a flat byte view, kept alive by the caller until `withdraw`) to one receiver."""
        if len(token) != TOKEN_BYTES:
            raise ValueError(f"a stream token has {TOKEN_BYTES} bytes, got {len(token)}")
        with self._lock:
            self._offers[token] = _Offer(list(buffers), sum(b.nbytes for b in buffers))

    def withdraw(self, token: bytes) -> None:
        with self._lock:
            self._offers.pop(token, None)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn, peer), name="weight-stream-send", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        with conn:
            try:
                conn.settimeout(self.timeout_s)
                token, expected = HELLO.unpack(_recv_exact(conn, HELLO.size))
                with self._lock:
                    # One receiver per token: a second connection with it gets "unknown".
                    offer = self._offers.pop(token, None)
                if offer is None:
                    conn.sendall(bytes([UNKNOWN_TOKEN]))
                    return
                if offer.nbytes != expected:
                    conn.sendall(bytes([SIZE_MISMATCH]))
                    return
                conn.sendall(bytes([OK]))
                for buf in offer.buffers:
                    conn.sendall(buf)
            except OSError as exc:
                log.warning("weight stream to %s failed: %s", peer, exc)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            self._offers.clear()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise StreamError(f"connection closed after {got} of {n} bytes of the handshake")
        got += k
    return bytes(out)


def receive_into(host: str, port: int, token: bytes, buffers: Sequence[memoryview], *,
                 timeout_s: float = 600.0, on_tensor: Callable[[int], None] | None = None) -> int:
    """Fill `buffers` (writable flat byte views, in header order) from the sender at host:port (worker side; blocks,
    run it on a thread), calling `on_tensor(i)` once buffer i is full. Returns the bytes received; raises StreamError
    naming the sender and how far it got."""
    where = f"weight stream {host}:{port}"
    expected = sum(b.nbytes for b in buffers)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise StreamError(f"{where}: cannot connect: {exc}") from exc
    with sock:
        got = 0
        try:
            sock.sendall(HELLO.pack(token, expected))
            status = _recv_exact(sock, 1)[0]
            if status != OK:
                raise StreamError(f"{where} refused the push: {_STATUS_TEXT.get(status, f'status {status}')}")
            for i, buf in enumerate(buffers):
                filled, n = 0, buf.nbytes
                while filled < n:
                    k = sock.recv_into(buf[filled:], min(n - filled, _RECV_SLICE))
                    if k == 0:
                        raise StreamError(f"{where} ended after {got} of {expected} bytes")
                    filled += k
                    got += k
                if on_tensor is not None:
                    on_tensor(i)
        except OSError as exc:
            if isinstance(exc, StreamError):
                raise
            raise StreamError(f"{where} failed after {got} of {expected} bytes: {exc}") from exc
    return got


class TcpSender(WeightSender):
    """Header over gRPC, bytes over a plain TCP stream per worker, served from the snapshot without a copy. The
    listening socket lives as long as the transport; every push gets a fresh token per worker, withdrawn when the
    call has answered (a worker that never came for its bytes cannot collect them later). Also the late-joiner
    transport of transport=nccl, whose config carries the same stream keys."""

    sync: TcpWeightSyncConfig | NcclWeightSyncConfig

    def __init__(self, sync: TcpWeightSyncConfig | NcclWeightSyncConfig, services: ServicesConfig) -> None:
        super().__init__(sync, services)
        self._server: StreamServer | None = None

    def _serve(self) -> StreamServer:
        if self._server is None:
            self._server = StreamServer("", self.sync.stream_port, timeout_s=self.timeout)
            log.info("serving weight bytes on port %d", self._server.port)
        return self._server

    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        server = self._serve()
        views = [byte_view(t) for t in snapshot.tensors.values()]
        host = self.sync.stream_host or ""

        def header(token: bytes) -> AsyncIterator[common_pb2.WeightChunk]:
            return header_only(snapshot.header("tcp", stream_host=host, stream_port=server.port, stream_token=token))

        tokens = [os.urandom(TOKEN_BYTES) for _ in workers]
        for token in tokens:
            server.offer(token, views)
        try:
            n = snapshot.total_bytes
            return list(await asyncio.gather(*(self._call(w, header(t), n)
                                               for w, t in zip(workers, tokens, strict=True))))
        finally:
            for token in tokens:
                server.withdraw(token)

    async def close(self) -> None:
        await super().close()
        if self._server is not None:
            self._server.close()
            self._server = None


class TcpReceiver(StagedReceiver):
    """Reads the bytes from the stream the header names (an empty host: the address the call came from)."""

    def __init__(self, header: common_pb2.WeightSetHeader, *, peer_host: str, timeout_s: float) -> None:
        super().__init__(header, peer_host=peer_host, timeout_s=timeout_s)
        if not 0 < header.stream_port < 65536 or len(header.stream_token) != TOKEN_BYTES:
            raise InvalidArgument(f"tcp weight push needs stream_port in 1..65535 and a {TOKEN_BYTES}-byte "
                                  f"stream_token, got port {header.stream_port} and {len(header.stream_token)} bytes")

    async def fill(self, rest: AsyncIterator[object], metas: list[TensorMeta], views: list[memoryview],
                   staged: dict[str, torch.Tensor]) -> None:
        h = self.header
        reading = asyncio.ensure_future(asyncio.to_thread(
            receive_into, h.stream_host or self.peer_host, h.stream_port, h.stream_token, views,
            timeout_s=self.timeout_s, on_tensor=getattr(staged, "tensor_received", None)))
        try:
            await asyncio.shield(reading)
        except asyncio.CancelledError:
            # The call was cancelled, but the thread still writes into the staging memory: it must end (the
            # sender finishes or the connection fails) before that memory goes back to the engine.
            await asyncio.gather(reading, return_exceptions=True)
            raise
        except StreamError as exc:
            raise Unavailable(str(exc)) from exc
