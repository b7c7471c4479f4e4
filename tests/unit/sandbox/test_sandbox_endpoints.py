"""Executor selection: least outstanding first, failed ones avoided, down ones waited for until they come back."""

from __future__ import annotations

import asyncio

import pytest

from fleet.contracts.sandbox import Verdict
from sandbox_client.endpoints import EndpointPool
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
