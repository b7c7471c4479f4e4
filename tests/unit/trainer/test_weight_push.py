"""Weight pushes against the rollout worker's own receiving code (weightsync.receive and the spec a worker
derives from its checkpoint), served by a real grpc.aio server: the contract is checked end to end."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import torch
from grpc import aio

from fleet.config import MasterConfig
from fleet.config.policy import GrpcWeightSyncConfig
from fleet.contracts.weights import WeightsId, WorkerRef
from grpofleet.v1 import common_pb2, rollout_worker_pb2, rollout_worker_pb2_grpc
from rollout.engine.base import checkpoint_weight_spec
from services.runtime.errors import Unavailable
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy
from trainer.weights import WeightPusher, gather_snapshot
from weightsync import factory as worker_weights
from weightsync import tcp as tcp_stream
from weightsync.grpc import GrpcSender
from weightsync.tcp import TcpSender


@dataclass
class FakeWorker(rollout_worker_pb2_grpc.RolloutWorkerServicer):
    spec: dict[str, tuple[tuple[int, ...], str]]
    version: int = -1
    epoch: int = -1
    pushes: int = 0
    largest_slice: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    heartbeat_ms: int = 0

    async def PushWeights(self, request_iterator: AsyncIterator[common_pb2.WeightChunk],  # noqa: N802
                          context: aio.ServicerContext) -> rollout_worker_pb2.PushWeightsResponse:
        async def spy() -> AsyncIterator[common_pb2.WeightChunk]:
            async for msg in request_iterator:
                if msg.WhichOneof("payload") == "slice":
                    self.largest_slice = max(self.largest_slice, len(msg.slice.data))
                yield msg

        ws = await worker_weights.receive(spy(), self.spec)
        self.version, self.epoch, self.tensors = ws.version, ws.epoch, ws.tensors
        self.pushes += 1
        self.heartbeat_ms = int(time.time() * 1000) + 1  # the worker heartbeats right after loading
        return rollout_worker_pb2.PushWeightsResponse(version=ws.version, epoch=ws.epoch, bytes=ws.nbytes)


async def _serve(worker: FakeWorker) -> tuple[aio.Server, str]:
    server = aio.server()
    rollout_worker_pb2_grpc.add_RolloutWorkerServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def snapshot_and_spec(make_cfg):  # type: ignore[no-untyped-def]
    cfg: MasterConfig = make_cfg()
    policy = build_policy(cfg.policy, cfg.policy.model_name, Dist(DistEnv(0, 1, 0), torch.device("cpu"), 60))
    snap = gather_snapshot(policy, torch.float32, keep=True, weights=WeightsId(2, 3))
    assert snap is not None
    spec, _ = checkpoint_weight_spec(cfg.policy.model_name, "float32")
    return cfg, snap, {k: (v.shape, v.dtype) for k, v in spec.items()}


async def test_grpc_push_delivers_every_tensor_in_small_slices(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    cfg.policy.weight_sync = GrpcWeightSyncConfig(chunk_mb=0.25)
    worker = FakeWorker(spec)
    server, address = await _serve(worker)
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


async def test_pusher_syncs_late_joiners_and_reports_dead_workers(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    early, late = FakeWorker(spec), FakeWorker(spec)
    (s1, a1), (s2, a2) = await _serve(early), await _serve(late)
    registry = {"early": (early, a1)}
    dead: list[WorkerRef] = []  # registered, then gone without a trace (nothing listens on its port)

    async def list_workers() -> list[WorkerRef]:
        live = [WorkerRef(wid, addr, w.version, w.epoch, w.heartbeat_ms) for wid, (w, addr) in registry.items()]
        return live + dead

    transport = GrpcSender(GrpcWeightSyncConfig(), cfg.services)
    pusher = WeightPusher(cfg.policy.weight_sync.join_poll_s, list_workers, transport, transport)
    try:
        results = await pusher.publish(snap)
        assert [r.ok for r in results] == [True] and early.version == 3
        assert await pusher.sync_behind() == []  # nobody behind: no push
        registry["late"] = (late, a2)
        dead.append(WorkerRef("dead", "127.0.0.1:1"))
        synced = await pusher.sync_behind()
        assert {r.worker_id: r.ok for r in synced} == {"late": True, "dead": False}
        assert (late.version, late.epoch, early.pushes, late.pushes) == (3, 2, 1, 1)
        assert "UNAVAILABLE" in pusher.results["dead"].error
    finally:
        await transport.close()
        await s1.stop(None)
        await s2.stop(None)


async def test_tcp_push_streams_every_tensor_to_each_worker_once(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    workers = [FakeWorker(spec), FakeWorker(spec)]
    served = [await _serve(w) for w in workers]
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


def test_snapshot_is_a_copy_not_a_view_of_the_parameters(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, _ = snapshot_and_spec
    policy = build_policy(cfg.policy, cfg.policy.model_name, Dist(DistEnv(0, 1, 0), torch.device("cpu"), 60))
    s = gather_snapshot(policy, torch.float32, keep=True, weights=WeightsId(0, 0))
    assert s is not None
    before = s.tensors["model.norm.weight"].clone()
    with torch.no_grad():
        policy.lm.model.norm.weight.add_(1.0)  # an optimizer step while the push streams
    assert torch.equal(s.tensors["model.norm.weight"], before)
    assert "lm_head.weight" not in s.tensors  # tied: the checkpoint (and the worker's spec) has no such tensor


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


async def test_pusher_backs_off_a_gone_worker_and_forgets_it_once_the_registry_does(  # type: ignore[no-untyped-def]
        snapshot_and_spec) -> None:
    cfg, snap, spec = snapshot_and_spec
    with socket.socket() as s:  # a port nothing listens on: a worker that went away
        s.bind(("127.0.0.1", 0))
        gone_address = f"127.0.0.1:{s.getsockname()[1]}"
    gone = WorkerRef("w-gone", gone_address, last_heartbeat_ms=1000)
    registry = [gone]

    async def list_workers() -> list[WorkerRef]:
        return list(registry)

    transport = GrpcSender(GrpcWeightSyncConfig(), cfg.services)
    pusher = WeightPusher(0.05, list_workers, transport, transport, max_backoff_s=0.4)
    attempts = 0
    t0 = time.monotonic()
    try:
        await pusher.publish(snap)
        while time.monotonic() - t0 < 2.0:  # the join watcher's rounds, every 0.05 s
            attempts += len(await pusher.sync_behind())
            await asyncio.sleep(0.05)
        # Every round would be 40 tries; backing off 0.05, 0.1, 0.2, 0.4, 0.4, ... it is a handful.
        assert 3 <= attempts <= 9, attempts
        assert gone_address in transport._channels
        # It comes back (a restart: same id and address, a newer heartbeat): synced in the next round, no waiting.
        back = FakeWorker(spec)
        server, address = await _serve(back)
        registry[:] = [WorkerRef("w-gone", address, last_heartbeat_ms=2000)]
        assert await pusher.publish(snap) and back.version == 3  # at once, backoff or not
        # The registry drops it: so does the pusher, channel included.
        registry.clear()
        assert await pusher.sync_behind() == []
        assert not transport._channels and not pusher.results and not pusher._failing
        await server.stop(None)
    finally:
        await transport.close()
