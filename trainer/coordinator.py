"""Rank 0's dealings with the rest of the fleet: replay buffer, weight pushes, status service, validation.

gRPC is asyncio; training is synchronous torch code. So the coordinator owns a private event loop in a daemon
thread ("control plane") and the training thread calls into it with `call()` (blocking) or `submit()` (a future):
a weight push can stream to the workers while the next step trains, and GetStatus answers at any time.

Components don't reference each other: the coordinator wires the buffer client, the weight pusher (with its
transports) and the status service in `start()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import torch

from buffer_client import BufferClient
from fleet.config import MasterConfig
from fleet.contracts.buffer import Starvation
from fleet.contracts.groups import ScoredGroup
from services.runtime.server import GrpcService
from trainer.data import PromptFeeder, TaskSource
from trainer.status import TrainerState, start_status_service
from trainer.validation import ValidationRound, run_validation
from trainer.weights import WeightPusher
from weightsync.base import PushResult
from weightsync.factory import make_senders
from weightsync.header import WeightSnapshot

log = logging.getLogger(__name__)
T = TypeVar("T")


class StarvationError(RuntimeError):
    """No full batch within grpo.sample_timeout_s; carries the buffer's last starvation report."""

    def __init__(self, message: str, starvation: Starvation) -> None:
        super().__init__(f"{message}; last report: {starvation.describe()}")
        self.starvation = starvation


class NoWorkersError(StarvationError):
    """No rollout worker has been live for services.no_worker_timeout_s: the run would only idle."""


