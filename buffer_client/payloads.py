"""The data plane of the replay buffer: scored-group bytes in Redis, written by the rollout workers and read by the
trainer directly, so that they never cross the buffer's gRPC hop (the buffer, the control plane, handles headers).

`PayloadStore` reaches the Redis the buffer uses (`redis.url`, or the embedded server in `run.dir/redis`: the address
every process derives alike, fleet/contracts/buffer.py). Each call rides out a Redis outage the way `BufferClient`
rides out a buffer outage: retried with backoff (0.2 s doubling to 2 s) under one `Outage` per process, logged once,
and `ServiceDown` naming Redis past `services.outage_tolerance_s`. Every call is safe to retry: writes go to fresh
keys with the same bytes, reads are reads. The Redis client settings and the set of "Redis is down" errors are the
shared runtime's (services/runtime/redis_client.py), which the buffer's own Redis watch uses too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis

from fleet.config.infra import RedisConfig, ServicesConfig
from fleet.contracts.buffer import data_plane_url, payload_key, payload_ttl_ms
from services.runtime.outage import Outage
from services.runtime.redis_client import REDIS_DOWN, describe_redis_error, redis_client

log = logging.getLogger(__name__)

_MAX_DELAY_S = 2.0
# Payload writes in flight at once per put (each holds a pooled connection while it lasts).
_WRITE_CONCURRENCY = 8
T = TypeVar("T")


class PayloadStore:
    def __init__(self, url: str, prefix: str, outage: Outage, ttl_ms: int) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl_ms = ttl_ms
        self.outage = outage
        self._redis: Redis | None = None  # made on first use: a process that never touches payloads opens nothing

    @classmethod
    def from_config(cls, services: ServicesConfig, redis: RedisConfig, run_dir: str) -> PayloadStore:
        url = data_plane_url(redis.url, run_dir)
        s = services
        outage = Outage(f"redis at {url}", s.outage_tolerance_s, report_every_s=s.outage_report_s)
        return cls(url, redis.key_prefix, outage, payload_ttl_ms(s.outage_tolerance_s))

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            self._redis = redis_client(self.url)
        return self._redis

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def put(self, groups: list[tuple[str, bytes]]) -> list[str]:
        """Write each (group id, serialized ScoredGroup) under a fresh payload key with an expiry (freed unless the
        buffer's submit keeps it), in one round trip; returns the keys, in order."""
        keys = [payload_key(self.prefix, gid) for gid, _ in groups]

        # Concurrent plain SETs (one pooled connection each, up to _WRITE_CONCURRENCY at once), not one pipeline:
        # redis-py spends 2-2.5x the CPU per byte writing large values through a pipeline (measured: 0.19 vs 0.09 ms per
        # 132 KB value, 3.1-3.4 vs 1.2-1.3 ms per 2 MB one), and the round trips overlap all the same.
        async def write() -> Any:
            pairs = list(zip(keys, groups, strict=True))
            for i in range(0, len(pairs), _WRITE_CONCURRENCY):
                chunk = pairs[i : i + _WRITE_CONCURRENCY]
                await asyncio.gather(*(self.redis.set(key, data, px=self.ttl_ms) for key, (_, data) in chunk))

        await self._call("payload write", write)
        return keys

    async def get(self, keys: list[str], *, delete: bool = False) -> list[bytes | None]:
        """The bytes under `keys` (None where a key is gone), in one MGET; with `delete`, the keys go in the same
        transaction (validation groups: read once, never kept)."""
        if not keys:
            return []

        async def read() -> Any:
            if not delete:
                return await self.redis.mget(keys)
            pipe = self.redis.pipeline(transaction=True)
            pipe.mget(keys)
            pipe.delete(*keys)
            return (await pipe.execute())[0]

        values = await self._call("payload read", read)
        return [None if v is None else bytes(v) for v in values]

    async def _call(self, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        delay = 0.2
        while True:
            try:
                result = await fn()
            except REDIS_DOWN as exc:
                detail = describe_redis_error(exc)
            else:
                self.outage.recovered()
                return result
            # Outside the except block: a ServiceDown past the bound is the error, not a consequence of the last one.
            log.debug("%s: %s; retrying in %.1fs", name, detail, delay)
            self.outage.failed(detail)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY_S)
