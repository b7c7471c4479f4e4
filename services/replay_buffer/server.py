"""`grpo-fleet serve replay-buffer`: connect to Redis (or start the embedded one), serve grpofleet.v1.ReplayBuffer.

Wiring: `main(cfg)` starts the embedded Redis (when `redis.url` is empty) in the main thread, then runs `serve` on
uvloop. `serve` builds the store and the servicer (its RPCs guarded by a `RedisWatch`: Redis down -> UNAVAILABLE naming
Redis, one log line per outage), adds them to a runtime `GrpcService` (health, reflection, auth, error mapping), and
hands over to `run_service`, which supervises the lease reclaimer and the Redis watch and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fleet.config.schema import MasterConfig
from grpofleet.v1 import replay_buffer_pb2
from services.replay_buffer.embedded import EmbeddedRedis, start_embedded_redis
from services.replay_buffer.metrics import MetricsServer, start_metrics
from services.replay_buffer.models import StoreSettings
from services.replay_buffer.servicer import SERVICE_NAME, ReplayBufferServicer, add_to_server
from services.replay_buffer.store import ReplayStore
from services.runtime.errors import Unavailable
from services.runtime.outage import Outage, ServiceDown
from services.runtime.server import GrpcService, run, run_service

log = logging.getLogger(__name__)

# redis-py's connection errors do not derive from the builtin ConnectionError; BusyLoadingError (a Redis replaying
# its AOF) derives from its ConnectionError.
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


def _client(url: str) -> Redis:
    """A client whose failures surface fast (as UNAVAILABLE, through the servicer guard) rather than hanging calls.
    One retry on a fresh connection covers a Redis that restarted between two calls (the pooled connection is
    stale); longer outages are the RedisWatch's to ride out, not each command's."""
    # Only connection errors: a timeout is not a stale connection, and retrying it would double a hung call.
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1, supported_errors=(RedisConnectionError,))
    return Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30, retry=retry)


async def _connect(url: str, watch: RedisWatch) -> Redis:
    """Wait for Redis at start-up too (it may be restarting, or still loading its AOF), up to the outage bound."""
    client = _client(url)
    while True:
        try:
            await client.ping()
            watch.outage.recovered()
            return client
        except _REDIS_DOWN as exc:
            watch.outage.failed(f"{type(exc).__name__}: {exc}")  # raises ServiceDown past the bound
            await asyncio.sleep(0.5)


class RedisWatch:
    """The buffer's view of its Redis: an outage starts with the first call (or ping) that finds it down and ends
    with the first that succeeds; the `Outage` logs it once. While it lasts every RPC answers UNAVAILABLE naming
    Redis, so that clients wait rather than fail; past `services.outage_tolerance_s` the service exits non-zero."""

    def __init__(self, url: str, cfg: MasterConfig) -> None:
        self.url = url
        self.outage = Outage(
            f"redis at {url}", cfg.services.outage_tolerance_s, report_every_s=cfg.services.outage_report_s, logger=log
        )

    def unavailable(self, exc: BaseException) -> Unavailable:
        try:
            self.outage.failed(f"{type(exc).__name__}: {exc}")
        except ServiceDown as down:
            return Unavailable(str(down))
        return Unavailable(f"redis at {self.url} is unavailable (for {self.outage.elapsed():.0f} s): {exc}")

    async def watch(self, client: Redis, interval_s: float = 0.5) -> None:
        """Background task: ping while an outage lasts (to notice its end without waiting for a call), and now and
        then otherwise. Returns (failing the service loudly) past the outage bound."""
        task = asyncio.current_task()
        while task is None or not task.cancelling():
            await asyncio.sleep(interval_s if self.outage.active else 5.0)
            try:
                await asyncio.wait_for(client.ping(), timeout=2.0)
            except (*_REDIS_DOWN, TimeoutError) as exc:
                self.outage.failed(f"{type(exc).__name__}: {exc}")  # ServiceDown past the bound ends the task
            else:
                self.outage.recovered()
        raise asyncio.CancelledError


def guard_redis(servicer: object, methods: list[str], watch: RedisWatch) -> None:
    """Wrap each RPC method of `servicer` so that Redis being down becomes `Unavailable` naming Redis (the error
    interceptor turns it into UNAVAILABLE) and is counted in the watch's outage instead of logged per call."""
    for name in methods:
        fn = getattr(servicer, name)

        async def guarded(request: Any, context: Any, _fn: Any = fn) -> Any:
            try:
                result = await _fn(request, context)
            except _REDIS_DOWN as exc:
                raise watch.unavailable(exc) from None
            watch.outage.recovered()
            return result

        setattr(servicer, name, guarded)


def _reclaimer(store: ReplayStore, interval_s: float) -> Callable[[], Coroutine[Any, Any, None]]:
    async def reclaim_expired_leases() -> None:
        task = asyncio.current_task()
        # Checking `cancelling()` too: a cancellation that lands inside redis-py's read path can be swallowed there
        # (seen on Python 3.11), and a loop that relied on it alone would keep the service from stopping.
        while task is None or not task.cancelling():
            await asyncio.sleep(interval_s)
            try:
                await store.reclaim_expired()
            except _REDIS_DOWN as exc:  # Redis away (restarting, loading its AOF): the watch reports it; next round
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
            background=[_reclaimer(self.store, self.reclaim_interval_s), self._watch_redis],
            on_stop=self._close,
            stop=stop,
        )

    async def _watch_redis(self) -> None:
        await self.redis_watch.watch(self.client)

    async def _close(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        await self.client.aclose()


async def build(cfg: MasterConfig, redis_url: str) -> ReplayBufferApp:
    watch = RedisWatch(redis_url, cfg)
    client = await _connect(redis_url, watch)
    store = ReplayStore(client, StoreSettings.from_config(cfg))
    await store.init()
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


def main(cfg: MasterConfig) -> int:
    """Entry point of `grpo-fleet serve replay-buffer`."""
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
