"""Where no per-task cgroup can be had (cgroup v1 read-only, v2 not delegated, no root): a run's memory and processes
bounded all together by sampling, and the choice between the two (`task_limits`, `sandbox.cgroups`).

One loop per executor reads /proc every `INTERVAL_S` while runs are attached: a run's processes are its leader's
descendants (the leader is bwrap, the group leader `process.run_limited` starts; nothing can leave that ancestry,
since an orphan is adopted by the pid namespace's init, bwrap's own child), and its memory is their `RssAnon` +
`RssShmem`. Past `task_memory_mb`, or past `max_processes` processes, the whole run is killed (SIGKILL to bwrap's
process group; its pid namespace takes every process with it) and the verdict says which limit it reached.

What this bounds, honestly: sampling is not a limit the kernel holds. A run can overshoot for up to one interval (a
memset runs at ~10 GB/s, so in principle up to one interval's allocation; each process still stops at RLIMIT_AS =
`memory_mb`, and the slot's RLIMIT_NPROC caps how many there are) before it dies. Memory that is not resident in a
process -- files in the private /tmp and the tree (tmpfs: `tmpfs_mb`, `tree_mb`), pipe buffers, unmapped memfds
(RLIMIT_FSIZE each) -- is not counted here; those have their own bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from services.sandbox.cgroups import CgroupRoot, TaskStats

log = logging.getLogger(__name__)
INTERVAL_S = 0.1
# bwrap outside and its child inside the pid namespace are in the tree too (setpriv execs the command).
_OWN_PROCESSES = 2


def task_limits(mode: str) -> CgroupRoot | Watchdog | None:
    """What bounds a run's processes together, for `sandbox.cgroups` = `mode` (raises for `required` without a
    cgroup). `auto`: a cgroup (v1, else v2) where one can be made, the watchdog otherwise."""
    if mode == "off":
        return None
    if mode == "watchdog":
        return Watchdog()
    root, why = CgroupRoot.find()
    if root is not None:
        return root
    if mode == "required":
        raise RuntimeError(f"sandbox.cgroups=required but no per-task cgroup can be made here ({why}); "
                           "sandbox.cgroups=auto bounds each run's memory by sampling instead")
    log.warning("per-task cgroups unavailable (%s): each run's memory and processes are bounded by sampling /proc "
                "every %d ms instead (sandbox.cgroups=auto; see services/sandbox/watchdog.py)", why,
                INTERVAL_S * 1000)
    return Watchdog()


class Watchdog:
    """The executor's sampler; `task(...)` gives one run's handle (the same interface as a `TaskCgroup`)."""

    kind = "watchdog"

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._runs: set[WatchedRun] = set()
        self._loop_task: asyncio.Task[None] | None = None

    def task(self, memory_bytes: int, max_pids: int) -> WatchedRun:
        return WatchedRun(self, memory_bytes, max_pids)

    def _attach(self, run: WatchedRun) -> None:
        self._runs.add(run)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def _detach(self, run: WatchedRun) -> None:
        self._runs.discard(run)

    async def _loop(self) -> None:
        while self._runs:
            await asyncio.sleep(self.interval_s)
            runs = [r for r in self._runs if r.pid]
            if not runs:
                continue
            try:
                usage = await asyncio.to_thread(scan, [r.pid for r in runs])
            except Exception:  # a sampler that died would leave every run unbounded: say so, keep sampling
                log.exception("memory watchdog: sampling /proc failed")
                continue
            for run in runs:
                run.sample(*usage.get(run.pid, (0, 0)))

    def remove(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None
        self._runs.clear()


class WatchedRun:
    """One run's bound: `attach(pid, kill)` once it is started, `stats()` and `remove()` after it ended."""

    def __init__(self, dog: Watchdog, memory_bytes: int, max_pids: int) -> None:
        self.dog, self.memory_bytes, self.max_pids = dog, memory_bytes, max_pids
        self.pid = 0
        self.peak = 0
        self.memory_hit = self.pids_hit = False
        self._kill: Callable[[], None] | None = None

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def attach(self, pid: int, kill: Callable[[], None]) -> None:
        self.pid, self._kill = pid, kill
        self.dog._attach(self)

    def detach(self) -> None:
        self._kill = None
        self.dog._detach(self)

    def sample(self, processes: int, used: int) -> None:
        self.peak = max(self.peak, used)
        over_memory = used > self.memory_bytes
        over_pids = processes > self.max_pids + _OWN_PROCESSES
        if (over_memory or over_pids) and self._kill is not None:
            self.memory_hit |= over_memory
            self.pids_hit |= over_pids
            log.info("watchdog: run %d killed at %d processes, %.0f MB", self.pid, processes, used / 2**20)
            self._kill()
            self._kill = None

    def stats(self) -> TaskStats:
        return TaskStats(round(self.peak / 2**20, 1), self.memory_hit, self.pids_hit)

    async def remove(self) -> None:
        self.detach()

    def remove_now(self) -> bool:
        self.detach()
        return True


def scan(leaders: list[int], proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """leader -> (processes, bytes of RssAnon + RssShmem) of it and all its descendants, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    with os.scandir(proc) as it:
        for entry in it:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"{proc}/{entry.name}/stat", "rb") as f:
                    data = f.read()
            except OSError:  # gone meanwhile
                continue
            # The command name may hold spaces and parentheses: the fields that follow it start after the last ')'.
            fields = data[data.rfind(b")") + 2:].split()
            with contextlib.suppress(IndexError, ValueError):
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: dict[int, tuple[int, int]] = {}
    for leader in leaders:
        count, used, todo, seen = 0, 0, [leader], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            count += 1
            used += _resident(f"{proc}/{pid}/status")
            todo.extend(children.get(pid, ()))
        out[leader] = (count, used)
    return out


def _resident(status_path: str) -> int:
    """RssAnon + RssShmem of one process, in bytes (0 once it is gone). File-backed pages (the interpreter's and its
    libraries', shared by every process) are left out: counted per process they would kill a run of many small
    workers that hold little."""
    total = 0
    try:
        with open(status_path, "rb") as f:
            for line in f:
                if line.startswith((b"RssAnon:", b"RssShmem:")):
                    total += int(line.split()[1]) << 10
    except (OSError, ValueError):
        return 0
    return total
