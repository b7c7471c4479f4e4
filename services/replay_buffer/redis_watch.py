"""`RedisWatch`: the replay buffer's view of its Redis, and the guard that turns Redis being down into UNAVAILABLE.

The buffer serves whether or not Redis answers (at start-up too, e.g. right after a restart of both): while Redis is
away every RPC answers UNAVAILABLE with `backend unavailable: redis at URL is unavailable (for N s): ...`, so its
clients wait out the outage and can say what is down, instead of finding the buffer itself gone. The outage starts
with the first call (or ping) that finds Redis down and ends with the first that succeeds; its `Outage` logs it once
(started, still waiting, back). Past `services.outage_tolerance_s` the watch task ends and the service exits non-zero
naming Redis. The store's consumer group is created on the first contact with Redis, before any RPC uses it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis

from fleet.config.infra import ServicesConfig
from services.replay_buffer.store import ReplayStore
from services.runtime.client import BACKEND_DOWN
from services.runtime.errors import Unavailable
from services.runtime.outage import Outage, ServiceDown
from services.runtime.redis_client import REDIS_DOWN

log = logging.getLogger(__name__)

_PING_TIMEOUT_S = 2.0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"no answer within {_PING_TIMEOUT_S:g} s"


class RedisWatch:
    def __init__(self, url: str, client: Redis, store: ReplayStore, services: ServicesConfig) -> None:
        self.url = url
        self.client = client
        self.store = store
        self.ready = False  # the store's consumer group exists (first contact made)
        self.outage = Outage(
            f"redis at {url}", services.outage_tolerance_s, report_every_s=services.outage_report_s, logger=log
        )

    async def contact(self) -> None:
        """Ping Redis (and on first contact create the store's consumer group); raises what redis-py raises."""
        await asyncio.wait_for(self.client.ping(), timeout=_PING_TIMEOUT_S)
        if not self.ready:
            await self.store.init()
            self.ready = True
        self.outage.recovered()

    async def try_contact(self) -> None:
        """At start-up: contact Redis if it answers; if not, the outage starts now and the watch carries on."""
        try:
            await self.contact()
        except REDIS_DOWN as exc:
            self.outage.failed(_describe(exc))

    def unavailable(self, exc: BaseException) -> Unavailable:
        try:
            self.outage.failed(_describe(exc))
        except ServiceDown as down:
            return Unavailable(f"{BACKEND_DOWN}{down}")
        return Unavailable(
            f"{BACKEND_DOWN}redis at {self.url} is unavailable (for {self.outage.elapsed():.0f} s): {_describe(exc)}"
        )

    async def watch(self, interval_s: float = 0.5) -> None:
        """Background task: ping while an outage lasts (to notice its end without waiting for a call), and now and
        then otherwise. Ends (failing the service loudly) past the outage bound."""
        task = asyncio.current_task()
        while task is None or not task.cancelling():
            await asyncio.sleep(interval_s if self.outage.active else 5.0)
            try:
                await self.contact()
            except REDIS_DOWN as exc:
                self.outage.failed(_describe(exc))  # ServiceDown past the bound ends the task
        raise asyncio.CancelledError


def guard_redis(servicer: object, methods: list[str], watch: RedisWatch) -> None:
    """Wrap each RPC method of `servicer` so that Redis being down becomes `Unavailable` naming Redis (the error
    interceptor turns it into UNAVAILABLE without a log line) and counts in the watch's outage."""
    for name in methods:
        fn = getattr(servicer, name)

        async def guarded(request: Any, context: Any, _fn: Any = fn) -> Any:
            try:
                if not watch.ready:
                    await watch.contact()
                result = await _fn(request, context)
            except REDIS_DOWN as exc:
                raise watch.unavailable(exc) from None
            watch.outage.recovered()
            return result

        setattr(servicer, name, guarded)