class Coordinator:
    def __init__(self, cfg: MasterConfig, feeder: PromptFeeder, val_source: TaskSource | None, state: TrainerState,
                 device: torch.device, stop_requested: Callable[[], bool] = lambda: False) -> None:
        self.cfg = cfg
        self.feeder = feeder
        self.val_source = val_source
        self.state = state
        self.device = device
        self.stop_requested = stop_requested
        self.epoch = 0
        self.starvation: Counter[str] = Counter()
        self._last_report: tuple[str, float] = ("", 0.0)
        # When a live rollout worker was last seen (a starvation report counting one, or groups arriving); the
        # clock of services.no_worker_timeout_s starts when the trainer first waits for data.
        self._worker_seen_at: float | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="control-plane", daemon=True)
        self._watcher: concurrent.futures.Future[None] | None = None
        # Made by start() on the control-plane loop (their channels belong to it); None until then, or where start()
        # failed half-way (e.g. on a port in use): close() closes whatever was made.
        self._buffer: BufferClient | None = None
        self._pusher: WeightPusher | None = None
        self._status: GrpcService | None = None

    @property
    def buffer(self) -> BufferClient:
        if self._buffer is None:
            raise RuntimeError("Coordinator.start() has not made the buffer client")
        return self._buffer

    @property
    def pusher(self) -> WeightPusher:
        if self._pusher is None:
            raise RuntimeError("Coordinator.start() has not made the weight pusher")
        return self._pusher

    # -- plumbing -------------------------------------------------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def start(self) -> None:
        self._thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        self._buffer = BufferClient(self.cfg.services, self.cfg.redis, self.cfg.run.dir)
        main, late = make_senders(self.cfg.policy.weight_sync, self.cfg.services, self.device)
        sync = self.cfg.policy.weight_sync
        self._pusher = WeightPusher(sync.join_poll_s, self._buffer.list_workers, main, late, sync.max_retry_backoff_s)
        self._status = await start_status_service(self.cfg.services, self.state)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        if self._watcher is not None:
            self._watcher.cancel()
        self.call(self._close(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _close(self) -> None:
        # Whatever _start() got to make (it may have failed half-way, e.g. on a port in use).
        if self._status is not None:
            await self._status.stop(grace=1.0)
        if self._pusher is not None:
            await self._pusher.transport.close()
            await self._pusher.late_transport.close()
        if self._buffer is not None:
            await self._buffer.close()

    # -- run lifecycle ----------------------------------------------------------------------------------------------
    def begin_run(self, step: int) -> dict[str, float]:
        """A new run epoch (BeginRun), before the weights of the run are gathered: their identity carries it (the
        version is the step)."""
        info = self.call(self.buffer.begin_run(step))
        self.epoch = self.state.epoch = info["epoch"]
        log.info("run epoch %d at step %d: %s", self.epoch, step, info)
        return {f"resume/{k}": float(v) for k, v in info.items()}

    def begin(self, snapshot: WeightSnapshot) -> dict[str, float]:
        """The run's weights to every worker BEFORE anything can be leased (the buffer refuses leases to workers
        without this epoch's weights), then the join watcher for late workers."""
        metrics = self.call(self._publish(snapshot))
        self._watcher = self.submit(self.pusher.watch())
        return metrics

    def publish(self, snapshot: WeightSnapshot) -> concurrent.futures.Future[dict[str, float]]:
        """Push `snapshot` (its identity: the run epoch and the version, which is the step it trains next)."""
        return self.submit(self._publish(snapshot))

    async def _publish(self, snapshot: WeightSnapshot) -> dict[str, float]:
        t0 = time.monotonic()
        results = await self.pusher.publish(snapshot)
        await self.buffer.publish_version(snapshot.id)
        return push_metrics(results, time.monotonic() - t0)

    def commit(self, step: int) -> None:
        n = self.call(self.buffer.commit_step(step, self.epoch))
        log.info("committed steps <= %d to the replay buffer (%s groups)", step, n)

    def buffer_stats(self) -> dict[str, Any]:
        try:
            return self.call(self.buffer.stats(), timeout=self.cfg.services.rpc_timeout_s)
        except Exception as exc:  # stats are for display only
            log.debug("buffer stats unavailable: %s", exc)
            return {}

    # -- data -------------------------------------------------------------------------------------------------------
    def enqueue_through(self, last_step: int) -> tuple[int, int]:
        """Enqueue every step up to `last_step` not yet enqueued (in step order: leases take the eligible prefix)."""
        added = dups = 0
        # Not clamped to grpo.max_num_steps: the last steps too can take groups meant for later ones instead of
        # waiting for a straggler. Whatever is left at the end stays pending in the buffer (and serves a longer run).
        for step in self.feeder.pending_steps(last_step):
            a, d = self.call(self.buffer.enqueue(self.feeder.next_share(step)))
            added, dups = added + a, dups + d
        if dups:
            log.info("%d prompt groups were already in the buffer (enqueued before a restart)", dups)
        return added, dups

    def collect(self, step: int, num_groups: int, *, validation: bool = False) -> list[ScoredGroup]:
        """Whole groups until `num_groups`: each Sample takes whatever is ready (>= 1) within the deadline, so one
        straggling rollout delays the step only until another group can take its place."""
        groups: list[ScoredGroup] = []
        start = time.monotonic()
        deadline = self.cfg.grpo.sample_deadline_s
        while len(groups) < num_groups:
            if self.stop_requested():
                raise InterruptedError("stop requested while waiting for data")
            got, starving = self.call(self.buffer.sample(step, num_groups - len(groups), deadline, min_groups=1,
                                                         validation=validation))
            groups.extend(got)
            now = time.monotonic()
            if self._worker_seen_at is None or got or starving.live_workers > 0:
                self._worker_seen_at = now
            if len(groups) < num_groups and starving.reason:
                self._report(step, starving, len(groups), num_groups)
                if starving.live_workers == 0:
                    self._check_workers(step, starving, now - self._worker_seen_at)
                if not validation and starving.prompts_pending == 0 and starving.leases_outstanding == 0:
                    # Nothing queued or in flight can still arrive (groups were dead-lettered): without more
                    # prompts this step would starve forever.
                    missing = num_groups - len(groups)
                    log.warning("step %d: topping up %d prompt groups (%s)", step, missing, starving.reason)
                    self.call(self.buffer.enqueue(self.feeder.top_up(step, missing)))
                if time.monotonic() - start > self.cfg.grpo.sample_timeout_s:
                    raise StarvationError(f"step {step}: {len(groups)}/{num_groups} groups after "
                                          f"grpo.sample_timeout_s={self.cfg.grpo.sample_timeout_s}s", starving)
        return groups

    def _check_workers(self, step: int, starving: Starvation, none_for_s: float) -> None:
        """Fail fast, in one line, once no rollout worker has been live for services.no_worker_timeout_s: without
        one nothing can arrive, and grpo.sample_timeout_s (an hour) would pass in silence."""
        bound = self.cfg.services.no_worker_timeout_s
        if none_for_s <= bound:
            return
        try:
            known = self.call(self.buffer.list_workers(include_dead=True), timeout=self.cfg.services.rpc_timeout_s)
            seen = "no rollout worker ever registered with the replay buffer"
        except Exception as exc:  # the message matters more than this detail
            known, seen = [], f"the worker registry could not be read ({type(exc).__name__})"
        if known:
            last = max(known, key=lambda w: w.last_heartbeat_ms)
            ago = time.time() - last.last_heartbeat_ms / 1000
            seen = (f"the registry lists {len(known)}, none live (last heartbeat: {last.worker_id} at {last.address}, "
                    f"{ago:.0f} s ago)")
        raise NoWorkersError(
            f"step {step}: no live rollout worker for {none_for_s:.0f} s (services.no_worker_timeout_s={bound:g}): "
            f"{seen}; the rollout fleet is down or cannot reach the replay buffer at "
            f"{self.cfg.services.replay_buffer.address} (see `grpo-fleet status` and the workers' logs)", starving)

    def _report(self, step: int, s: Starvation, have: int, want: int) -> None:
        self.starvation[s.reason] += 1
        now = time.monotonic()
        # Every report is counted (metrics); the log gets one line per reason change or per 10 s.
        if s.reason != self._last_report[0] or now - self._last_report[1] >= 10.0:
            log.info("step %d waiting (%d/%d groups): %s", step, have, want, s.describe())
            self._last_report = (s.reason, now)

    def validate(self, step: int) -> ValidationRound:
        """A validation round with its verdict breakdown (trainer/validation.py)."""
        if self.val_source is None:
            return ValidationRound({})
        return run_validation(self.call, self.buffer, self.val_source, self.cfg.grpo, step, self.stop_requested,
                              self.cfg.logger.val_answers_logged)


def push_metrics(results: list[PushResult], seconds: float) -> dict[str, float]:
    ok = [r for r in results if r.ok]
    return {
        "weights/push_s": seconds,
        "weights/workers_ok": float(len(ok)),
        "weights/workers_failed": float(len(results) - len(ok)),
        "weights/max_pause_s": max((r.pause_s for r in ok), default=0.0),
        "weights/max_load_s": max((r.load_s for r in ok), default=0.0),
        "weights/bytes": float(max((r.bytes for r in ok), default=0)),
    }
