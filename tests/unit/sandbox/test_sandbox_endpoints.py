"""Executor selection: least outstanding first, failed ones avoided, down ones waited for until they come back; the
capacity of the ones that are up, and the gate it sizes."""

from __future__ import annotations

import asyncio

import pytest

from fleet.contracts.sandbox import Verdict
from sandbox_client.endpoints import EndpointPool, Gate
from sandbox_client.results import SandboxResult


async def test_least_outstanding_wins_and_ties_rotate() -> None:
    pool = EndpointPool(["http://a", "http://b/", "http://a"])
    assert [s.url for s in pool.states] == ["http://a", "http://b"]
    a, b = pool.states
    async with pool.track(a):
        assert pool.pick(set()) is b
        async with pool.track(b), pool.track(b):
            assert pool.pick(set()) is a
    first = pool.pick(set())
    assert first is not None
    async with pool.track(first):
        pass
    assert pool.pick(set()) is not first


async def test_failed_endpoints_are_avoided_while_others_are_up() -> None:
    pool = EndpointPool(["http://a", "http://b"])
    a, b = pool.states
    assert pool.pick({"http://a"}) is b
    pool.mark_down(b, "refused")
    assert pool.pick({"http://a"}) is a  # avoided, but the only one up


async def test_waiting_for_an_endpoint_to_come_back() -> None:
    pool = EndpointPool(["http://a", "http://b"])
    a, b = pool.states
    pool.mark_down(a, "gone")
    pool.mark_down(b, "gone")
    pool.mark_down(b, "gone again")
    assert pool.pick(set()) is None and pool.fallback() is a  # fewest failures: tried anyway
    assert await pool.wait_up(0.05) is False
    waiter = asyncio.create_task(pool.wait_up(5))
    await asyncio.sleep(0.05)
    pool.mark_up(b)
    assert await asyncio.wait_for(waiter, 1) is True
    assert pool.pick({"http://b"}, fresh_only=True) is None and pool.pick({"http://b"}) is b


def test_pool_needs_urls() -> None:
    with pytest.raises(ValueError, match="sandbox_urls"):
        EndpointPool([])


def test_a_result_is_a_verdict_or_an_infra_failure_never_a_mix() -> None:
    ok = SandboxResult(Verdict(status="completed"), executor="http://a", attempts=2)
    assert ok.ok and ok.retries == 1
    assert not SandboxResult(None, infra_error="down").ok
    with pytest.raises(ValueError):
        SandboxResult(None)
    with pytest.raises(ValueError):
        SandboxResult(Verdict(status="infra_error", error="disk full"))


def test_capacity_counts_the_runners_of_executors_that_are_up() -> None:
    pool = EndpointPool(["http://a", "http://b", "http://c"])
    a, b, c = pool.states
    a.pool_size, b.pool_size = 12, 4
    assert pool.capacity() == 12 + 4 + 1  # c has not reported its pool: one
    pool.mark_down(a, "gone")
    assert pool.capacity() == 4 + 1
    pool.mark_up(a)
    assert pool.capacity() == 12 + 4 + 1
    for state in pool.states:
        pool.mark_down(state, "gone")
    assert pool.capacity() == 3  # one per executor while none is up: tasks still reach the retries


async def _entered(gate: Gate) -> None:
    async with gate:
        await asyncio.Event().wait()  # held until cancelled


async def _settle() -> None:
    for _ in range(5):  # enough loop turns for every woken waiter to run
        await asyncio.sleep(0)


async def test_gate_admits_waiters_when_its_limit_rises() -> None:
    gate = Gate(1)
    holders = [asyncio.create_task(_entered(gate)) for _ in range(3)]
    await _settle()
    assert gate.active == 1 and [h.done() for h in holders] == [False] * 3
    gate.set_limit(3)
    await _settle()
    assert gate.active == 3
    for holder in holders:
        holder.cancel()
    await asyncio.gather(*holders, return_exceptions=True)
    assert gate.active == 0


async def test_gate_lowered_lets_holders_finish_and_admits_no_one_above_it() -> None:
    gate = Gate(2)
    first, second = asyncio.create_task(_entered(gate)), asyncio.create_task(_entered(gate))
    await _settle()
    waiter = asyncio.create_task(_entered(gate))
    gate.set_limit(1)
    first.cancel()
    await _settle()
    assert gate.active == 1 and not waiter.done()  # second still holds the one place
    second.cancel()
    await _settle()
    assert gate.active == 1  # the waiter got it
    waiter.cancel()
    await asyncio.gather(first, second, waiter, return_exceptions=True)
    assert gate.active == 0


async def test_gate_passes_on_the_place_of_a_waiter_cancelled_after_admission() -> None:
    gate = Gate(1)
    await gate.__aenter__()
    first, second = asyncio.create_task(_entered(gate)), asyncio.create_task(_entered(gate))
    await _settle()
    await gate.__aexit__(None, None, None)  # admits `first`...
    first.cancel()  # ...which is cancelled before it runs
    await _settle()
    assert first.cancelled() and gate.active == 1 and not second.done()  # second holds the place first gave back
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert gate.active == 0 and not gate._waiters
