"""The launcher's embedded Redis is a supervised process: SIGKILLed, it is restarted from its AOF (nothing
acknowledged is lost), with the same restart limit and log lines as every other service, and stopped last."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest
from redis.asyncio import Redis

from launch.supervisor import Supervisor
from launch.topology import embedded_redis_process


async def _until(cond, within_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + within_s
    while not await cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_sigkilled_embedded_redis_is_restarted_from_its_aof(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    spec, url = embedded_redis_process(tmp_path / "redis", "everysec")
    sup = Supervisor([spec], tmp_path / "logs", cwd=tmp_path, max_restarts=3, echo=False)
    stop = asyncio.Event()
    client = Redis.from_url(url)
    caplog.set_level(logging.INFO, logger="launch.supervisor")
    try:
        await sup.start_all()
        watcher = asyncio.create_task(sup.watch(stop))
        await client.set("acknowledged", "yes")
        first = sup.procs["redis"].pid
        os.killpg(first, signal.SIGKILL)

        async def restarted() -> bool:
            proc = sup.procs["redis"]
            if proc.pid == first:
                return False
            try:
                return bool(await client.get("acknowledged") == b"yes")
            except Exception:  # still starting, or replaying its AOF
                return False

        await _until(restarted)
        assert sup.restarts["redis"] == 1
        assert any("redis exited with -9; restarting (1/3)" in r.getMessage() for r in caplog.records)
        stop.set()
        assert await asyncio.wait_for(watcher, 30) == 0
    finally:
        await client.aclose()
        await sup.stop_all(grace_s=10)
    assert sup.procs["redis"].returncode == 0  # SIGTERM: Redis flushed its AOF and exited cleanly
    # Its log is the launcher's, like every other process's: both lives of the server are in it.
    assert (tmp_path / "logs" / "redis.log").read_text().count("Redis is starting") == 2
