"""Weight publication: gather the full weights on rank 0, push them to every live rollout worker, keep late joiners
in sync.

* `gather_snapshot()` runs on every rank (each FSDP2 `full_tensor()` is an all-gather); rank 0 keeps a CPU copy in
  the served dtype. The copy is what is streamed, never the live parameters, so the next optimizer step can run
  while a push is in flight without a worker ever reading half-updated weights (NeMo RL #3839).
* The wire lives in `weightsync` (below both fleets): a `WeightSender` moves one snapshot to a set of workers and
  reports per worker, over the transport `policy.weight_sync` names (`weightsync.make_senders`).
* `WeightPusher` owns the current snapshot. `publish()` pushes it to every worker the buffer lists, concurrently;
  `watch()` (a background task) pushes it to any worker that registered late, restarted or fell behind: the join
  handshake, since the buffer leases nothing to a worker without weights of the current run epoch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from grpc import aio

from fleet.contracts.weights import WeightsId
from trainer.model import PolicyModule, iter_full_state
from weightsync.base import PushResult, WeightSender, WorkerRef
from weightsync.header import WeightSnapshot

log = logging.getLogger(__name__)


def gather_snapshot(policy: PolicyModule, dtype: torch.dtype, *, keep: bool,
                    weights: WeightsId) -> WeightSnapshot | None:
    """Every rank calls this in step; the rank with `keep` (rank 0) gets the snapshot of identity `weights`, the
    others None."""
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, full in iter_full_state(policy):
            if keep:
                tensors[name] = full.detach().to("cpu", dtype=dtype, copy=True).contiguous()
    return WeightSnapshot(weights, tensors) if keep else None


@dataclass
class WeightPusher:
    """Rank 0's weight publisher (runs on the control-plane event loop). Push rounds (a publish, or one round of the
    join watcher) never overlap: a worker is never sent the same version twice, nor an old one after a new one."""

    join_poll_s: float
    """How often the join watcher looks for workers behind (`policy.weight_sync.join_poll_s`)."""
    list_workers: Any  # async () -> list[WorkerRef]
    transport: WeightSender
    late_transport: WeightSender
    current: WeightSnapshot | None = None
    results: dict[str, PushResult] = field(default_factory=dict)
    _round: asyncio.Lock = field(default_factory=asyncio.Lock)
    _synced_at_ms: dict[str, int] = field(default_factory=dict)

    def _record(self, results: list[PushResult], snapshot: WeightSnapshot) -> None:
        for r in results:
            self.results[r.worker_id] = r
            if r.ok and r.weights == snapshot.id:
                self._synced_at_ms[r.worker_id] = int(time.time() * 1000)
            elif not r.ok:
                log.warning("weight push v%d to %s failed: %s", snapshot.version, r.worker_id, r.error)

    async def publish(self, snapshot: WeightSnapshot) -> list[PushResult]:
        """Make `snapshot` current and push it to every listed worker; returns once every push has answered."""
        async with self._round:
            self.current = snapshot
            workers = await self.list_workers()
            if not workers:
                log.warning("weight version %d: no live rollout worker to push to (a joining one is synced on join)",
                            snapshot.version)
                return []
            results = await self.transport.push(snapshot, workers)
            self._record(results, snapshot)
            return results

    def behind(self, w: WorkerRef) -> bool:
        cur = self.current
        if cur is None or w.weights == cur.id:
            return False
        # The registry can lag our own successful push by one heartbeat: trust the push unless the worker has
        # heartbeated since (e.g. it restarted and now reports no weights).
        synced = self._synced_at_ms.get(w.worker_id, -1)
        mine = self.results.get(w.worker_id)
        pushed_current = mine is not None and mine.ok and mine.weights == cur.id
        return not (pushed_current and w.last_heartbeat_ms <= synced)

    async def sync_behind(self) -> list[PushResult]:
        """One round of the join handshake: push the current snapshot to every worker not serving it."""
        async with self._round:
            snap = self.current
            if snap is None:
                return []
            todo = [w for w in await self.list_workers() if self.behind(w)]
            if not todo:
                return []
            for w in todo:
                log.info("syncing worker %s (serving v%d epoch %d) to v%d epoch %d", w.worker_id, w.weight_version,
                         w.weight_epoch, snap.version, snap.epoch)
            results = await self.late_transport.push(snap, todo)
            self._record(results, snap)
            return results

    async def watch(self) -> None:
        """Background join handshake; runs until cancelled. A failure of one round is logged, not fatal."""
        while True:
            try:
                await self.sync_behind()
            except aio.AioRpcError as exc:
                log.warning("join watcher: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(self.join_poll_s)
