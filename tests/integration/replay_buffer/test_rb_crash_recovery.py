"""The service as a real process (`python -m launch.cli serve replay-buffer`): SIGKILL and restart, Redis killed and
restarted from its AOF, SIGTERM drain. No acknowledged group is lost, and every group trains exactly once."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rb_service_helpers import Client, begin, groups_of, invariant_holds, lease, prompt, scored, submit, worker
from redis.asyncio import Redis

from fleet.config import load_config
from services.replay_buffer.embedded import socket_path_for, start_embedded_redis
from services.replay_buffer.models import StoreSettings
from services.replay_buffer.store import ReplayStore

_ids = itertools.count()
CFG = load_config(None, [])
# Stats that must read the same after a restart.
DURABLE = ("enqueued", "leased", "submitted", "sampled", "prompts_pending", "leases_outstanding", "groups_ready")
DURABLE += ("epoch", "current_step", "dead_lettered")
# Leases must outlive the restart here, so that what is compared is what was stored, not what the reclaimer did since.
LONG_LEASES = "replay_buffer.lease_timeout_s=120"


def _prefix() -> str:
    return f"crash{os.getpid()}x{next(_ids)}"


async def _mid_run(c: Client) -> tuple[int, list, set[str]]:  # type: ignore[type-arg]
    """Six groups: one sampled, one scored and waiting, two leased, two queued."""
    await c.call("EnqueuePrompts", groups=[prompt(f"g{i}") for i in range(6)])
    epoch = await begin(c, "w1")
    leases = list((await lease(c, "w1", 0, epoch, 4)).leases)
    for x in leases[:2]:
        await submit(c, "w1", x.lease_id, scored(x.group, 0))
    sampled = {g.prompt.group_id for g in await groups_of(c, await c.call("Sample", step=0, num_groups=1))}
    assert len(sampled) == 1
    return epoch, leases[2:], sampled


async def _finish(c: Client, epoch: int, outstanding: list, sampled: set[str]) -> None:  # type: ignore[type-arg]
    """Submit the leases granted before the crash, lease and submit the rest, and sample everything: each of the six
    groups is trained exactly once."""
    for x in outstanding:
        assert not (await submit(c, "w1", x.lease_id, scored(x.group, 0))).duplicate
    await c.call("RegisterWorker", worker=worker("w1", 0, epoch))
    for x in (await lease(c, "w1", 0, epoch)).leases:
        await submit(c, "w1", x.lease_id, scored(x.group, 0))
    reply = await c.call("Sample", step=0, num_groups=6, deadline_ms=2000, min_groups=1)
    later = [g.prompt.group_id for g in await groups_of(c, reply)]
    assert len(later) == len(set(later)) == 5 and not set(later) & sampled
    stats = await c.call("Stats")
    assert (stats.enqueued, stats.sampled, stats.prompts_pending, stats.groups_ready) == (6, 6, 0, 0)
    assert invariant_holds(stats)


async def _accounting_ok(url: str, prefix: str) -> None:
    client = Redis.from_url(url)
    try:
        acc = await ReplayStore(client, StoreSettings(prefix=prefix)).accounting()
        assert acc.ok, acc.violations
    finally:
        await client.aclose()


async def test_service_sigkilled_and_restarted_loses_nothing(spawn, tmp_path: Path) -> None:
    prefix, run_dir = _prefix(), tmp_path / "run"
    args = (f"run.dir={run_dir}", f"redis.key_prefix={prefix}", LONG_LEASES)  # embedded Redis in the run directory
    first = spawn(*args)
    data_plane = {"redis_url": f"unix://{socket_path_for((run_dir / 'redis').resolve())}", "prefix": prefix}
    c = Client(first.address, CFG, **data_plane)
    try:
        epoch, outstanding, sampled = await _mid_run(c)
        before = await c.call("Stats")
    finally:
        await c.close()
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    second = spawn(*args)
    c = Client(second.address, CFG, **data_plane)
    try:
        after = await c.call("Stats")
        assert [getattr(after, f) for f in DURABLE] == [getattr(before, f) for f in DURABLE]
        await _accounting_ok(f"unix://{socket_path_for((run_dir / 'redis').resolve())}", prefix)
        await _finish(c, epoch, outstanding, sampled)
    finally:
        await c.close()


async def test_redis_restarted_from_its_aof_loses_no_acknowledged_group(spawn, tmp_path: Path) -> None:
    prefix = _prefix()
    # always: everysec may answer before its AOF write while an fsync is slow (test_rb_redis_outage.py says more).
    url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")
    try:
        svc = spawn(f"redis.url={url}", f"redis.key_prefix={prefix}", LONG_LEASES)
        c = Client(svc.address, CFG, redis_url=url, prefix=prefix)
        try:
            epoch, outstanding, sampled = await _mid_run(c)
            before = await c.call("Stats")
            redis.kill()  # SIGKILL: only what Redis had written to its AOF survives
            with pytest.raises(aio.AioRpcError) as err:
                await c.call("Stats")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")
            after = await _retry_unavailable(lambda: c.call("Stats"))
            assert [getattr(after, f) for f in DURABLE] == [getattr(before, f) for f in DURABLE]
            await _accounting_ok(url, prefix)
            await _finish(c, epoch, outstanding, sampled)
            assert svc.proc.poll() is None  # the service rode it out
        finally:
            await c.close()
    finally:
        redis.stop()


async def _retry_unavailable(fn):  # type: ignore[no-untyped-def]
    for _ in range(50):
        try:
            return await fn()
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            await asyncio.sleep(0.1)
    return await fn()


async def test_sigterm_drains_in_flight_calls_and_exits_zero(spawn, tmp_path: Path) -> None:
    svc = spawn(f"run.dir={tmp_path / 'run'}", f"redis.key_prefix={_prefix()}", "services.grace_s=5")
    c = Client(svc.address, CFG)
    try:
        health = health_pb2_grpc.HealthStub(c.channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=20)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        waiting = asyncio.create_task(c.call("Sample", step=0, num_groups=1, deadline_ms=1500))
        await asyncio.sleep(0.3)  # the Sample is now in flight, waiting for groups
        svc.signal(signal.SIGTERM)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        reply = await waiting  # finished within the grace period, with its starvation report
        assert reply.starvation.reason == "no_prompts"
        watch.cancel()
        assert await asyncio.to_thread(svc.proc.wait, 20) == 0
    finally:
        await c.close()
    assert any("stopped" in line for line in svc.log)
