"""`grpo-fleet serve replay-buffer`: connect to Redis (or start the embedded one), serve grpofleet.v1.ReplayBuffer.

Wiring: `main(cfg)` starts the embedded Redis (when `redis.url` is empty) in the main thread, then runs `serve` on
uvloop. `serve` builds the store and the servicer, whose RPCs a `RedisWatch` guards (redis_watch.py: Redis down ->
UNAVAILABLE naming Redis, one log line per outage; the buffer serves while Redis is down too), adds them to a runtime
`GrpcService` (health, reflection, auth, error mapping), and hands over to `run_service`, which supervises the lease
reclaimer and the Redis watch and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from fleet.config.schema import MasterConfig
from fleet.entry import service_main
from grpofleet.v1 import replay_buffer_pb2
from services.replay_buffer.embedded import EmbeddedRedis, start_embedded_redis
from services.replay_buffer.metrics import MetricsServer, start_metrics
from services.replay_buffer.models import StoreSettings
from services.replay_buffer.redis_watch import RedisWatch, guard_redis
from services.replay_buffer.servicer import SERVICE_NAME, ReplayBufferServicer, add_to_server
from services.replay_buffer.store import ReplayStore
from services.runtime.redis_client import REDIS_DOWN, redis_client
from services.runtime.server import GrpcService, run, run_service

log = logging.getLogger(__name__)


def _reclaimer(
    store: ReplayStore, interval_s: float, ready: Callable[[], bool]
) -> Callable[[], Coroutine[Any, Any, None]]:
    async def reclaim_expired_leases() -> None:
        task = asyncio.current_task()
        # Checking `cancelling()` too: a cancellation that lands inside redis-py's read path can be swallowed there
        # (seen on Python 3.11), and a loop that relied on it alone would keep the service from stopping.
        while task is None or not task.cancelling():
            await asyncio.sleep(interval_s)
            if not ready():  # Redis not reached yet since start-up: nothing to reclaim from
                continue
            try:
                await store.reclaim_expired()
            except REDIS_DOWN as exc:  # Redis away (restarting, loading its AOF): the watch reports it; next round
                log.debug("lease reclaim skipped: redis unavailable: %s", exc)
        raise asyncio.CancelledError

    return reclaim_expired_leases


@dataclass
class ReplayBufferApp:
    """The assembled service: what `serve` runs, and what in-process tests start and stop."""

    service: GrpcService
    store: ReplayStore
    client: Redis
    metrics: MetricsServer | None
    reclaim_interval_s: float
    redis_watch: RedisWatch

    async def run(self, stop: asyncio.Event | None = None) -> int:
        """Serve until SIGTERM/SIGINT (or `stop`); returns the exit code."""
        return await run_service(
            self.service,
            background=[
                _reclaimer(self.store, self.reclaim_interval_s, lambda: self.redis_watch.ready),
                self._watch_redis,
            ],
            on_stop=self._close,
            stop=stop,
        )

    async def _watch_redis(self) -> None:
        await self.redis_watch.watch()

    async def _close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        await self.client.aclose()


async def build(cfg: MasterConfig, redis_url: str) -> ReplayBufferApp:
    client = redis_client(redis_url)
    store = ReplayStore(client, StoreSettings.from_config(cfg))
    watch = RedisWatch(redis_url, client, store, cfg.services)
    await watch.try_contact()  # a Redis that is down now (restarting, loading its AOF) is an outage, not a failure
    service = GrpcService("replay_buffer", cfg.services.replay_buffer, cfg.services)
    servicer = ReplayBufferServicer(store)
    guard_redis(
        servicer, [m.name for m in replay_buffer_pb2.DESCRIPTOR.services_by_name["ReplayBuffer"].methods], watch
    )
    service.add(add_to_server, servicer, SERVICE_NAME)
    metrics = None
    if cfg.replay_buffer.metrics_port is not None:
        metrics = start_metrics(store, cfg.services.replay_buffer.host, cfg.replay_buffer.metrics_port)
    log.info("replay_buffer: redis %s, max trajectory age %d steps", redis_url, store.settings.max_age)
    return ReplayBufferApp(service, store, client, metrics, cfg.replay_buffer.reclaim_interval_s, watch)


async def serve(cfg: MasterConfig, redis_url: str, *, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or `stop`); returns the exit code."""
    return await (await build(cfg, redis_url)).run(stop)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpo-fleet serve replay-buffer [--config FILE] [overrides...]`."""
    return service_main("grpo-fleet serve replay-buffer", argv, serve_config)


def serve_config(cfg: MasterConfig) -> int:
    """Serve with `cfg` until SIGTERM/SIGINT, on an embedded Redis when `redis.url` is empty."""
    embedded: EmbeddedRedis | None = None
    url = cfg.redis.url
    if not url:
        # Started here, in the main thread, before the event loop: the server's death signal is tied to this thread.
        url, embedded = start_embedded_redis(Path(cfg.run.dir) / "redis", appendfsync=cfg.redis.appendfsync)
    try:
        return run(lambda: serve(cfg, url))
    finally:
        if embedded is not None:
            embedded.stop()
