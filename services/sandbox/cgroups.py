"""Per-task resource accounting: one cgroup per task run, v1 (`memory` and `pids` controllers) or v2 (a delegated
subtree of the unified hierarchy with both controllers enabled).

RLIMIT_AS bounds each process, so 200 processes of 2 GB each are 400 GB; a cgroup bounds the task as a whole
(`sandbox.task_memory_mb`, `sandbox.max_processes`). The groups live under the executor's own cgroup, in a folder of
its own (`grpo-sandbox-PID-ID`, swept when that pid is gone); each task gets a fresh child, removed after the run.
v1 is preferred where its memory controller is mounted (a hybrid host binds memory there, and its v2 tree then has no
memory controller at all); v2 where the host is unified (current distributions, Kubernetes pods). Where neither can be
written, `watchdog.py` bounds a run's total by sampling instead.

How a run joins its group without `preexec_fn` (unsafe in a threaded process): the command is prefixed with a
`/bin/sh -c` that writes its own pid into each group's `cgroup.procs` and then `exec`s the real command, so every
process of the sandbox is born inside the group (`clone3(CLONE_INTO_CGROUP)` would do it in one call, but Python's
subprocess cannot). Usable by any runtime (`TaskCgroup.wrap(argv)`).

v2 has the "no internal processes" rule: a group whose children get controllers must hold no process itself. Inside
a container with a private cgroup namespace the executor usually sits in the namespace's root, with every process of
the container: those are moved into a leaf (`grpo-leaf`) once, as container init systems do, and the controllers
enabled below the root. Anywhere else (a host's systemd slice) the executor's group must already be delegated
(`systemd-run -p Delegate=yes`, or a pod whose runtime delegates it); otherwise v2 is reported unusable and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.sandbox.fstree import pid_alive

log = logging.getLogger(__name__)
MOUNT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
V2 = "unified"  # the key of a v2 group in `dirs` (one folder serves both controllers)
V2_LEAF = "grpo-leaf"
# Joins every group named before `--`, then becomes the command: pid and process group stay the same.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def _own_path(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's group in `controller`'s v1 hierarchy ("" for the v2 one)."""
    with open(proc_cgroup) as f:
        for line in f:
            hid, names, path = line.rstrip("\n").split(":", 2)
            if (controller and controller in names.split(",")) or (not controller and hid == "0" and not names):
                return path
    raise OSError(f"no {controller or 'v2'} cgroup in {proc_cgroup}")


def _v2_mount(mountinfo: str = "/proc/self/mountinfo") -> tuple[Path, str] | None:
    """(mount point, root of the hierarchy it shows) of the cgroup2 filesystem, if one is mounted."""
    with contextlib.suppress(OSError), open(mountinfo) as f:
        for line in f:
            fields = line.split()
            if "-" in fields and fields[fields.index("-") + 1] == "cgroup2":
                return Path(fields[4]), fields[3]
    return None


class CgroupRoot:
    """The executor's folder in each controller's hierarchy (`version` 1 or 2); `None` from `detect` where cgroups
    cannot be used (`find` also says why)."""

    def __init__(self, dirs: dict[str, Path], version: int = 1) -> None:
        self.dirs = dirs
        self.version = version

    @property
    def kind(self) -> str:
        return f"cgroup v{self.version}"

    @classmethod
    def detect(cls, mount: Path = MOUNT) -> CgroupRoot | None:
        return cls.find(mount)[0]

    @classmethod
    def find(cls, mount: Path = MOUNT) -> tuple[CgroupRoot | None, str]:
        """(the executor's groups, "") or (None, why neither v1 nor v2 can be used here)."""
        if os.geteuid() != 0:
            return None, "the executor is not root"
        v1 = cls._detect_v1(mount)
        if isinstance(v1, CgroupRoot):
            return v1, ""
        found = _v2_mount()
        if found is None:
            return None, f"cgroup v1: {v1}; cgroup v2: not mounted"
        try:
            own = _v2_relative(_own_path(""), found[1])
        except OSError as exc:
            return None, f"cgroup v1: {v1}; cgroup v2: {exc}"
        v2 = cls.detect_v2(found[0], own)
        if isinstance(v2, CgroupRoot):
            return v2, ""
        return None, f"cgroup v1: {v1}; cgroup v2: {v2}"

    @classmethod
    def _detect_v1(cls, mount: Path) -> CgroupRoot | str:
        dirs: dict[str, Path] = {}
        try:
            for controller in CONTROLLERS:
                base = mount / controller
                if not (base / "cgroup.procs").exists():
                    return f"no {controller} controller mounted at {base}"
                parent = base / _own_path(controller).lstrip("/")
                _sweep(parent)
                # One folder per executor, even for several executors of one process (tests, the task-set builder):
                # one that closes must never remove another's.
                mine = parent / f"grpo-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
                mine.mkdir()
                dirs[controller] = mine
        except OSError as exc:
            for path in dirs.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            return f"cannot make a group ({exc})"
        return cls(dirs, 1)

    @classmethod
    def detect_v2(cls, mount: Path, own: str) -> CgroupRoot | str:
        """The executor's folder under `mount`/`own` (the executor's v2 group), or why there can be none."""
        base = mount / own.lstrip("/")
        if base.name == V2_LEAF:  # moved there by an executor of this container before: its parent delegates
            base = base.parent
        try:
            available = (base / "cgroup.controllers").read_text().split()
            missing = [c for c in CONTROLLERS if c not in available]
            if missing:
                return f"controllers {', '.join(missing)} not available in {base} (held by v1, or not delegated)"
            _enable(base, evacuate=own in ("", "/"))
            _sweep(base)
            mine = base / f"grpo-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            mine.mkdir()
        except OSError as exc:
            return f"cannot use {base} ({exc})"
        try:
            _enable(mine, evacuate=False)
        except OSError as exc:
            with contextlib.suppress(OSError):
                mine.rmdir()
            return f"cannot enable controllers in {mine} ({exc})"
        return cls({V2: mine}, 2)

    def task(self, memory_bytes: int, max_pids: int) -> TaskCgroup:
        """A fresh group for one run (raises OSError if the kernel refuses it)."""
        name = f"task-{uuid.uuid4().hex[:12]}"
        group = TaskCgroup({c: d / name for c, d in self.dirs.items()}, memory_bytes)
        try:
            for path in group.dirs.values():
                path.mkdir()
            if self.version == 2:
                _limit_v2(group.dirs[V2], memory_bytes, max_pids)
            else:
                _limit_v1(group.dirs, memory_bytes, max_pids)
        except OSError:
            group.remove_now()
            raise
        return group

    def remove(self) -> None:
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def _v2_relative(own: str, mount_root: str) -> str:
    """`own` (as /proc/self/cgroup says) relative to the part of the hierarchy the mount shows."""
    if mount_root not in ("", "/") and (own == mount_root or own.startswith(mount_root.rstrip("/") + "/")):
        return own[len(mount_root.rstrip("/")):] or "/"
    return own


