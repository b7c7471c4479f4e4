"""The worker registry: one Redis hash, worker id -> JSON record. A worker is live while its last heartbeat is newer
than `worker_timeout`; dead records stay listed (with `include_dead`) so an operator can see who went away."""

from __future__ import annotations

import dataclasses
import json
import time

from redis.asyncio import Redis

from services.replay_buffer.models import WorkerRecord
from services.runtime.errors import NotFound


def now_ms() -> int:
    return int(time.time() * 1000)


class WorkerRegistry:
    def __init__(self, redis: Redis, key: str, timeout_ms: int) -> None:
        self._redis = redis
        self._key = key
        self._timeout_ms = timeout_ms

    def is_live(self, rec: WorkerRecord, at_ms: int | None = None) -> bool:
        return (at_ms if at_ms is not None else now_ms()) - rec.last_heartbeat_ms <= self._timeout_ms

    async def put(self, rec: WorkerRecord, *, must_exist: bool = False) -> WorkerRecord:
        """Register (or, with `must_exist`, heartbeat) a worker; the heartbeat time is the buffer's clock, never the
        worker's, so liveness does not depend on clock skew between hosts."""
        rec = dataclasses.replace(rec, last_heartbeat_ms=now_ms())
        blob = json.dumps(dataclasses.asdict(rec))
        if must_exist:
            # HSET only if present, in one step: a heartbeat racing an unregister must not resurrect the worker.
            updated = await self._redis.eval(
                "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then "
                "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end return 0",
                1,
                self._key,
                rec.worker_id,
                blob,
            )
            if not updated:
                raise NotFound(f"worker {rec.worker_id!r} is not registered (call RegisterWorker first)")
        else:
            await self._redis.hset(self._key, rec.worker_id, blob)
        return rec

    async def get(self, worker_id: str) -> WorkerRecord | None:
        blob = await self._redis.hget(self._key, worker_id)
        return WorkerRecord(**json.loads(blob)) if blob else None

    async def list(self, include_dead: bool = False) -> list[WorkerRecord]:
        at = now_ms()
        recs = [WorkerRecord(**json.loads(v)) for v in (await self._redis.hgetall(self._key)).values()]
        recs.sort(key=lambda r: r.worker_id)
        return recs if include_dead else [r for r in recs if self.is_live(r, at)]

    async def live_count(self) -> int:
        return len(await self.list())
