"""Per-task limits without a host to break: the cgroup v2 file writes and readings against a folder laid out as a
cgroupfs (this suite's hosts are hybrid or v1; the real v2 filesystem is exercised in
tests/integration/sandbox/test_limits.py where it is writable), the choice `sandbox.cgroups` makes, and the /proc
watchdog's accounting against real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from services.sandbox import cgroups, watchdog
from services.sandbox.cgroups import V2, CgroupRoot, TaskCgroup


def _cgroupfs(path: Path, controllers: str = "cpu io memory pids") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (("cgroup.controllers", controllers), ("cgroup.subtree_control", ""), ("cgroup.procs", "")):
        (path / name).write_text(text)
    return path


def test_v2_mount_and_own_group_are_read_from_the_kernels_files(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:21 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
                    "23 1 0:22 / /proc rw - proc proc rw\n")
    assert cgroups._v2_mount(str(info)) == (Path("/sys/fs/cgroup/unified"), "/")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/abc\n0::/kubepods/pod1/ctr\n")
    assert cgroups._own_path("", str(proc)) == "/kubepods/pod1/ctr"
    assert cgroups._own_path("memory", str(proc)) == "/docker/abc"
    # A mount showing only part of the hierarchy (a container without its own cgroup namespace).
    assert cgroups._v2_relative("/kubepods/pod1/ctr", "/kubepods/pod1") == "/ctr"


def test_v2_without_memory_and_pids_says_which_are_missing(tmp_path: Path) -> None:
    found = CgroupRoot.detect_v2(_cgroupfs(tmp_path / "cg", controllers="cpu io"), "/")
    assert isinstance(found, str) and "memory, pids not available" in found


def test_v2_enables_the_controllers_for_task_groups(tmp_path: Path) -> None:
    group = _cgroupfs(tmp_path / "cg")
    cgroups._enable(group, evacuate=False)
    assert (group / "cgroup.subtree_control").read_text() == "+memory +pids"
    (group / "cgroup.subtree_control").write_text("memory pids")
    cgroups._enable(group, evacuate=False)  # already on: nothing written
    assert (group / "cgroup.subtree_control").read_text() == "memory pids"


def test_v2_task_limits_are_written_and_read_back(tmp_path: Path) -> None:
    task = tmp_path / "task"
    task.mkdir()
    for name in ("memory.swap.max", "memory.oom.group"):  # present on a real v2 group; optional files stay optional
        (task / name).write_text("max\n")
    cgroups._limit_v2(task, 768 << 20, 64)
    assert [(task / n).read_text() for n in ("memory.max", "memory.swap.max", "memory.oom.group", "pids.max")] == [
        str(768 << 20), "0", "1", "64"]
    group = TaskCgroup({V2: task}, 768 << 20)
    (task / "memory.peak").write_text(f"{300 << 20}\n")
    (task / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 0\noom_kill 0\noom_group_kill 0\n")
    (task / "pids.events").write_text("max 0\n")
    assert group.stats() == cgroups.TaskStats(300.0, False, False)
    (task / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 1\noom_kill 4\noom_group_kill 1\n")
    (task / "pids.events").write_text("max 3\n")
    assert group.stats() == cgroups.TaskStats(300.0, True, True)
    argv = group.wrap(["python", "-c", "pass"])
    assert argv[:3] == ["/bin/sh", "-c", cgroups._JOIN] and str(task / "cgroup.procs") in argv


def test_required_without_a_cgroup_refuses_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CgroupRoot, "find", classmethod(lambda cls, mount=None: (None, "cgroup v2: not delegated")))
    with pytest.raises(RuntimeError, match=r"sandbox\.cgroups=required .*not delegated"):
        watchdog.task_limits("required")
    assert isinstance(watchdog.task_limits("auto"), watchdog.Watchdog)
    assert watchdog.task_limits("off") is None


def test_watchdog_counts_a_runs_descendants_and_their_memory() -> None:
    code = ("import os, time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
            "pid = os.fork()\nif pid:\n    print(pid, flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        count, used = watchdog.scan([proc.pid])[proc.pid]
        # Parent and child share the 64 MB copy-on-write and each counts it (the kernel's accounting would not):
        # the sum errs towards the limit, never past it.
        assert count == 2 and used >= 64 << 20
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()


async def test_watchdog_kills_a_run_past_its_memory_once() -> None:
    dog = watchdog.Watchdog()
    run = dog.task(100 << 20, 8)
    kills: list[int] = []
    run.attach(12345, lambda: kills.append(1))
    run.sample(3, 50 << 20)
    run.sample(3, 150 << 20)
    run.sample(3, 200 << 20)
    assert kills == [1] and run.stats() == cgroups.TaskStats(200.0, True, False)
    await run.remove()
    await asyncio.sleep(0)
    dog.remove()
