"""Per-task resource accounting: one cgroup (v1 `memory` and `pids` controllers) per task run.

RLIMIT_AS bounds each process, so 200 processes of 2 GB each are 400 GB; a cgroup bounds the task as a whole
(`sandbox.task_memory_mb`, `sandbox.max_processes`). The groups live under the executor's own cgroup, in a folder of
its own (`grpo-sandbox-PID-ID`, swept when that pid is gone); each task gets a fresh child, removed after the run.

How a run joins its group without `preexec_fn` (unsafe in a threaded process): the command is prefixed with a
`/bin/sh -c` that writes its own pid into each group's `cgroup.procs` and then `exec`s the real command, so every
process of the sandbox is born inside the group. Usable by any runtime (`TaskCgroup.wrap(argv)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
MOUNT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
# Joins every group named before `--`, then becomes the command: pid and process group stay the same.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def _own_path(controller: str) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    raise OSError(f"no {controller} cgroup in /proc/self/cgroup")


class CgroupRoot:
    """The executor's folder in each controller's hierarchy; `None` from `detect` where cgroups cannot be used."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def detect(cls) -> CgroupRoot | None:
        if os.geteuid() != 0:
            return None
        dirs: dict[str, Path] = {}
        try:
            for controller in CONTROLLERS:
                base = MOUNT / controller
                if not (base / "cgroup.procs").exists():
                    return None
                parent = base / _own_path(controller).lstrip("/")
                _sweep(parent)
                # One folder per executor, even for several executors of one process (tests, the task-set builder):
                # one that closes must never remove another's.
                mine = parent / f"grpo-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                mine.mkdir()
                dirs[controller] = mine
        except OSError as exc:
            log.warning("per-task cgroups unavailable: %s", exc)
            for path in dirs.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            return None
        return cls(dirs)

    def task(self, memory_bytes: int, max_pids: int) -> TaskCgroup:
        """A fresh group for one run (raises OSError if the kernel refuses it)."""
        name = f"task-{uuid.uuid4().hex[:12]}"
        group = TaskCgroup({c: d / name for c, d in self.dirs.items()})
        try:
            for path in group.dirs.values():
                path.mkdir()
            mem = group.dirs["memory"]
            (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory + swap: no escaping the limit into swap
                with contextlib.suppress(OSError):
                    swap.write_text(str(memory_bytes))
            (group.dirs["pids"] / "pids.max").write_text(str(max_pids))
        except OSError:
            group.remove_now()
            raise
        return group

    def remove(self) -> None:
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


@dataclass
class TaskStats:
    memory_peak_mb: float
    memory_limit_hit: bool
    pids_limit_hit: bool


@dataclass
class TaskCgroup:
    dirs: dict[str, Path]

    def wrap(self, argv: list[str]) -> list[str]:
        return ["/bin/sh", "-c", _JOIN, "sh", *(str(d / "cgroup.procs") for d in self.dirs.values()), "--", *argv]

    def stats(self) -> TaskStats:
        mem = self.dirs["memory"]
        peak = _read_int(mem / "memory.max_usage_in_bytes")
        limit = _read_int(mem / "memory.limit_in_bytes")
        try:
            oom = mem.joinpath("memory.oom_control").read_text().split()
            kills = int(oom[oom.index("oom_kill") + 1]) if "oom_kill" in oom else 0
        except (OSError, ValueError, IndexError):
            kills = 0
        # Kernels differ in which counter they bump (failcnt stays 0 on some): any of them means the limit bit.
        hit = kills > 0 or _read_int(mem / "memory.failcnt") > 0 or (limit > 0 and peak >= limit)
        events = (self.dirs["pids"] / "pids.events").read_text() if (self.dirs["pids"] / "pids.events").exists() \
            else ""
        pids_hit = any(line.split()[1] != "0" for line in events.splitlines() if line.startswith("max "))
        return TaskStats(round(peak / 2**20, 1), hit, pids_hit)

    async def remove(self) -> None:
        """Remove the groups; the run's processes are gone, but the kernel may take a moment to say so (usually
        well under a millisecond, tens of ms on a loaded host: the first retries come quickly, as the task's
        verdict waits for this)."""
        delay, waited = 0.001, 0.0
        while not self.remove_now():
            if waited > 1.0:
                log.warning("cgroup %s still busy; left in place", self.dirs)
                return
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 0.02)

    def remove_now(self) -> bool:
        done = True
        for path in self.dirs.values():
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done


def _sweep(parent: Path) -> None:
    """Remove the empty groups of executors that died without removing them (their pid is gone)."""
    for folder in parent.glob("grpo-sandbox-*"):
        try:
            pid = int(folder.name.split("-")[2])
            os.kill(pid, 0)
            continue
        except ProcessLookupError:
            pass
        except (ValueError, IndexError, PermissionError):
            continue
        for child in folder.glob("task-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
