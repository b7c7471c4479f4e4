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
* A worker whose push failed and that has not heartbeated since (it went away: the registry lists it until
  `replay_buffer.worker_timeout_s`) is retried with a doubling backoff, not on every round; once the registry drops
  it, so does the pusher (its state and its channel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch
from grpc import aio

from fleet.contracts.weights import WeightsId, WorkerRef
from trainer.model import PolicyModule, iter_full_state
from weightsync.base import PushResult, WeightSender
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
    list_workers: Callable[[], Awaitable[list[WorkerRef]]]
    """The registry's live workers (`BufferClient.list_workers`)."""
    transport: WeightSender
    late_transport: WeightSender
    max_backoff_s: float = 30.0
    """Longest wait between pushes to a worker that went away (`policy.weight_sync.max_retry_backoff_s`)."""
    current: WeightSnapshot | None = None
    results: dict[str, PushResult] = field(default_factory=dict)
    _round: asyncio.Lock = field(default_factory=asyncio.Lock)
    _synced_at_ms: dict[str, int] = field(default_factory=dict)
    # worker id -> (failed pushes in a row, its registry heartbeat when the last one failed, retry not before)
    _failing: dict[str, tuple[int, int, float]] = field(default_factory=dict)

    def _record(self, results: list[PushResult], snapshot: WeightSnapshot, workers: list[WorkerRef]) -> None:
        heartbeat = {w.worker_id: w.last_heartbeat_ms for w in workers}
        for r in results:
            self.results[r.worker_id] = r
            if r.ok:
                self._failing.pop(r.worker_id, None)
                if r.weights == snapshot.id:
                    self._synced_at_ms[r.worker_id] = int(time.time() * 1000)
                continue
            n = self._failing.get(r.worker_id, (0, 0, 0.0))[0] + 1
            wait = min(self.max_backoff_s, self.join_poll_s * 2 ** (n - 1))
            self._failing[r.worker_id] = (n, heartbeat.get(r.worker_id, 0), time.monotonic() + wait)
            log.warning("weight push v%d to %s failed (%d in a row; next try in %.1f s unless it heartbeats): %s",
                        snapshot.version, r.worker_id, n, wait, r.error)

    def _due(self, w: WorkerRef) -> bool:
        """False while a worker whose push failed backs off -- unless it has heartbeated since (it restarted, or the
        failure was not its going away)."""
        failing = self._failing.get(w.worker_id)
        return failing is None or w.last_heartbeat_ms > failing[1] or time.monotonic() >= failing[2]

    async def _listed(self) -> list[WorkerRef]:
        """The registry's live workers; what it no longer lists is forgotten here too (state and channels)."""
        workers = await self.list_workers()
        ids, addresses = {w.worker_id for w in workers}, {w.address for w in workers}
        for gone in [wid for wid in {*self.results, *self._failing} if wid not in ids]:
            if gone in self._failing:
                log.info("worker %s left the registry: no more weight pushes to it", gone)
            for table in (self.results, self._synced_at_ms, self._failing):
                table.pop(gone, None)
        for sender in {id(self.transport): self.transport, id(self.late_transport): self.late_transport}.values():
            await sender.forget(addresses)
        return workers

    async def publish(self, snapshot: WeightSnapshot) -> list[PushResult]:
        """Make `snapshot` current and push it to every listed worker; returns once every push has answered."""
        async with self._round:
            self.current = snapshot
            listed = await self._listed()
            # One that backs off is left to the join watcher: a gone worker does not hold every publish up.
            workers = [w for w in listed if self._due(w)]
            if not workers:
                log.warning("weight version %d: no live rollout worker to push to (%d backing off; a joining one is "
                            "synced on join)", snapshot.version, len(listed))
                return []
            results = await self.transport.push(snapshot, workers)
            self._record(results, snapshot, workers)
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
            todo = [w for w in await self._listed() if self.behind(w) and self._due(w)]
            if not todo:
                return []
            for w in todo:
                log.info("syncing worker %s (serving v%d epoch %d) to v%d epoch %d", w.worker_id, w.weight_version,
                         w.weight_epoch, snap.version, snap.epoch)
            results = await self.late_transport.push(snap, todo)
            self._record(results, snap, todo)
            return results

    async def watch(self) -> None:
        """Background join handshake; runs until cancelled. A failure of one round is logged, not fatal."""
        while True:
            try:
                await self.sync_behind()
            except aio.AioRpcError as exc:
                log.warning("join watcher: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(self.join_poll_s)
