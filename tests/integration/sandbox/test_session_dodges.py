"""A hostile policy's inputs and a buggy client's requests, against a real executor and HTTP server: each is scored
(a 4xx the agent sees as an `error:` observation) or refused, never a 500 that is retried into an unscored group;
sessions are reachable only with their key; and after each the executor is healthy and grades a gold fix FULL."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sandbox_helpers import CORE, FIXED, CalcRepo, exists, server_url, session_client, session_server

from envs.agent.parser import ToolCall
from envs.agent.tools import ToolBox
from fleet.config.infra import SandboxConfig
from sandbox_client.results import SandboxRequestError
from sandbox_client.sessions import SandboxSession, SessionClient
from services.sandbox.server import SandboxServer

DEEP = "/".join(["d"] * 1100)


@pytest.fixture
async def srv(sandbox_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    async with session_server(sandbox_cfg, lease_s=30.0, max_output_kb=4, exec_timeout_s=20) as server:
        yield server


@pytest.fixture
async def client(srv: SandboxServer) -> AsyncIterator[SessionClient]:
    async with session_client(srv) as c:
        yield c


async def _raw(srv: SandboxServer, session: SandboxSession, method: str, verb: str, **kw: Any) -> tuple[int, Any]:
    url = f"{server_url(srv)}/session/{session.id}/{verb}"
    async with aiohttp.ClientSession() as http, http.request(
            method, url, headers={"X-Session-Key": session.key}, **kw) as r:
        return r.status, await r.json()


async def _still_grades_gold(srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{server_url(srv)}/healthz") as r:
        assert r.status == 200
    session = await client.open(calc_repo.spec(""))
    await session.write_file("calc/core.py", FIXED)
    verdict, _ = await session.finish()
    assert verdict.resolution == "FULL", verdict.error


BAD_INPUTS = [
    # (tool call the policy makes, what the observation says)
    (ToolCall("shell", {"command": ""}), "command: is empty"),
    (ToolCall("shell", {"command": "echo a\0b"}), "NUL byte"),
    (ToolCall("shell", {"command": "echo \ud800"}), "not valid UTF-8"),
    (ToolCall("shell", {"command": "echo " + "x" * (300 << 10)}), "longer than a command can be"),
    (ToolCall("file_editor", {"command": "create", "path": "n" * 300 + ".py", "file_text": "x"}), "255"),
    (ToolCall("file_editor", {"command": "view", "path": "a\0b"}), "NUL"),
    (ToolCall("file_editor", {"command": "create", "path": "bad\udcff.py", "file_text": "x"}), "UTF-8"),
    (ToolCall("file_editor", {"command": "create", "path": "ok.py", "file_text": "\ud83d"}), "UTF-8"),
    (ToolCall("file_editor", {"command": "view", "path": "x/" * 2100 + "y"}), "longer than the 4095"),
]


async def test_bad_policy_input_through_the_tool_box_is_an_error_observation_and_the_executor_stays_healthy(
        srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    box = ToolBox(session, command_timeout_s=20)
    for call, said in BAD_INPUTS:
        obs = await box.run(call)
        assert obs.error and obs.text.startswith("error: ") and said in obs.text, (call.name, obs.text[:300])
    assert (await box.run(ToolCall("shell", {"command": "echo still here"}))).text.startswith("still here")
    await session.close()
    await _still_grades_gold(srv, client, calc_repo)


async def test_bad_input_over_http_is_a_4xx_naming_the_field_never_a_500(srv: SandboxServer, client: SessionClient,
                                                                          calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "exec", {"json": {"command": "true", "cwd": "/"}}, "cwd"),
        ("POST", "exec", {"json": {"command": "true", "env": {"A": "1"}}}, "env"),
        ("PUT", "file", {"json": {"path": "a.txt", "content": "x", "mode": 0o777}}, "mode"),
        ("POST", "finish", {"json": {"patch": "diff --git a/x b/x"}}, "patch"),
        ("POST", "exec", {"json": {"command": "x" * (300 << 10)}}, "command"),
        ("GET", "file", {"params": {"path": "p" * 300}}, "path")]
    for method, verb, kw, field in cases:
        status, body = await _raw(srv, session, method, verb, **kw)
        assert status == 400 and body["field"] == field, (verb, field, status, body)
    async with aiohttp.ClientSession() as http, http.post(f"{server_url(srv)}/session/renew",
                                                          json={"owner": "worker-a", "sessions": []}) as r:
        assert r.status == 400 and (await r.json())["field"] == "sessions"
    await session.close()
    await _still_grades_gold(srv, client, calc_repo)


async def test_a_session_of_1100_nested_folders_is_graded_and_removed_and_frees_its_slot(
        srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo, sandbox_cfg: SandboxConfig) -> None:
    session = await client.open(calc_repo.spec(""))
    root = srv.sessions.sessions[session.id].root
    made = await session.exec(f"mkdir -p {DEEP} && echo x > {DEEP}/f.txt && echo made")
    assert made.stdout == "made\n", made.stderr
    verdict, _ = await session.finish()
    assert verdict.status in ("completed", "not_applied") and verdict.resolution == "NO"
    assert not exists(root) and len(srv.sessions.sessions) == 0
    for _ in range(3):  # every slot is still there: three sessions open at once (max_sessions=3)
        await client.open(calc_repo.spec(""))
    for s in list(client.open_sessions.values()):
        await s.close()
    await _still_grades_gold(srv, client, calc_repo)


async def test_an_executor_left_a_deep_tree_by_a_killed_one_starts_and_clears_it(sandbox_cfg: SandboxConfig) -> None:
    work_root = Path(str(sandbox_cfg.work_root))
    stale = work_root / "sessions-deadbeef"
    (stale / "x" / "tree").mkdir(parents=True)
    # relative: the whole path is past PATH_MAX
    await asyncio.to_thread(subprocess.run, ["mkdir", "-p", DEEP], cwd=stale / "x" / "tree", check=True)
    (stale / ".lock").touch()
    server = SandboxServer(sandbox_cfg)
    await server.start()
    try:
        assert not exists(stale)
    finally:
        await server.stop(0)


async def test_a_session_is_reachable_only_with_its_key(srv: SandboxServer, client: SessionClient,
                                                        calc_repo: CalcRepo) -> None:
    mine = await client.open(calc_repo.spec(""))
    other = SessionClient([server_url(srv)], owner="worker-b", max_retries=0)
    try:
        thief = SandboxSession(other, mine.url, mine.id, "not-the-key")
        for call in (thief.exec("echo pwned > calc/core.py"), thief.read_file("calc/core.py"), thief.finish()):
            with pytest.raises(SandboxRequestError, match="X-Session-Key"):
                await call
        async with aiohttp.ClientSession() as http:
            async with http.delete(f"{server_url(srv)}/session/{mine.id}") as r:
                assert r.status == 403
            async with http.get(f"{server_url(srv)}/session?owner=worker-b") as r:
                assert (await r.json())["sessions"] == []
            async with http.get(f"{server_url(srv)}/session") as r:
                assert r.status == 400 and (await r.json())["field"] == "owner"
    finally:
        await other.close()
    assert (await mine.exec("cat calc/core.py")).stdout == CORE
    verdict, _ = await mine.finish()
    assert verdict.resolution == "NO"


async def test_two_concurrent_finishes_get_the_same_one_verdict(srv: SandboxServer, client: SessionClient,
                                                               calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    await session.write_file("calc/core.py", FIXED)
    both = await asyncio.gather(*(_raw(srv, session, "POST", "finish", json={}) for _ in range(2)))
    assert [status for status, _ in both] == [200, 200]
    assert [body["resolution"] for _, body in both] == ["FULL", "FULL"]
    assert both[0][1] == both[1][1]


async def test_a_single_shot_patch_nesting_1100_folders_is_graded_not_an_infra_error(
        sandbox_cfg: SandboxConfig, calc_repo: CalcRepo) -> None:
    from services.sandbox.executor import Executor

    deep = f"{DEEP}/f.py"
    patch = f"diff --git a/{deep} b/{deep}\nnew file mode 100644\n--- /dev/null\n+++ b/{deep}\n@@ -0,0 +1 @@\n+x = 1\n"
    async with Executor(sandbox_cfg) as ex:
        verdict = await ex.run(calc_repo.spec(patch))
        assert verdict.status in ("completed", "not_applied") and verdict.resolution == "NO", verdict.error
        assert (await ex.run(calc_repo.spec(calc_repo.gold))).resolution == "FULL"
