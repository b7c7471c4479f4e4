"""`SandboxClient` against real executors: failover without losing a verdict, recovery, auth, deadlines, and as many
tasks in flight as the executors have runners."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_helpers import UID_BASE, CalcRepo, eventually

from fleet.config import load_config
from fleet.config.infra import SandboxConfig
from sandbox_client import (
    SandboxAuthError,
    SandboxClient,
    SandboxRequestError,
    SandboxUnavailable,
    reward_from_verdict,
)
from services.sandbox.executor import Executor
from services.sandbox.server import SandboxServer

SLOW = "sleep 2 && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -p no:cacheprovider -q tests"


def _cfg(base: SandboxConfig, tmp_path: Path, name: str, slot_offset: int) -> SandboxConfig:
    # Two executors on one host: separate trees and separate slot uids.
    return base.model_copy(update={"work_root": str(tmp_path / name), "uid_base": UID_BASE + slot_offset})


@pytest.fixture
async def pair(sandbox_cfg: SandboxConfig, tmp_path: Path) -> AsyncIterator[list[SandboxServer]]:
    servers = [SandboxServer(_cfg(sandbox_cfg, tmp_path, n, 4 * i)) for i, n in enumerate(("a", "b"))]
    for server in servers:
        await server.start()
    try:
        yield servers
    finally:
        for server in servers:
            if server.failed is not None:
                await server.stop(0)


def _urls(servers: list[SandboxServer]) -> list[str]:
    return [f"http://127.0.0.1:{s.port}" for s in servers]


@pytest.fixture
async def start_server(sandbox_cfg: SandboxConfig) -> AsyncIterator[Any]:
    """`await start_server(pool_size)`: a real executor of that many runners, stopped at the end."""
    started: list[SandboxServer] = []

    async def start(pool_size: int) -> SandboxServer:
        server = SandboxServer(sandbox_cfg.model_copy(update={"pool_size": pool_size}))
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop(0)


class PeakTasks:
    """The most tasks an executor held at once, running or queued for a slot, counted where it takes them."""

    def __init__(self, executor: Executor) -> None:
        self.now = self.peak = 0
        run = executor.run

        async def counted(spec: Any, **kw: Any) -> Any:
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                return await run(spec, **kw)
            finally:
                self.now -= 1

        executor.run = counted  # type: ignore[method-assign]


async def test_executor_killed_mid_run_loses_no_verdict_and_comes_back(pair: list[SandboxServer],
                                                                       calc_repo: CalcRepo) -> None:
    a, b = pair
    url_a, url_b = _urls(pair)
    specs = [calc_repo.spec(calc_repo.gold if i % 2 == 0 else "", test_command=SLOW) for i in range(6)]
    async with SandboxClient([url_a, url_b], task_timeout=120, max_concurrency=6, probe_interval_s=0.2,
                             backoff_s=0.05) as client:
        batch = asyncio.create_task(client.evaluate_many(specs))
        await eventually(lambda: a.executor.running > 0 and b.executor.running > 0, what="both executors busy")
        await a.stop(0)  # killed: its running sandboxes die, its port closes
        results = await asyncio.wait_for(batch, 120)
        assert all(r.ok and r.verdict is not None for r in results), [r.infra_error for r in results]
        assert [r.verdict.resolution for r in results if r.verdict] == ["FULL", "NO"] * 3
        retried = [r for r in results if r.attempts > 1]
        assert retried and all(r.executor == url_b for r in retried)
        # Marked down by the failed requests, or by the next probe on a busy machine where a's tasks ended first.
        await eventually(lambda: not next(s for s in client.endpoint_states() if s.url == url_a).up, 10,
                         "the killed executor to be marked down")
        assert next(s for s in client.endpoint_states() if s.url == url_a).last_error

        restarted = SandboxServer(a.cfg, port=a.port)
        await restarted.start()
        try:
            await eventually(lambda: next(s for s in client.endpoint_states() if s.url == url_a).up, 10,
                             "the restarted executor to be marked up")
            again = await client.evaluate_many([calc_repo.spec(calc_repo.gold) for _ in range(4)])
            assert {r.executor for r in again} == {url_a, url_b}  # least outstanding uses both again
            assert all(r.verdict is not None and r.verdict.resolution == "FULL" for r in again)
        finally:
            await restarted.stop(0)


async def test_wrong_token_is_a_clear_error(sandbox_cfg: SandboxConfig, calc_repo: CalcRepo) -> None:
    server = SandboxServer(sandbox_cfg.model_copy(update={"auth_token": "right"}))
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        async with SandboxClient([url], token="wrong") as client:
            with pytest.raises(SandboxAuthError, match="rejected the token.*wrong bearer token.*auth_token"):
                await client.evaluate(calc_repo.spec(calc_repo.gold))
        async with SandboxClient([url], token="right") as client:
            assert (await client.run(calc_repo.spec(calc_repo.gold))).resolution == "FULL"
    finally:
        await server.stop(0)


async def test_deadline_gives_an_infra_error_and_cancels_the_task(server: SandboxServer, calc_repo: CalcRepo) -> None:
    async with SandboxClient([f"http://127.0.0.1:{server.port}"], poll_wait_s=0.5) as client:
        result = await client.evaluate(calc_repo.spec("", test_command="sleep 60"), deadline_s=2)
    assert result.verdict is None and result.infra_error and "deadline" in result.infra_error
    await asyncio.sleep(0.5)
    assert server.tasks == {} and server.executor.running == 0


async def test_no_executor_is_an_infra_error_never_a_verdict(calc_repo: CalcRepo) -> None:
    async with SandboxClient(["http://127.0.0.1:9"], max_retries=2, backoff_s=0.01, probe_interval_s=0.1) as client:
        result = await client.evaluate(calc_repo.spec(calc_repo.gold), deadline_s=3)
        assert result.verdict is None and result.infra_error is not None and not result.ok
        with pytest.raises(SandboxUnavailable):
            await client.run(calc_repo.spec(calc_repo.gold))


async def test_a_bad_task_raises_naming_the_field(server: SandboxServer, calc_repo: CalcRepo) -> None:
    async with SandboxClient([f"http://127.0.0.1:{server.port}"]) as client:
        with pytest.raises(SandboxRequestError) as info:
            await client.evaluate(calc_repo.spec("", fail_to_pass=["--bad::x"]))
    assert info.value.field == "fail_to_pass"


async def test_from_config_and_reward(server: SandboxServer, calc_repo: CalcRepo) -> None:
    cfg = load_config(None, [f"env.code.sandbox_urls=[http://127.0.0.1:{server.port}]", "env.code.task_timeout=60",
                             "env.code.reward_mode=pass_rate"])
    async with SandboxClient.from_config(cfg.env.code) as client:
        partial = calc_repo.diff({"calc/core.py": (calc_repo.path / "calc/core.py").read_text().replace(
            "return a - b", "return a + b")})
        verdict = await client.run(calc_repo.spec(partial))
    assert verdict.resolution == "PARTIAL"
    assert reward_from_verdict(verdict, cfg.env.code.reward_mode) == pytest.approx(4 / 6)
    assert reward_from_verdict(verdict, "binary") == 0.0


async def test_without_num_workers_one_client_fills_every_runner(start_server: Any, calc_repo: CalcRepo) -> None:
    server = await start_server(5)  # more runners than the old fixed 4
    tasks = PeakTasks(server.executor)
    url = f"http://127.0.0.1:{server.port}"
    # No probe loop during the test: the first batch is sized by the one probe before admitting it.
    async with SandboxClient([url], task_timeout=120, probe_interval_s=600) as client:
        results = await client.evaluate_many([calc_repo.spec(calc_repo.gold, test_command=SLOW) for _ in range(10)])
        assert client.in_flight_limit == 5
    assert all(r.verdict is not None and r.verdict.resolution == "FULL" for r in results)
    assert tasks.peak == 5  # every runner busy, and nothing queued behind them
    capped = PeakTasks(server.executor)
    async with SandboxClient([url], task_timeout=120, max_concurrency=2) as client:
        results = await client.evaluate_many([calc_repo.spec(calc_repo.gold) for _ in range(4)])
    assert all(r.ok for r in results) and capped.peak == 2


async def test_tasks_in_flight_follow_executors_going_down_and_coming_back(pair: list[SandboxServer],
                                                                          calc_repo: CalcRepo) -> None:
    a, _ = pair
    async with SandboxClient(_urls(pair), task_timeout=120, probe_interval_s=0.1) as client:
        assert client.in_flight_limit == 2  # one per executor until they have answered
        assert (await client.evaluate(calc_repo.spec(calc_repo.gold))).ok
        assert client.in_flight_limit == 4  # two runners each
        await a.stop(0)
        await eventually(lambda: client.in_flight_limit == 2, 10, "the stopped executor's runners to stop counting")
        restarted = SandboxServer(a.cfg.model_copy(update={"pool_size": 3}), port=a.port)
        await restarted.start()
        try:
            await eventually(lambda: client.in_flight_limit == 5, 10, "the restarted executor's 3 runners to count")
            results = await client.evaluate_many([calc_repo.spec(calc_repo.gold) for _ in range(5)])
            assert all(r.ok for r in results)
        finally:
            await restarted.stop(0)


async def test_time_queued_behind_other_workers_does_not_count_against_the_deadline(
        start_server: Any, calc_repo: CalcRepo) -> None:
    server = await start_server(1)
    url = f"http://127.0.0.1:{server.port}"
    # Three rollout workers share one runner; each fills it, so two tasks queue behind the first, slow one.
    async with SandboxClient([url]) as first, SandboxClient([url], poll_wait_s=0.5) as second, \
            SandboxClient([url], poll_wait_s=0.5) as wedged:
        slow_spec = calc_repo.spec(calc_repo.gold, test_command=SLOW.replace("sleep 2", "sleep 10"))
        slow = asyncio.create_task(first.evaluate(slow_spec))
        await eventually(lambda: server.executor.running == 1, what="the slow task to hold the runner")
        queued = asyncio.create_task(second.evaluate(calc_repo.spec(calc_repo.gold), deadline_s=4))
        # Queueing stretches a deadline to 5 times its length, no more: 1.5 s becomes 7.5 s, before the runner frees.
        given_up = await wedged.evaluate(calc_repo.spec(calc_repo.gold), deadline_s=1.5)
        assert given_up.verdict is None and given_up.infra_error is not None
        assert "deadline of 1.5 s (+6.0 s queued at executors) exceeded" in given_up.infra_error
        result = await queued
        assert (await slow).ok
    assert result.verdict is not None and result.verdict.resolution == "FULL", result.infra_error
    assert result.verdict.timings["queued_s"] > 4 and result.elapsed_s > 4  # it waited past its deadline's length
