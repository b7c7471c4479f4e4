"""Escape and abuse attempts, each through the real HTTP server and client, each with its concrete outcome asserted,
and the executor healthy afterwards: /healthz answers 200, a normal task still resolves FULL, no process or tree of
the sandbox is left on the host."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from sandbox_helpers import CORE, CalcRepo, entries, eventually, exists, sandbox_pids, sha256

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec, Verdict
from sandbox_client import SandboxClient
from services.sandbox.server import SandboxServer


@dataclass
class Env:
    server: SandboxServer
    client: SandboxClient
    repo: CalcRepo
    cfg: SandboxConfig

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def run(self, spec: TaskSpec) -> Verdict:
        return await self.client.run(spec)

    async def script(self, source: str, args: str = "", task_timeout: float = 60) -> Verdict:
        """Run `python escape.py ARGS` from a patch that adds escape.py to the tree."""
        patch = self.repo.diff({"escape.py": source})
        return await self.run(self.repo.spec(patch, test_command=f"python escape.py {args}", fail_to_pass=[],
                                             pass_to_pass=[], timeout=task_timeout))

    async def assert_healthy(self) -> None:
        async with aiohttp.ClientSession() as s, s.get(f"{self.url}/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"
        verdict = await self.run(self.repo.spec(self.repo.gold))
        assert (verdict.status, verdict.resolution) == ("completed", "FULL")
        assert sandbox_pids() == []
        # The sessions' own folder (`sessions-*`, services/sandbox/sessions/manager.py) lives beside the task trees.
        assert self.cfg.work_root is not None
        assert [e for e in entries(self.cfg.work_root) if not e.startswith("sessions-")] == []


@pytest.fixture
async def env(server: SandboxServer, calc_repo: CalcRepo, sandbox_cfg: SandboxConfig) -> AsyncIterator[Env]:
    async with SandboxClient([f"http://127.0.0.1:{server.port}"], task_timeout=60, max_concurrency=4) as client:
        yield Env(server, client, calc_repo, sandbox_cfg)


NETWORK = '''
import socket, sys
for host, port in [("127.0.0.1", int(sys.argv[1])), ("10.0.2.2", 80), ("1.1.1.1", 53)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print("CONNECTED", host)
    except OSError as exc:
        print("BLOCKED", host, exc.errno)
try:
    socket.getaddrinfo("pypi.org", 443)
    print("RESOLVED")
except OSError:
    print("NO-DNS")
'''


async def test_network_is_unreachable(env: Env) -> None:
    hits = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal hits
        hits += 1
        writer.close()

    listener = await asyncio.start_server(count, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        v = await env.script(NETWORK, str(port))
    lines = v.stdout_tail.split("\n")
    assert sum(line.startswith("BLOCKED") for line in lines) == 3 and "NO-DNS" in lines, v.stdout_tail
    assert "CONNECTED" not in v.stdout_tail and hits == 0
    await env.assert_healthy()


WRITE_OUTSIDE = '''
import os, sys
for path in sys.argv[1:]:
    try:
        with open(os.path.expanduser(path), "w") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, exc.errno)
'''


async def test_writes_outside_the_tree_never_reach_the_host(env: Env, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    targets = [Path.home() / f"pwned-{tag}", Path(f"/etc/pwned-{tag}"), Path(f"/var/tmp/pwned-{tag}"),
               Path.cwd() / f"pwned-{tag}", env.repo.path / f"pwned-{tag}", tmp_path / f"pwned-{tag}"]
    args = " ".join([f"~/pwned-{tag}", *map(str, targets)])
    v = await env.script(WRITE_OUTSIDE, args)
    assert v.status == "completed" and v.exit_code == 0
    for target in [*targets, Path(f"/tmp/home/pwned-{tag}")]:
        assert not exists(target), f"{target} was created on the host"
    # Inside, the read-only system refuses (EROFS/EACCES); ~ and /tmp are private tmpfs that vanish with the sandbox.
    for path in ("/etc", "/var/tmp", str(Path.cwd())):
        assert f"DENIED {path}/pwned-{tag}" in v.stdout_tail
    await env.assert_healthy()


HOLD = '''
import os, time
open("secret.txt", "w").write("task A's data")
print("holding", flush=True)
time.sleep(120)
'''
SNOOP = '''
import os, sys
tree, work_root = sys.argv[1], sys.argv[2]
try:
    print("LIST", sorted(os.listdir(work_root)))
except OSError as exc:
    print("LIST-DENIED", exc.errno)
for action, path in [("read", os.path.join(tree, "secret.txt")), ("write", os.path.join(tree, "pwned"))]:
    try:
        with open(path, "r" if action == "read" else "w") as f:
            print("GOT", action, f.read() if action == "read" else f.write("pwned"))
    except OSError as exc:
        print("DENIED", action, exc.errno)
'''


async def test_a_task_cannot_see_or_touch_another_tasks_tree(env: Env) -> None:
    work_root = Path(env.cfg.work_root or "")
    hold = env.repo.spec(env.repo.diff({"hold.py": HOLD}), test_command="python hold.py", fail_to_pass=[],
                         pass_to_pass=[], timeout=100)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{env.url}/task/submit", json=hold.to_json()) as resp:
            task_a = (await resp.json())["task_id"]
        await eventually(lambda: any(exists(work_root / d / "tree/secret.txt") for d in entries(work_root)),
                         what="task A to start")
        tree_a = next(work_root / d / "tree" for d in entries(work_root) if exists(work_root / d / "tree/secret.txt"))
        v = await env.script(SNOOP, f"{tree_a} {work_root}")
        assert "GOT" not in v.stdout_tail, v.stdout_tail
        assert "DENIED read" in v.stdout_tail and "DENIED write" in v.stdout_tail
        assert tree_a.parent.name not in v.stdout_tail  # task A's folder is not even listed
        assert not exists(tree_a / "pwned") and "pwned" not in entries(tree_a)
        async with s.delete(f"{env.url}/task/{task_a}") as resp:
            assert resp.status == 200 and (await resp.json())["state"] == "running"
    await env.assert_healthy()


FORK_BOMB = '''
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
'''


async def test_fork_bomb_is_capped_and_killed(env: Env) -> None:
    peak = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(await asyncio.to_thread(sandbox_pids)))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    t0 = time.monotonic()
    try:
        v = await env.script(FORK_BOMB, task_timeout=5)
    finally:
        stop.set()
        await sampler
    assert v.status == "timeout" and v.resolution == "NO" and "limit" in v.error
    assert time.monotonic() - t0 < 5 + 20
    assert 1 < peak <= env.cfg.max_processes, f"peak {peak} processes"
    await env.assert_healthy()


async def test_allocating_10_gb_fails_inside(env: Env) -> None:
    v = await env.script("try:\n    b = bytearray(10 * 2**30)\n    print('ALLOCATED')\n"
                         "except MemoryError:\n    print('MEMORY-LIMITED')\n")
    assert v.status == "completed" and "MEMORY-LIMITED" in v.stdout_tail and "ALLOCATED" not in v.stdout_tail
    await env.assert_healthy()


async def test_infinite_loop_times_out(env: Env) -> None:
    looping = CORE.replace("    return a - b", "    while True:\n        pass")
    t0 = time.monotonic()
    v = await env.run(env.repo.spec(env.repo.diff({"calc/core.py": looping}), timeout=4))
    assert (v.status, v.resolution) == ("timeout", "NO") and "4 s limit" in v.error
    assert time.monotonic() - t0 < 4 + 20
    await env.assert_healthy()


async def test_100_mb_of_output_is_capped_while_streaming(env: Env) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    v = await env.script("import os\nchunk = b'x' * (1 << 20)\nfor _ in range(100):\n    os.write(1, chunk)\n")
    assert v.status == "completed" and v.stdout_bytes == 100 << 20
    assert len(v.stdout_tail) == env.cfg.max_output_kb << 10
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 50, f"the executor's peak memory grew by {grown_mb:.0f} MB"
    await env.assert_healthy()


DELETE_RUNNER = '''
import os, shutil, sys
import pytest
for target in [os.path.realpath(sys.executable), os.path.dirname(pytest.__file__), "/usr/bin/git"]:
    try:
        shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
        print("DELETED", target)
    except OSError as exc:
        print("KEPT", target, exc.errno)
'''


async def test_deleting_the_test_runner_fails(env: Env) -> None:
    refused = await env.run(env.repo.spec(env.repo.diff({"calc/core.py": CORE + "\n", "tests/conftest.py": None})))
    assert refused.status == "refused" and "tests/conftest.py" in refused.error
    v = await env.script(DELETE_RUNNER)
    assert v.status == "completed" and "DELETED" not in v.stdout_tail and v.stdout_tail.count("KEPT") == 3
    import pytest as host_pytest

    assert exists(host_pytest.__file__) and exists("/usr/bin/git")
    await env.assert_healthy()


SYMLINK_WRITE = '''
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "a") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as exc:
        print("DENIED", path, exc.errno)
'''


async def test_symlinks_out_of_the_tree_lead_nowhere(env: Env) -> None:
    # git itself refuses to write through a symlink that the same patch creates.
    through = env.repo.diff({}, symlinks={"calc/etc": "/etc"}) + env.repo.diff({"calc/etc/pwned": "x\n"})
    v = await env.run(env.repo.spec(through))
    assert v.status == "not_applied" and "beyond a symbolic link" in v.error and not exists("/etc/pwned")
    outside = f"/var/tmp/sandbox-out-{uuid.uuid4().hex[:8]}"
    os.mkdir(outside)
    passwd = sha256("/etc/passwd")
    work_root = Path(env.cfg.work_root or "")
    try:
        # `up` leaves the tree (work_root/TASK/tree) for the folder above the work root.
        patch = env.repo.diff({"escape.py": SYMLINK_WRITE},
                              symlinks={"out": outside, "host_passwd": "/etc/passwd", "up": "../../../.."})
        v = await env.run(env.repo.spec(patch, test_command="python escape.py out/pwned host_passwd up/pwned",
                                        fail_to_pass=[], pass_to_pass=[]))
        assert v.status == "completed"
        assert "DENIED out/pwned" in v.stdout_tail and "DENIED host_passwd" in v.stdout_tail, v.stdout_tail
        assert entries(outside) == [] and not exists(work_root.parent.parent / "pwned")
    finally:
        os.rmdir(outside)
    # Handing the tree to the sandbox uid (lchown) did not follow the link either.
    assert os.stat("/etc/passwd").st_uid == 0
    assert sha256("/etc/passwd") == passwd
    await env.assert_healthy()


async def test_no_report_file_of_the_tree_is_read_back(env: Env) -> None:
    # The report comes over a pipe (issue 16): a junit file, or a link to a secret, planted in the tree is ignored.
    secret = "/etc/shadow" if exists("/etc/shadow") else "/etc/passwd"
    spec = env.repo.spec(env.repo.gold, test_command=f"ln -sf {secret} report.xml && ln -sf {secret} junit.xml")
    v = await env.run(spec)
    assert (v.status, v.resolution, v.test_status) == ("completed", "NO", {})
    assert "did not run to the end" in v.error and "root:" not in json.dumps(v.to_json())
    await env.assert_healthy()