def _enable(group: Path, *, evacuate: bool) -> None:
    """Make sure `group`'s children get memory and pids. `evacuate`: `group` is this cgroup namespace's root, whose
    processes may move into a leaf so that the controllers can be enabled (the no-internal-processes rule)."""
    control = group / "cgroup.subtree_control"
    wanted = [c for c in CONTROLLERS if c not in control.read_text().split()]
    if not wanted:
        return
    line = " ".join(f"+{c}" for c in wanted)
    try:
        control.write_text(line)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY or not evacuate:
            raise
    leaf = group / V2_LEAF
    leaf.mkdir(exist_ok=True)
    moved = 0
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            (leaf / "cgroup.procs").write_text(pid)
            moved += 1
        except OSError as exc:  # gone meanwhile, or a kernel thread: it stays, and the write below says if it counts
            log.debug("pid %s stays in %s: %s", pid, group, exc)
    control.write_text(line)
    log.info("cgroup v2: moved %d processes of %s into %s to enable %s for task groups", moved, group, leaf, line)


def _limit_v1(dirs: dict[str, Path], memory_bytes: int, max_pids: int) -> None:
    mem = dirs["memory"]
    (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
    swap = mem / "memory.memsw.limit_in_bytes"
    if swap.exists():  # memory + swap: no escaping the limit into swap
        with contextlib.suppress(OSError):
            swap.write_text(str(memory_bytes))
    (dirs["pids"] / "pids.max").write_text(str(max_pids))


def _limit_v2(group: Path, memory_bytes: int, max_pids: int) -> None:
    (group / "memory.max").write_text(str(memory_bytes))
    # No escaping the limit into swap; and past it the whole run goes, as the watchdog does: a test process that lost
    # a worker to the OOM killer would otherwise go on and be graded on what was left.
    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
        if (group / name).exists():
            (group / name).write_text(value)
    (group / "pids.max").write_text(str(max_pids))


@dataclass
class TaskStats:
    memory_peak_mb: float
    memory_limit_hit: bool
    pids_limit_hit: bool


@dataclass
class TaskCgroup:
    dirs: dict[str, Path]
    memory_bytes: int = 0

    def wrap(self, argv: list[str]) -> list[str]:
        return ["/bin/sh", "-c", _JOIN, "sh", *(str(d / "cgroup.procs") for d in self.dirs.values()), "--", *argv]

    def attach(self, pid: int, kill: Callable[[], None]) -> None:
        """Nothing to do once the run is born inside the group (`watchdog.WatchedRun` has work here)."""

    def detach(self) -> None:
        pass

    def stats(self) -> TaskStats:
        if V2 in self.dirs:
            return _stats_v2(self.dirs[V2], self.memory_bytes)
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
        return TaskStats(round(peak / 2**20, 1), hit, _events(self.dirs["pids"] / "pids.events").get("max", 0) > 0)

    async def remove(self) -> None:
        """Remove the groups; the run's processes are gone, but the kernel may take a moment to say so (usually
        well under a millisecond, tens of ms on a loaded host: the first retries come quickly, as the task's
        verdict waits for this)."""
        delay, waited = 0.001, 0.0
        while not self.remove_now():
            if waited > 1.0:
                log.warning("cgroup %s still busy; left in place", self.dirs)
                return
            if V2 in self.dirs and waited == 0.0:
                # Whatever escaped the process group and its pid namespace (nothing should): v2 kills it in one write.
                with contextlib.suppress(OSError):
                    (self.dirs[V2] / "cgroup.kill").write_text("1")
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


def _stats_v2(group: Path, limit: int) -> TaskStats:
    # memory.peak exists from Linux 5.19; before it, the current usage is the best there is.
    peak = _read_int(group / "memory.peak") or _read_int(group / "memory.current")
    mem = _events(group / "memory.events")
    hit = mem.get("oom_kill", 0) > 0 or mem.get("oom", 0) > 0 or (limit > 0 and peak >= limit)
    return TaskStats(round(peak / 2**20, 1), hit, _events(group / "pids.events").get("max", 0) > 0)


def _events(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (`memory.events`, `pids.events`): name -> count ({} if unreadable)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
    return out


def _sweep(parent: Path) -> None:
    """Remove the empty groups of executors that died without removing them (their pid is gone)."""
    for folder in parent.glob("grpo-sandbox-*"):
        pid = folder.name.split("-")[2] if folder.name.count("-") >= 2 else ""
        if not pid.isdigit() or pid_alive(int(pid)):
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
