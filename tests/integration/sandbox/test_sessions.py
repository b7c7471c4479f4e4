"""Interactive sessions on a real executor and HTTP server (bwrap, slot uids, a real git repository): commands in a
tree at base_commit, capped output, timeouts, idempotent retries, paths that cannot leave the tree, grading in a
fresh tree, owner leases, bounds, and nothing left behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from sandbox_helpers import (
    FIXED,
    CalcRepo,
    entries,
    eventually,
    exists,
    sandbox_pids,
    server_url,
    session_client,
    session_server,
)

from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from fleet.contracts.sandbox import TaskSpec
from sandbox_client.sessions import SessionClient, SessionToolError, SessionUnavailable
from services.sandbox.server import SandboxServer
from services.sandbox.sessions.manager import Session, SessionManager


@pytest.fixture
async def srv(sandbox_cfg: SandboxConfig) -> AsyncIterator[SandboxServer]:
    async with session_server(sandbox_cfg, lease_s=3.0, max_output_kb=4, exec_timeout_s=20) as server:
        yield server


@pytest.fixture
async def client(srv: SandboxServer) -> AsyncIterator[SessionClient]:
    async with session_client(srv) as c:
        yield c


def _session_uids(srv: SandboxServer) -> tuple[int, int]:
    uids = srv.sessions._uids
    assert uids is not None
    return uids.base, srv.sessions.cfg.max_sessions


async def test_session_sees_base_commit_only_and_finish_grades_its_diff(
        srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    listing = await session.exec("ls -a; id -u; cat calc/core.py")
    assert listing.exit_code == 0 and "return a - b" in listing.stdout
    assert ".git" not in listing.stdout.split(), "no git metadata (other commits, fixes) inside the tree"
    assert str(_session_uids(srv)[0]) in listing.stdout, "commands run as the session's own uid"
    await session.write_file("calc/core.py", FIXED)
    assert "return a * b" in (await session.read_file("calc/core.py"))[0]
    assert (await session.exec("python -c 'from calc import mul; print(mul(2, 3))'")).stdout.strip() == "6"
    verdict, patch = await session.finish()
    assert verdict.status == "completed" and verdict.resolution == "FULL", verdict
    assert "calc/core.py" in patch
    assert srv.sessions.sessions == {} and client.open_sessions == {}
    with pytest.raises(SessionUnavailable, match="finished"):
        await session.exec("true")


async def test_test_file_changes_are_dropped_from_grading_and_runner_changes_still_refused(
        client: SessionClient, calc_repo: CalcRepo) -> None:
    cheat = await client.open(calc_repo.spec(""))
    # Every test passes in the session itself; its change to a test file is not graded, the hidden tests still fail.
    run = await cheat.exec("printf 'def test_add():\\n    pass\\n' > tests/test_core.py && "
                           "python -m pytest -q -p no:cacheprovider tests")
    assert run.exit_code == 0
    verdict, patch = await cheat.finish()
    assert (verdict.status, verdict.resolution, patch) == ("completed", "NO", ""), verdict
    assert "not graded (test files): tests/test_core.py" in verdict.error
    # A fix with the agent's own reproduction test: the fix is graded (FULL), the test left out and recorded.
    fixed = await client.open(calc_repo.spec(""))
    await fixed.write_file("calc/core.py", FIXED)
    await fixed.write_file("tests/test_repro.py", "from calc import mul\n\n\ndef test_repro():\n"
                                                  "    assert mul(2, 3) == 6\n")
    verdict, patch = await fixed.finish()
    assert verdict.resolution == "FULL" and "calc/core.py" in patch and "test_repro" not in patch, verdict
    assert "tests/test_repro.py" in verdict.error
    # The runner's configuration is no test file: it stays in the patch, which is refused.
    ini = await client.open(calc_repo.spec(""))
    await ini.write_file("calc/core.py", FIXED)
    await ini.write_file("pytest.ini", "[pytest]\naddopts = -q\n")
    verdict, _ = await ini.finish()
    assert verdict.status == "refused" and verdict.resolution != "FULL", verdict


async def test_output_is_capped_and_commands_time_out(srv: SandboxServer, client: SessionClient,
                                                      calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    big = await session.exec("head -c 100000 /dev/zero | tr '\\0' x; echo oops >&2")
    assert big.stdout_truncated and not big.stderr_truncated and big.stderr.strip() == "oops"
    assert len(big.stdout) == 4 << 10
    slow = await session.exec("sleep 60 & sleep 60", limit_s=1)
    assert slow.timed_out and slow.exit_code != 0
    base, count = _session_uids(srv)
    await eventually(lambda: not sandbox_pids(base, count), what="the timed-out command's processes to be gone")
    assert (await session.exec("echo still here")).stdout.strip() == "still here"
    await session.close()


async def test_a_retried_command_is_never_run_twice(srv: SandboxServer, client: SessionClient,
                                                    calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    url = f"{server_url(srv)}/session/{session.id}/exec"
    body = {"command": "echo run >> runs.log; wc -l < runs.log", "request_id": "k1"}
    async with aiohttp.ClientSession() as http:
        key = {"X-Session-Key": session.key}
        answers = await asyncio.gather(*(http.post(url, json=body, headers=key) for _ in range(3)))
        outs = [(await r.json())["stdout"] for r in answers]
    assert outs == ["1\n"] * 3
    assert (await session.read_file("runs.log"))[0] == "run\n"


async def test_paths_cannot_leave_the_tree(client: SessionClient, calc_repo: CalcRepo) -> None:
    session = await client.open(calc_repo.spec(""))
    await session.exec("ln -s /etc etc_link && ln -s /etc/hostname host_link")
    for path in ("etc_link/hostname", "host_link", "../x", "/etc/hostname"):
        with pytest.raises(SessionToolError, match="path"):
            await session.read_file(path)
    with pytest.raises(SessionToolError, match="path"):
        await session.write_file("etc_link/evil", "x")
    with pytest.raises(SessionToolError, match="does not exist"):
        await session.read_file("missing.txt")
    assert not exists("/etc/evil")
    await session.write_file("new/dir/file.txt", "hi\n")
    assert (await session.exec("cat new/dir/file.txt && echo more >> new/dir/file.txt")).exit_code == 0


async def test_sessions_of_an_owner_that_stops_renewing_are_removed(srv: SandboxServer, client: SessionClient,
                                                                    calc_repo: CalcRepo) -> None:
    kept = await client.open(calc_repo.spec(""))  # `client` renews its lease in the background
    async with aiohttp.ClientSession() as http:
        body = {"owner": "dead-worker", **{k: v for k, v in calc_repo.spec("").to_json().items()
                                          if k not in ("patch", "reference_patch")}}
        async with http.post(f"{server_url(srv)}/session", json=body) as resp:
            opened = await resp.json()
        orphan, key = opened["session_id"], {"X-Session-Key": opened["session_key"]}
        await http.post(f"{server_url(srv)}/session/{orphan}/exec", json={"command": "sleep 120 &"}, headers=key)
        tree = srv.sessions.sessions[orphan].root
        await eventually(lambda: orphan not in srv.sessions.sessions, within_s=60, what="the orphan to be reaped")
        async with http.post(f"{server_url(srv)}/session/{orphan}/exec", json={"command": "true"}, headers=key) as resp:
            assert resp.status == 404 and (await resp.json())["reason"] == "owner_lost"
    await eventually(lambda: not exists(tree), what="the orphan's tree to be removed")
    assert kept.id in srv.sessions.sessions, "a session whose owner renews stays"
    assert (await kept.exec("echo alive")).stdout == "alive\n"


async def test_session_count_is_bounded(srv: SandboxServer, client: SessionClient, calc_repo: CalcRepo) -> None:
    sessions = [await client.open(calc_repo.spec("")) for _ in range(3)]
    with pytest.raises(SessionUnavailable, match="max_sessions=3"):
        await client.open(calc_repo.spec(""))
    await sessions[0].close()
    assert (await client.open(calc_repo.spec(""))).id in srv.sessions.sessions


async def test_executor_stop_removes_sessions_and_a_new_one_clears_a_dead_ones(
        sandbox_cfg: SandboxConfig, calc_repo: CalcRepo) -> None:
    server = SandboxServer(sandbox_cfg)
    await server.start()
    c = SessionClient([server_url(server)], owner="w", max_retries=0)
    try:
        session = await c.open(calc_repo.spec(""))
        await session.exec("sleep 120 &")
        root = server.sessions.sessions[session.id].root
        base, count = _session_uids(server)
    finally:
        await server.stop(0)
        await c.close()
    assert not exists(root) and not sandbox_pids(base, count)
    # A dead executor's session folder (its flock gone) is removed by the next executor on the same work root.
    work_root = Path(str(sandbox_cfg.work_root))
    stale = work_root / "sessions-deadbeef"
    (stale / "x" / "tree").mkdir(parents=True)
    (stale / ".lock").touch()
    server2 = SandboxServer(sandbox_cfg)
    await server2.start()
    try:
        assert not exists(stale)
        left = [name for name in entries(work_root) if name.startswith("sessions-")]
        assert left == [server2.sessions._dir.name]  # type: ignore[union-attr]
    finally:
        await server2.stop(0)


def test_manager_reaps_idle_and_old_sessions_by_policy() -> None:
    cfg = SandboxSessionConfig(lease_s=10, idle_timeout_s=5, max_lifetime_s=100)
    m = SessionManager(None, cfg)  # type: ignore[arg-type]
    spec = TaskSpec(repo_url="r", base_commit="c", patch="", test_command="true")
    for sid, created, active in (("fresh", 0.0, 0.0), ("idle", 0.0, -6.0), ("old", -101.0, 0.0)):
        m.sessions[sid] = Session(sid, "o", spec, Path(os.devnull), None, created=created, active=active)
    m.leases["o"] = 0.0
    assert sorted(m.reap(0.0)) == [("idle", "idle"), ("old", "lifetime")]
    m.sessions["idle"].work.add(None)  # a command still running
    assert sorted(m.reap(0.0)) == [("old", "lifetime")]
    assert sorted(m.reap(11.0)) == [("fresh", "owner_lost"), ("idle", "owner_lost"), ("old", "owner_lost")]
