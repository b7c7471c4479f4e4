"""The weight transports (weightsync/: gRPC chunks, the TCP stream) against the rollout worker's own receiving code
(weightsync.receive and the spec a worker derives from its checkpoint), served by a real grpc.aio server: the
contract is checked end to end."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator

import pytest
import torch
from weight_workers import FakeWorker, serve

from fleet.config.policy import GrpcWeightSyncConfig
from fleet.contracts.weights import WorkerRef
from grpofleet.v1 import common_pb2
from services.runtime.errors import Unavailable
from weightsync import factory as worker_weights
from weightsync import tcp as tcp_stream
from weightsync.grpc import GrpcSender
from weightsync.tcp import TcpSender


async def test_grpc_push_delivers_every_tensor_in_small_slices(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    cfg.policy.weight_sync = GrpcWeightSyncConfig(chunk_mb=0.25)
    worker = FakeWorker(spec)
    server, address = await serve(worker)
    transport = GrpcSender(cfg.policy.weight_sync, cfg.services)
    try:
        [res] = await transport.push(snap, [WorkerRef("w0", address)])
    finally:
        await transport.close()
        await server.stop(None)
    assert res.ok and (res.version, res.epoch) == (3, 2)
    assert worker.tensors.keys() == snap.tensors.keys() == spec.keys()
    assert all(torch.equal(worker.tensors[k], snap.tensors[k]) for k in spec)
    assert 0 < worker.largest_slice <= 256 * 1024


async def test_tcp_push_streams_every_tensor_to_each_worker_once(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    workers = [FakeWorker(spec), FakeWorker(spec)]
    served = [await serve(w) for w in workers]
    transport = TcpSender(cfg.policy.weight_sync, cfg.services)
    try:
        results = await transport.push(snap, [WorkerRef(f"w{i}", a) for i, (_, a) in enumerate(served)])
        again = await transport.push(snap, [WorkerRef("w0", served[0][1])])  # the listener serves later pushes too
        assert transport._server is not None and not transport._server._offers  # every token withdrawn
    finally:
        await transport.close()
        for server, _ in served:
            await server.stop(None)
    assert [r.ok for r in results + again] == [True, True, True]
    for w in workers:
        assert (w.version, w.epoch) == (3, 2) and w.largest_slice == 0  # no byte came through gRPC
        assert w.tensors.keys() == snap.tensors.keys()
        assert all(torch.equal(w.tensors[k], snap.tensors[k]) for k in spec)
    assert workers[0].pushes == 2


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 here")
def test_stream_server_serves_workers_that_reach_it_over_ipv4_or_ipv6() -> None:
    server = tcp_stream.StreamServer()
    payload = bytes(range(256)) * 64
    try:
        for host, token in (("127.0.0.1", b"4" * 16), ("::1", b"6" * 16)):
            server.offer(token, [memoryview(payload)])
            into = bytearray(len(payload))
            assert tcp_stream.receive_into(host, server.port, token, [memoryview(into)], timeout_s=10) == len(payload)
            assert into == payload
    finally:
        server.close()


async def test_tcp_push_with_an_unknown_token_fails_and_names_the_stream(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    _, snap, spec = snapshot_and_spec
    server = tcp_stream.StreamServer("127.0.0.1")
    server.offer(b"k" * 16, [memoryview(b"x" * 8)])
    header = snap.header("tcp", stream_host="127.0.0.1", stream_port=server.port, stream_token=b"?" * 16)
    released: list[bool] = []

    class Staged(dict[str, torch.Tensor]):
        def release(self) -> None:
            released.append(True)

    def stage(metas):  # type: ignore[no-untyped-def]
        return Staged({n: torch.empty(shape, dtype=getattr(torch, d)) for n, shape, d in metas})

    async def one() -> AsyncIterator[common_pb2.WeightChunk]:
        yield common_pb2.WeightChunk(header=header)

    try:
        with pytest.raises(Unavailable, match=rf"weight stream 127\.0\.0\.1:{server.port} refused the push: .*token"):
            await worker_weights.receive(one(), spec, stage=stage)
    finally:
        server.close()
    assert released == [True]  # the staging memory went back


async def test_tcp_stream_cut_short_reports_how_far_it_got() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def sender() -> None:  # a sender that dies after 1000 of the 4096 bytes
        conn, _ = listener.accept()
        with conn:
            conn.recv(tcp_stream.HELLO.size)
            conn.sendall(bytes([tcp_stream.OK]) + b"z" * 1000)

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        with pytest.raises(tcp_stream.StreamError, match=rf"127\.0\.0\.1:{port} ended after 1000 of 4096 bytes"):
            tcp_stream.receive_into("127.0.0.1", port, b"t" * 16, [memoryview(bytearray(4096))], timeout_s=10)
    finally:
        thread.join()
        listener.close()


def test_grpc_peer_strings_give_the_host_to_reach_the_stream_at() -> None:
    from rollout.servicer import peer_host

    assert peer_host("ipv4:10.1.2.3:40000") == "10.1.2.3"
    assert peer_host("ipv6:[::1]:40000") == "::1"
    assert peer_host("ipv6:[fe80::1%eth0]:5") == "fe80::1%eth0"
    assert peer_host("unix:/tmp/sock") == "127.0.0.1"


async def test_cancelled_tcp_receive_gives_staging_back_only_after_the_reader_stopped(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    _, snap, spec = snapshot_and_spec
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sender_closed = threading.Event()

    def sender() -> None:  # sends a little, stalls, then goes away
        conn, _ = listener.accept()
        with conn:
            conn.recv(tcp_stream.HELLO.size)
            conn.sendall(bytes([tcp_stream.OK]) + b"\0" * 1000)
            time.sleep(0.5)
            sender_closed.set()  # before the close ends the reader: else the release can win the race to it

    thread = threading.Thread(target=sender)
    thread.start()
    released_after_close: list[bool] = []

    class Staged(dict[str, torch.Tensor]):
        def release(self) -> None:
            released_after_close.append(sender_closed.is_set())

    def stage(metas):  # type: ignore[no-untyped-def]
        return Staged({n: torch.empty(shape, dtype=getattr(torch, d)) for n, shape, d in metas})

    async def one() -> AsyncIterator[common_pb2.WeightChunk]:
        yield common_pb2.WeightChunk(header=snap.header("tcp", stream_host="127.0.0.1", stream_port=port,
                                                        stream_token=b"c" * 16))

    task = asyncio.create_task(worker_weights.receive(one(), spec, stage=stage))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    thread.join()
    listener.close()
    assert released_after_close == [True]
