"""The replay buffer rides out an outage of its Redis: every call answers UNAVAILABLE naming Redis while it lasts,
the outage is logged once (started, still waiting, back), the buffer reconnects on its own and its Lua scripts are
loaded again into the new server (NOSCRIPT); past `services.outage_tolerance_s` it exits non-zero naming Redis."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio
from rb_service_helpers import Client, prompt

from fleet.config import load_config
from services.replay_buffer.embedded import socket_path_for, start_embedded_redis

CFG = load_config(None, [])
_ids = itertools.count()


def _count(log: list[str], text: str) -> int:
    return sum(text in line for line in log)


async def _wait_for(cond, within_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_buffer_rides_out_a_redis_outage_with_one_line_per_event(spawn, tmp_path: Path) -> None:
    # appendfsync always: the test asserts that a write acknowledged before the SIGKILL survives it, which everysec
    # does not promise (with a slow fsync in flight Redis postpones the AOF write up to 2 s and still replies; a CI
    # run under Docker-build I/O lost the "before" prompt that way).
    url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")
    prefix = f"outage{os.getpid()}x{next(_ids)}"
    svc = spawn(f"redis.url={url}", f"redis.key_prefix={prefix}", "services.outage_report_s=1")
    c = Client(svc.address, CFG)
    try:
        await c.call("EnqueuePrompts", groups=[prompt("before")])
        redis.kill()
        for _ in range(10):  # many calls during one outage: still one "unavailable" line
            with pytest.raises(aio.AioRpcError) as err:
                await c.call("EnqueuePrompts", groups=[prompt("during")])
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "redis at unix://" in (err.value.details() or "")
            await asyncio.sleep(0.25)
        await _wait_for(lambda: _count(svc.log, "still unavailable after") >= 1)
        url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")  # from its AOF; no scripts
        await _wait_for(lambda: _count(svc.log, "is back after") == 1)
        reply = await c.call("EnqueuePrompts", groups=[prompt("before"), prompt("after")])  # a Lua script again
        assert (reply.enqueued, reply.duplicates) == (1, 1)  # what was acknowledged before the kill survived
        assert svc.proc.poll() is None
        assert _count(svc.log, "is unavailable (") == 1, "".join(svc.log)
        assert _count(svc.log, "is back after") == 1
        assert _count(svc.log, "backend unavailable") == 0  # no line per failed call
    finally:
        await c.close()
        redis.stop()


async def test_buffer_exits_naming_redis_past_the_outage_bound(spawn, tmp_path: Path) -> None:
    url, redis = start_embedded_redis(tmp_path / "redis")
    svc = spawn(f"redis.url={url}", f"redis.key_prefix=bound{os.getpid()}", "services.outage_tolerance_s=2")
    redis.kill()
    rc = await asyncio.to_thread(svc.proc.wait, 60)
    text = "".join(svc.log)
    assert rc != 0, text
    assert f"redis at {url} has been down for" in text and "services.outage_tolerance_s=2" in text, text


async def test_buffer_started_while_redis_is_down_serves_once_it_is_back(spawn, tmp_path: Path) -> None:
    data_dir = tmp_path / "redis"
    url = f"unix://{socket_path_for(data_dir.resolve())}"  # nothing listens there yet (both restarting at once)
    svc = spawn(f"redis.url={url}", f"redis.key_prefix=late{os.getpid()}x{next(_ids)}")
    c = Client(svc.address, CFG)
    redis = None
    try:
        with pytest.raises(aio.AioRpcError) as err:
            await c.call("Stats")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"redis at {url} is unavailable" in (err.value.details() or "")
        url, redis = start_embedded_redis(data_dir)
        await _wait_for(lambda: _count(svc.log, "is back after") == 1)
        reply = await c.call("EnqueuePrompts", groups=[prompt("g0")])  # the consumer group was made on contact
        assert reply.enqueued == 1
        assert _count(svc.log, "consumer group missing") == 0
    finally:
        await c.close()
        if redis is not None:
            redis.stop()
