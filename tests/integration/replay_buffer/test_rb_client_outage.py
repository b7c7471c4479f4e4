"""Clients of the replay buffer ride out its outage (a SIGKILLed buffer restarted on the same address, or its Redis
down): calls wait with backoff instead of failing, the outage is logged once however many calls wait (started,
still waiting, back), and past `services.outage_tolerance_s` a call raises `ServiceDown` naming what is down.
`grpo-fleet status` shows the outage while it lasts."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from pathlib import Path

import pytest
from rb_service_helpers import worker

from buffer_client import BufferClient
from fleet.config import load_config
from launch.status import _gather
from services.replay_buffer.embedded import start_embedded_redis
from services.runtime.outage import ServiceDown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_calls_wait_through_a_buffer_restart_and_log_the_outage_once(
    spawn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    args = (f"run.dir={tmp_path / 'run'}", f"services.replay_buffer.port={port}")
    first = spawn(*args)
    cfg = load_config(None, [f"services.replay_buffer.port={port}", "services.outage_report_s=1"])
    client = BufferClient(cfg.services, cfg.redis, cfg.run.dir)
    caplog.set_level(logging.INFO, logger="services.runtime.outage")
    try:
        await client.register(worker("w1"))
        first.signal(signal.SIGKILL)
        await asyncio.to_thread(first.proc.wait, 10)
        waiting = [asyncio.create_task(client.heartbeat(worker("w1"))) for _ in range(4)]
        await asyncio.sleep(2.5)  # an outage of a few seconds, with several calls waiting through it
        assert not any(t.done() for t in waiting)
        spawn(*args)  # the launcher's restart: same address, same run directory (its Redis kept the registry)
        replies = await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
        assert all(r is not None for r in replies)
    finally:
        await client.close()
    assert len(_messages(caplog, "is unavailable (")) == 1, caplog.text
    assert _messages(caplog, "still unavailable after"), caplog.text
    assert len(_messages(caplog, "is back after")) == 1, caplog.text
    assert client.outage.outages == 1 and client.outage.last_duration_s > 2


async def test_a_call_past_the_bound_raises_naming_the_buffer() -> None:
    port = _free_port()  # nothing listens there
    cfg = load_config(None, [f"services.replay_buffer.port={port}", "services.outage_tolerance_s=1.5"])
    client = BufferClient(cfg.services, cfg.redis, cfg.run.dir)
    try:
        with pytest.raises(ServiceDown) as err:
            await client.heartbeat(worker("w1"))
    finally:
        await client.close()
    message = str(err.value)
    assert f"replay buffer at 127.0.0.1:{port} has been down for" in message
    assert "services.outage_tolerance_s=1.5" in message and "UNAVAILABLE" in message


async def test_redis_outage_is_named_by_clients_and_status(spawn, tmp_path: Path) -> None:
    url, redis = start_embedded_redis(tmp_path / "redis")
    try:
        svc = spawn(f"redis.url={url}")
        port = svc.address.rsplit(":", 1)[1]
        cfg = load_config(None, [f"services.replay_buffer.port={port}", "services.outage_tolerance_s=2",
                                 f"services.trainer.port={_free_port()}", "services.rpc_timeout_s=5"])
        client = BufferClient(cfg.services, cfg.redis, cfg.run.dir)
        try:
            await client.register(worker("w1"))
            redis.kill()
            lines = await _gather(cfg)
            assert any(ln.startswith("buffer    OUTAGE: its Redis is down (redis at unix://") for ln in lines), lines
            assert any(ln.startswith("trainer   OUTAGE: unreachable at") for ln in lines), lines
            with pytest.raises(ServiceDown) as err:
                await client.heartbeat(worker("w1"))
            assert "replay buffer at" in str(err.value) and f"redis at {url}" in str(err.value)
        finally:
            await client.close()
    finally:
        redis.stop()
