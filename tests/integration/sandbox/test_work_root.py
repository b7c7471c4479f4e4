"""With `sandbox.work_root` unset the executor makes its own root under the temp folder, named by its pid, and on
start removes the roots of executors that are gone: one killed with SIGKILL never ran its cleanup, and its trees
and tmpfs mounts would otherwise stay on the host for good. On the real executor."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import WORK_ROOT_PREFIX, Executor
from services.sandbox.fstree import unmount_under


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def _leave_roots(tmp_path: Path) -> tuple[Path, Path, Path, Path | None]:
    """A root as a SIGKILLed executor leaves it (a session lock, a tree on its own tmpfs when root), one of a live
    executor (ours), and one named without a pid."""
    parent = tmp_path.resolve()
    dead = parent / f"{WORK_ROOT_PREFIX}{_dead_pid()}-k1ll3d"
    (dead / "sessions-0").mkdir(parents=True)
    (dead / "sessions-0" / ".lock").write_text("")
    tree = dead / "0123abcd" / "tree"
    tree.mkdir(parents=True)
    mounted = None
    if os.geteuid() == 0:  # as the executor mounts a size-limited tree
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tree)], check=True)
        (tree / "left.py").write_text("x = 1\n")
        mounted = tree
    alive = parent / f"{WORK_ROOT_PREFIX}{os.getpid()}-running"
    foreign = parent / f"{WORK_ROOT_PREFIX}q82d5bsa"  # whose it is cannot be told
    alive.mkdir()
    foreign.mkdir()
    return dead, alive, foreign, mounted


async def test_a_root_left_by_a_killed_executor_is_removed_and_live_or_foreign_ones_are_kept(
        sandbox_cfg: SandboxConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead, alive, foreign, mounted = _leave_roots(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(dead.parent))

    try:
        async with Executor(sandbox_cfg.model_copy(update={"work_root": None})) as ex:
            assert not dead.exists()
            assert mounted is None or not _mounted(mounted)
            assert alive.is_dir() and foreign.is_dir()
            own = ex.work_root
            assert own is not None and own.parent == dead.parent
            assert own.name.startswith(f"{WORK_ROOT_PREFIX}{os.getpid()}-")
        assert not own.exists()  # a clean close removes its own root
        assert alive.is_dir() and foreign.is_dir()
    finally:
        unmount_under(tmp_path)  # should the sweep fail, its mount must not outlive the test
