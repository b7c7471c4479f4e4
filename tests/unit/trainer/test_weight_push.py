"""The weight pusher (trainer/weights.py) against the rollout worker's own receiving code, served by a real grpc.aio
server: late joiners synced, dead workers reported and backed off; the snapshot it pushes is a copy. The transports
themselves: tests/unit/weightsync/test_transports.py."""

from __future__ import annotations

import asyncio
import socket
import time

import torch
from weight_workers import FakeWorker, serve

from fleet.config.policy import GrpcWeightSyncConfig
from fleet.contracts.weights import WeightsId, WorkerRef
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy
from trainer.weights import WeightPusher, gather_snapshot
from weightsync.grpc import GrpcSender


async def test_pusher_syncs_late_joiners_and_reports_dead_workers(snapshot_and_spec) -> None:  # type: ignore[no-untyped-def]
    cfg, snap, spec = snapshot_and_spec
    early, late = FakeWorker(spec), FakeWorker(spec)
    (s1, a1), (s2, a2) = await serve(early), await serve(late)
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
        server, address = await serve(back)
        registry[:] = [WorkerRef("w-gone", address, last_heartbeat_ms=2000)]
        assert await pusher.publish(snap) and back.version == 3  # at once, backoff or not
        # The registry drops it: so does the pusher, channel included.
        registry.clear()
        assert await pusher.sync_behind() == []
        assert not transport._channels and not pusher.results and not pusher._failing
        await server.stop(None)
    finally:
        await transport.close()
