"""`fleet.singleflight.SingleFlight`: each key runs once while it is kept or running; callers never share a result
object; only what `keep` accepts is kept, the least recently used leaving first; a failure reaches every waiter and
is not kept."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from fleet.singleflight import SingleFlight

T = TypeVar("T")


async def test_a_kept_result_is_answered_without_running_again_as_a_copy() -> None:
    cache: SingleFlight[dict[str, list[int]]] = SingleFlight(4, keep=lambda r: True)
    runs = 0

    async def run() -> dict[str, list[int]]:
        nonlocal runs
        runs += 1
        return {"tests": [1, 2]}

    first = await cache.get_or_run("k", run)
    first["tests"].append(3)  # a caller changing its result changes no one else's
    again = await cache.get_or_run("k", run)
    assert runs == 1 and again == {"tests": [1, 2]} and cache.stats() == {"hits": 1, "misses": 1, "kept": 1}


async def test_callers_of_a_running_key_wait_for_its_one_run() -> None:
    cache: SingleFlight[int] = SingleFlight(4, keep=lambda r: True)
    gate = asyncio.Event()
    runs = 0

    async def run() -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        return 7

    waiting = [asyncio.create_task(cache.get_or_run("k", run)) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiting) == [7, 7, 7] and runs == 1
    assert cache.stats() == {"hits": 2, "misses": 1, "kept": 1}


async def test_what_keep_refuses_runs_every_time() -> None:
    cache: SingleFlight[str] = SingleFlight(4, keep=lambda r: r != "timeout")
    assert [await cache.get_or_run("k", _value("timeout")) for _ in range(2)] == ["timeout", "timeout"]
    assert cache.stats() == {"hits": 0, "misses": 2, "kept": 0}


async def test_the_least_recently_used_leaves_first() -> None:
    cache: SingleFlight[str] = SingleFlight(2, keep=lambda r: True)
    for key in ("a", "b"):
        await cache.get_or_run(key, _value(key))
    await cache.get_or_run("a", _value("never"))  # a is now the most recent
    await cache.get_or_run("c", _value("c"))  # b leaves
    assert await cache.get_or_run("a", _value("never")) == "a"
    assert await cache.get_or_run("b", _value("b again")) == "b again"


async def test_a_failure_reaches_every_waiter_and_is_not_kept() -> None:
    cache: SingleFlight[int] = SingleFlight(4, keep=lambda r: True)
    gate = asyncio.Event()

    async def fail() -> int:
        await gate.wait()
        raise OSError("disk full")

    waiting = [asyncio.create_task(cache.get_or_run("k", fail)) for _ in range(2)]
    await asyncio.sleep(0)
    gate.set()
    for outcome in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(outcome, OSError)
    assert await cache.get_or_run("k", _value(1)) == 1


async def test_a_waiter_whose_run_was_cancelled_runs_it_itself() -> None:
    cache: SingleFlight[int] = SingleFlight(4, keep=lambda r: True)
    started = asyncio.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(60)
        return 0

    owner = asyncio.create_task(cache.get_or_run("k", slow))
    await started.wait()
    waiter = asyncio.create_task(cache.get_or_run("k", _value(5)))
    await asyncio.sleep(0)
    owner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await owner
    assert await waiter == 5


def _value(v: T) -> Callable[[], Awaitable[T]]:
    async def run() -> T:
        return v
    return run
