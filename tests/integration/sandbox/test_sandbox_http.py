"""The HTTP API on a real server at 127.0.0.1:0: the seed's /task/* protocol, errors that name the problem, auth,
expiry, draining, and `main()` as `grpo-fleet serve sandbox` runs it."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from sandbox_helpers import UID_BASE, CalcRepo, eventually

from fleet.config.infra import SandboxConfig
from services.sandbox.server import SandboxServer

SLOW = "sleep {s} && PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -p no:cacheprovider -q tests"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _url(server: SandboxServer) -> str:
    return f"http://127.0.0.1:{server.port}"


async def _submit(http: aiohttp.ClientSession, server: SandboxServer, body: dict[str, object]) -> str:
    async with http.post(f"{_url(server)}/task/submit", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return str((await resp.json())["task_id"])


async def test_submit_then_202_then_verdict(server: SandboxServer, calc_repo: CalcRepo,
                                            http: aiohttp.ClientSession) -> None:
    spec = calc_repo.spec(calc_repo.gold, test_command=SLOW.format(s=1))
    task_id = await _submit(http, server, spec.to_json())
    async with http.get(f"{_url(server)}/task/{task_id}/result") as resp:
        assert resp.status == 202 and (await resp.json())["status"] in ("pending", "running")
    async with http.get(f"{_url(server)}/task/{task_id}/result?wait=60") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["task_id"] == task_id and body["status"] == "completed" and body["resolution"] == "FULL"
    for key in ("patch_applied", "test_patch_applied", "tests_passed", "tests_failed", "exit_code", "test_status",
                "stdout_tail", "stderr_tail", "timings"):
        assert key in body
    async with http.delete(f"{_url(server)}/task/{task_id}") as resp:
        assert resp.status == 200
    async with http.get(f"{_url(server)}/task/{task_id}/result") as resp:
        assert resp.status == 404 and "unknown task id" in (await resp.json())["error"]


async def test_bad_requests_are_400_naming_the_field(server: SandboxServer, calc_repo: CalcRepo,
                                                     http: aiohttp.ClientSession) -> None:
    good = calc_repo.spec("").to_json()
    cases = [({k: v for k, v in good.items() if k != "repo_url"}, "repo_url"), ({**good, "timeout": -1}, "timeout"),
             ({**good, "fail_to_pass": "nope"}, "fail_to_pass"), ({**good, "bogus": 1}, "bogus")]
    for body, field in cases:
        async with http.post(f"{_url(server)}/task/submit", json=body) as resp:
            data = await resp.json()
            assert resp.status == 400 and data["field"] == field and data["error"].startswith(f"{field}: ")
    async with http.post(f"{_url(server)}/task/submit", data=b"{not json") as resp:
        assert resp.status == 400 and (await resp.json())["field"] == "body"
    async with http.get(f"{_url(server)}/task/x/result?wait=abc") as resp:
        assert resp.status in (400, 404)
    async with http.get(f"{_url(server)}/nowhere") as resp:
        assert resp.status == 404 and "error" in await resp.json()
    async with http.put(f"{_url(server)}/task/submit") as resp:
        assert resp.status == 405 and "error" in await resp.json()


async def test_bearer_token(sandbox_cfg: SandboxConfig, calc_repo: CalcRepo, http: aiohttp.ClientSession) -> None:
    server = SandboxServer(sandbox_cfg.model_copy(update={"auth_token": "s3cret"}))
    await server.start()
    try:
        body = calc_repo.spec("").to_json()
        for headers, why in [({}, "missing"), ({"Authorization": "Bearer nope"}, "wrong"),
                             ({"Authorization": "Basic s3cret"}, "wrong")]:
            async with http.post(f"{_url(server)}/task/submit", json=body, headers=headers) as resp:
                data = await resp.json()
                assert resp.status == 401 and f"{why} bearer token" in data["error"]
        async with http.get(f"{_url(server)}/healthz") as resp:
            assert resp.status == 200  # probes need no token
            # What the tests' node ids depend on: a client compares it with the task set's (`data validate`).
            assert (await resp.json())["test_runner"] == {"python": platform.python_version(),
                                                         "pytest": pytest.__version__}
        async with http.post(f"{_url(server)}/task/submit", json=body,
                             headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
    finally:
        await server.stop(0)


async def test_results_expire_after_ttl(sandbox_cfg: SandboxConfig, calc_repo: CalcRepo,
                                        http: aiohttp.ClientSession) -> None:
    server = SandboxServer(sandbox_cfg.model_copy(update={"result_ttl_s": 0.5}))
    await server.start()
    try:
        task_id = await _submit(http, server, calc_repo.spec("", test_command="true").to_json())
        async with http.get(f"{_url(server)}/task/{task_id}/result?wait=30") as resp:
            assert resp.status == 200
        await asyncio.sleep(1.5)
        async with http.get(f"{_url(server)}/task/{task_id}/result") as resp:
            assert resp.status == 404
    finally:
        await server.stop(0)


async def test_full_queue_answers_503(sandbox_cfg: SandboxConfig, calc_repo: CalcRepo,
                                      http: aiohttp.ClientSession) -> None:
    server = SandboxServer(sandbox_cfg.model_copy(update={"max_pending": 1}))
    await server.start()
    try:
        await _submit(http, server, calc_repo.spec("", test_command="sleep 30").to_json())
        async with http.post(f"{_url(server)}/task/submit", json=calc_repo.spec("").to_json()) as resp:
            assert resp.status == 503 and "full" in (await resp.json())["error"]
    finally:
        await server.stop(0)


async def test_draining_finishes_running_tasks_and_refuses_new_ones(server: SandboxServer, calc_repo: CalcRepo,
                                                                    http: aiohttp.ClientSession) -> None:
    task_id = await _submit(http, server, calc_repo.spec(calc_repo.gold, test_command=SLOW.format(s=1)).to_json())
    await eventually(lambda: server.executor.running > 0, what="the task to run")
    stopping = asyncio.create_task(server.stop(grace_s=60))
    await asyncio.sleep(0.1)
    async with http.get(f"{_url(server)}/healthz") as resp:
        assert resp.status == 503 and (await resp.json())["draining"] is True
    async with http.post(f"{_url(server)}/task/submit", json=calc_repo.spec("").to_json()) as resp:
        assert resp.status == 503 and (await resp.json())["draining"] is True
    async with http.get(f"{_url(server)}/task/{task_id}/result?wait=60") as resp:
        assert resp.status == 200 and (await resp.json())["resolution"] == "FULL"
    await asyncio.wait_for(stopping, 30)


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    overrides = ["services.sandbox.port=0", "sandbox.pool_size=1", f"sandbox.uid_base={UID_BASE}",
                 f"sandbox.work_root={tmp_path / 'work'}", "services.grace_s=5"]
    code = f"import sys; from services.sandbox.server import main; sys.exit(main({overrides!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[3], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        port, deadline = None, time.monotonic() + 60
        assert proc.stderr is not None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the server exited before listening"
            if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
        assert port and port != 0
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            assert resp.status == 200 and json.load(resp)["pool_size"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
