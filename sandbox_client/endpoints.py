"""The executors a client spreads work over: which are up, how busy each is, which one gets the next task, and how
many tasks they can run at once.

Least outstanding first (ties: the one used longest ago), so a slow or small executor gets fewer tasks instead of
an equal share. An executor is marked down on a transport failure; the client's prober brings it back once its
/healthz answers 200 again, and records the `pool_size` it reports there (`EndpointPool.capacity`, which sizes the
client's `Gate`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp


def http_session(token: str | None) -> aiohttp.ClientSession:
    """The executors' HTTP session: the bearer token on every request, and no cap on connections (the client's own
    concurrency limits bound them; aiohttp's default of 100 would queue long-polls behind each other)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=0))


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a client's background task (prober, lease renewer) and wait until it has finished."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class EndpointState:
    url: str
    up: bool = True
    outstanding: int = 0
    """Tasks this client has submitted there and not yet got a verdict for."""
    failures: int = 0
    """Failures since the last success."""
    last_error: str = ""
    last_used: float = 0.0
    verdicts: int = 0
    pool_size: int | None = None
    """Runners the executor reported on its last healthy /healthz; None until one did (or from an executor that
    does not report it)."""
    test_runner: dict[str, str] | None = None
    """The versions its tests run with (`{"python", "pytest"}`), as its last healthy /healthz reported them."""


class EndpointPool:
    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("env.code.sandbox_urls must list at least one executor URL")
        self.states = [EndpointState(url.rstrip("/")) for url in dict.fromkeys(urls)]
        self._changed = asyncio.Event()

    def pick(self, avoid: set[str], *, fresh_only: bool = False) -> EndpointState | None:
        """The up endpoint with the fewest outstanding tasks, preferring ones not in `avoid` (already failed)."""
        up = [s for s in self.states if s.up]
        fresh = [s for s in up if s.url not in avoid]
        candidates = fresh if fresh or fresh_only else up
        if not candidates:
            return None
        return min(candidates, key=lambda s: (s.outstanding, s.last_used))

    def fallback(self) -> EndpointState:
        """When none is up: the one that failed least (it may be back before the prober noticed)."""
        return min(self.states, key=lambda s: (s.failures, s.last_used))

    async def wait_up(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for some endpoint to be marked up; True if one was."""
        if timeout_s <= 0:
            return False
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    @asynccontextmanager
    async def track(self, state: EndpointState) -> AsyncIterator[EndpointState]:
        state.outstanding += 1
        state.last_used = time.monotonic()
        try:
            yield state
        finally:
            state.outstanding -= 1

    def mark_down(self, state: EndpointState, error: str) -> None:
        state.failures += 1
        state.last_error = error
        state.up = False

    def record_failure(self, state: EndpointState, error: str) -> None:
        state.failures += 1
        state.last_error = error

    def mark_up(self, state: EndpointState) -> None:
        state.failures = 0
        if not state.up:
            state.up = True
            self._changed.set()

    def down(self) -> list[EndpointState]:
        return [s for s in self.states if not s.up]

    def capacity(self) -> int:
        """Tasks the executors that are up run at once: the sum of their reported `pool_size` (1 for one that has not
        reported it). Never below one per executor, so that tasks still reach the client's retry and deadline logic
        (and then an infra_error) while none is up."""
        return max(len(self.states), sum(s.pool_size or 1 for s in self.states if s.up))


class Gate:
    """A semaphore whose limit may change while tasks wait: a rise admits waiters at once, a fall lets the holders
    finish and admits no one until fewer than the new limit hold it. Waiters are admitted in the order they came."""

    def __init__(self, limit: int) -> None:
        self.limit, self.active = limit, 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._admit()

    async def __aenter__(self) -> None:
        if self.active < self.limit and not self._waiters:
            self.active += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # `_admit` counted us in `active` before waking us: no later arrival can take the place
        except asyncio.CancelledError:
            if not waiter.cancelled():  # admitted, then cancelled before it ran: pass the place on
                self.active -= 1
                self._admit()
            elif waiter in self._waiters:  # `_admit` may have dropped it already
                self._waiters.remove(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.active -= 1
        self._admit()

    def _admit(self) -> None:
        while self._waiters and self.active < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.active += 1
                waiter.set_result(None)
