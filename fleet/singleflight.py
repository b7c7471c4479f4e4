"""A bounded cache that runs each key once: a result already kept is answered from memory, one being computed is
waited for. The rollout worker keys verdicts by the whole task spec (`rollout/scoring.py`); the sandbox's executor
keys them by the tree the tests would run on (`services/sandbox/executor.py`)."""

from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class SingleFlight(Generic[V]):
    """`size` results by key, least recently used first out; `keep(result)` says which are worth keeping. Every
    caller gets its own deep copy, so one caller's changes never reach another's. Counts hits and misses."""

    def __init__(self, size: int, keep: Callable[[V], bool]) -> None:
        self.size = size
        self.keep = keep
        self.hits = self.misses = 0
        self._done: OrderedDict[str, V] = OrderedDict()
        self._running: dict[str, asyncio.Future[V]] = {}

    async def get_or_run(self, key: str, run: Callable[[], Awaitable[V]]) -> V:
        if key in self._done:
            self._done.move_to_end(key)
            self.hits += 1
            return copy.deepcopy(self._done[key])
        shared = self._running.get(key)
        if shared is not None:
            try:
                result = await asyncio.shield(shared)
                self.hits += 1
                return copy.deepcopy(result)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this caller was cancelled, not the run it waited for
                # The run it waited for was cancelled (its caller stopped): run it here instead.
        self.misses += 1
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            result = await run()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when no other caller waited
            raise
        finally:
            self._running.pop(key, None)
        future.set_result(result)
        if self.size and self.keep(result):
            self.put(key, result)
            self.on_kept(key, result)
        return result

    def put(self, key: str, result: V) -> None:
        """Keep `result` under `key` (a copy), the least recently used out past `size`."""
        self._done[key] = copy.deepcopy(result)
        self._done.move_to_end(key)
        while len(self._done) > self.size:
            self._done.popitem(last=False)

    def on_kept(self, key: str, result: V) -> None:
        """Called once a run's result is kept: a subclass may record it elsewhere too."""

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "kept": len(self._done)}
