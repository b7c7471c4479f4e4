"""Per-run cgroup (v1 hierarchies, as on these hosts) limiting memory and processes of an image run.

Why: an image run executes as uid 0 (SWE-bench's eval scripts expect root: they `pip install`, write under
/opt), and the kernel never enforces RLIMIT_NPROC for uid 0, so the `pids` controller is what stops a fork bomb.
Groups are made below the executor's own group of each controller (so the host's limits on the executor still
apply), named `grpo-run-*`; `sweep()` removes empty ones a killed executor left. Where the controllers cannot be
written (not root, cgroup v2 without delegation) runs fall back to the rlimits alone, and `health` says so.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import uuid
from pathlib import Path

_BASE = Path("/sys/fs/cgroup")
CONTROLLERS = ("pids", "memory")


def _own_group(controller: str) -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            group = _BASE / controller / path.lstrip("/")
            return group if os.access(group, os.W_OK) else None
    return None


def available() -> bool:
    return os.geteuid() == 0 and all(_own_group(c) is not None for c in CONTROLLERS)


class RunCgroup:
    """One run's groups; `wrap(argv)` makes the command join them before it execs."""

    def __init__(self, memory_bytes: int, pids_max: int) -> None:
        self.name = f"grpo-run-{uuid.uuid4().hex[:16]}"
        self.paths: list[Path] = []
        limits = {"pids": {"pids.max": str(pids_max)},
                  "memory": {"memory.limit_in_bytes": str(memory_bytes),
                             "memory.memsw.limit_in_bytes": str(memory_bytes)}}
        for controller in CONTROLLERS:
            parent = _own_group(controller)
            if parent is None:
                continue
            path = parent / self.name
            path.mkdir()
            self.paths.append(path)
            for key, value in limits[controller].items():
                with contextlib.suppress(FileNotFoundError, PermissionError, OSError):
                    (path / key).write_text(value)  # memsw exists only with swap accounting

    def wrap(self, argv: list[str]) -> list[str]:
        if not self.paths:
            return argv
        joins = "; ".join(f"echo $$ > {shlex.quote(str(p / 'cgroup.procs'))}" for p in self.paths)
        return ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh", *argv]

    def oom_killed(self) -> bool:
        for path in self.paths:
            with contextlib.suppress(OSError):
                fields = dict(line.split() for line in (path / "memory.oom_control").read_text().splitlines())
                if int(fields.get("oom_kill", 0)) > 0:
                    return True
        return False

    def remove(self) -> None:
        for path in self.paths:
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
            with contextlib.suppress(OSError):
                path.rmdir()


def sweep() -> int:
    """Remove empty `grpo-run-*` groups (a killed executor's); busy ones refuse rmdir and stay."""
    removed = 0
    for controller in CONTROLLERS:
        parent = _own_group(controller)
        if parent is None:
            continue
        for path in parent.glob("grpo-run-*"):
            with contextlib.suppress(OSError):
                path.rmdir()
                removed += 1
    return removed
