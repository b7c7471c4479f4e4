"""Resource limits an adversarial patch or session cannot exceed, through the real HTTP server and client: many
processes against the task's memory (a cgroup where this host has one, the /proc watchdog otherwise, both tried
here), many files against the tree's size, a session filling its tree, a session diff past `max_diff_kb`. Each run
is scored as the agent's doing (never `infra_error`), and afterwards the executor is healthy, a gold patch still
resolves FULL and nothing of the sandbox is left on the host."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from sandbox_helpers import CalcRepo, entries, eventually, sandbox_pids

from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from fleet.contracts.sandbox import Verdict
from sandbox_client import SandboxClient
from sandbox_client.sessions import SessionClient
from services.sandbox import cgroups
from services.sandbox.cgroups import TaskCgroup
from services.sandbox.server import SandboxServer

MEMORY_MB = 768
TREE_MB = 64

# Four processes of 500 MB each, every page touched, held together for 3 s: 2 GB against a 768 MB task.
HOG = '''
import os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(500 << 20)
        for at in range(0, len(block), 4096):
            block[at] = 1
        print("HELD", i, flush=True)
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
print("STATUSES", [os.waitpid(pid, 0)[1] for pid in kids], flush=True)
'''

# 8 MB files until the filesystem refuses (at most 640 MB): how much of it the tree took.
FILL = '''
import os, sys
written = 0
try:
    for i in range(80):
        with open(os.path.join(sys.argv[1], f"fill{i}.bin"), "wb") as f:
            f.write(os.urandom(8 << 20))
        written += 8
except OSError as exc:
    print("REFUSED", exc.errno)
print("WROTE_MB", written)
'''


Serve = Callable[..., Awaitable[tuple[SandboxServer, SandboxConfig]]]


@pytest.fixture
async def serve(sandbox_cfg: SandboxConfig) -> AsyncIterator[Serve]:
    """A server over `sandbox_cfg` with the given keys changed (stopped at the end)."""
    started: list[SandboxServer] = []

    async def start(**update: object) -> tuple[SandboxServer, SandboxConfig]:
        cfg = sandbox_cfg.model_copy(update=update)
        srv = SandboxServer(cfg)
        await srv.start()
        started.append(srv)
        return srv, cfg

    try:
        yield start
    finally:
        for srv in started:
            await srv.stop(0)


def _url(srv: SandboxServer) -> str:
    return f"http://127.0.0.1:{srv.port}"


async def _script(client: SandboxClient, repo: CalcRepo, source: str, args: str = "") -> Verdict:
    patch = repo.diff({"hostile.py": source})
    return await client.run(repo.spec(patch, test_command=f"python hostile.py {args}", fail_to_pass=[],
                                      pass_to_pass=[], timeout=30))


async def _assert_healthy(srv: SandboxServer, cfg: SandboxConfig, client: SandboxClient, repo: CalcRepo) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{_url(srv)}/healthz") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
    verdict = await client.run(repo.spec(repo.gold))
    assert (verdict.status, verdict.resolution) == ("completed", "FULL"), verdict
    assert sandbox_pids() == []
    assert cfg.work_root is not None
    assert [e for e in entries(cfg.work_root) if not e.startswith("sessions-")] == []
    assert _mounts_under(cfg.work_root) == [], "a tree's tmpfs outlived its run"


def _mounts_under(root: str) -> list[str]:
    prefix = os.path.realpath(root) + "/"
    with open("/proc/self/mountinfo") as f:
        return [p for line in f if (p := line.split()[4]).startswith(prefix)]


@pytest.mark.parametrize("mechanism", ["auto", "watchdog"])
async def test_four_processes_of_500_mb_stop_at_the_task_memory(serve: Serve, calc_repo: CalcRepo,
                                                                 mechanism: str) -> None:
    srv, cfg = await serve(memory_mb=MEMORY_MB, task_memory_mb=MEMORY_MB, cgroups=mechanism)
    async with SandboxClient([_url(srv)], task_timeout=60) as client:
        kind = srv.executor.health()["task_limits"]
        assert kind == "watchdog" if mechanism == "watchdog" else kind in ("cgroup v1", "cgroup v2", "watchdog")
        v = await _script(client, calc_repo, HOG)
        assert v.status == "completed" and not v.is_infra_failure, v
        assert "the task reached its memory limit" in v.error, v.error
        assert v.resolution == "NO"  # whichever mechanism: v1 kills one process, the rest must not score
        # Never all four held at once: a cgroup's OOM killer takes some of them, the watchdog the whole run.
        assert v.stdout_tail.count("HELD") < 4, v.stdout_tail
        if kind == "watchdog":
            assert v.exit_code == -9 and v.resolution == "NO" and "killed by a resource limit" in v.error
        else:
            assert "STATUSES" in v.stdout_tail and "9" in v.stdout_tail.split("STATUSES", 1)[1]
        await _assert_healthy(srv, cfg, client, calc_repo)


async def test_many_files_past_tree_mb_stop_at_the_tree_and_are_scored(serve: Serve, calc_repo: CalcRepo) -> None:
    srv, cfg = await serve(tree_mb=TREE_MB, tmpfs_mb=32)
    async with SandboxClient([_url(srv)], task_timeout=60) as client:
        for where in (".", "/tmp"):
            v = await _script(client, calc_repo, FILL, where)
            assert v.status == "completed" and not v.is_infra_failure, v
            assert "REFUSED 28" in v.stdout_tail, v.stdout_tail  # ENOSPC, not a killed or crashed run
            wrote = int(v.stdout_tail.split("WROTE_MB", 1)[1].split()[0])
            assert wrote <= (TREE_MB if where == "." else 32), v.stdout_tail
        await _assert_healthy(srv, cfg, client, calc_repo)


async def test_a_session_filling_its_tree_stops_at_tree_mb(serve: Serve, calc_repo: CalcRepo) -> None:
    srv, cfg = await serve(tree_mb=TREE_MB, sessions=SandboxSessionConfig(max_sessions=2, exec_timeout_s=30))
    async with SandboxClient([_url(srv)], task_timeout=60) as client:
        sessions = SessionClient([_url(srv)], owner="limits", max_retries=1, backoff_s=0.05)
        try:
            session = await sessions.open(calc_repo.spec(""))
            await session.write_file("fill.py", FILL)
            run = await session.exec("python fill.py .")
            assert "REFUSED 28" in run.stdout, run
            assert int(run.stdout.split("WROTE_MB", 1)[1].split()[0]) < TREE_MB, run.stdout
            assert len(_mounts_under(str(cfg.work_root))) == 1, "the session's tree is a tmpfs of its own"
            verdict, _ = await session.finish()
            assert verdict.status == "not_applied" and not verdict.is_infra_failure, verdict
            assert f"the session's tree is full (sandbox.tree_mb={TREE_MB})" in verdict.error, verdict.error
        finally:
            await sessions.close()
        await _assert_healthy(srv, cfg, client, calc_repo)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


async def test_a_session_diff_past_max_diff_kb_is_never_read_whole(serve: Serve, calc_repo: CalcRepo) -> None:
    bounds = SandboxSessionConfig(max_sessions=2, exec_timeout_s=30, max_diff_kb=1024)
    srv, cfg = await serve(tree_mb=256, sessions=bounds)
    async with SandboxClient([_url(srv)], task_timeout=60) as client:
        sessions = SessionClient([_url(srv)], owner="limits", max_retries=1, backoff_s=0.05)
        try:
            session = await sessions.open(calc_repo.spec(""))
            # 55 MB of distinct text lines (under max_file_mb): git's diff of it is 55 times the cap.
            run = await session.exec("python -c \"import sys; [print(f'line {i:09d} ' + 'x' * 40) for i in "
                                     "range(1_000_000)]\" > big.txt && wc -c big.txt")
            assert run.exit_code == 0 and int(run.stdout.split()[0]) > 50 << 20, run
            before, peak = _rss_mb(), 0.0
            done = asyncio.Event()

            async def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, _rss_mb())
                    await asyncio.sleep(0.005)

            sampler = asyncio.create_task(sample())
            try:
                verdict, patch = await session.finish()
            finally:
                done.set()
                await sampler
            assert verdict.status == "not_applied" and "max_diff_kb=1024" in verdict.error, verdict
            assert patch == ""
            assert peak - before < 30, f"the executor grew by {peak - before:.0f} MB reading the diff"
        finally:
            await sessions.close()
        await _assert_healthy(srv, cfg, client, calc_repo)



async def test_a_real_cgroup_v2_group_holds_the_run_and_kills_what_is_left() -> None:
    """On this host's own cgroup2 filesystem (a hybrid host has one without memory and pids, which is enough for
    how a run joins its group, is killed and removed; the limit files are covered in tests/unit)."""
    found = cgroups._v2_mount()
    if found is None:
        pytest.skip("no cgroup2 filesystem mounted here")
    base = found[0] / cgroups._v2_relative(cgroups._own_path(""), found[1]).lstrip("/")
    group = TaskCgroup({cgroups.V2: base / f"grpo-limits-test-{uuid.uuid4().hex[:8]}"})
    try:
        group.dirs[cgroups.V2].mkdir()
    except OSError as exc:
        pytest.skip(f"cgroup2 at {base} is not writable here: {exc}")
    proc = await asyncio.create_subprocess_exec(*group.wrap(["sleep", "60"]))
    try:
        procs = group.dirs[cgroups.V2] / "cgroup.procs"
        await eventually(lambda: str(proc.pid) in procs.read_text().split(), 5, "the run to join its group")
        assert cgroups._own_path("", f"/proc/{proc.pid}/cgroup").endswith("/" + group.dirs[cgroups.V2].name)
        await group.remove()  # the run is still there: cgroup.kill, then the group goes
        assert await asyncio.wait_for(proc.wait(), 5) == -9
        assert not group.dirs[cgroups.V2].exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        group.remove_now()
