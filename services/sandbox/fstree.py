"""Removing and reading what sandboxed code may have shaped: trees of any depth, links never followed, mounts left
by a killed executor detached first, files read only when they are regular and small. Used by the task trees
(`workspace.py`), the sessions and the image layers."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

MNT_DETACH = 2


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def walk_tree(root: Path) -> Iterator[str]:
    """Every path under `root` (not `root`), never following symlinks, with an explicit stack: `os.walk` recurses
    once per level on Python 3.11, and a patch or session can nest folders past the recursion limit."""
    stack = [str(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                yield entry.path
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


def remove_tree(path: Path) -> None:
    """Remove a folder the sandboxed code may have shaped: `shutil.rmtree` recurses once per level (1,100 nested
    folders raise RecursionError on Python 3.11) and gives up on names it cannot handle; `rm -rf` walks any depth.
    Never follows symlinks, never crosses into another filesystem."""
    unmount_under(path)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except (OSError, RecursionError) as exc:
        done = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0 and os.path.lexists(path):
            log.error("could not remove %s (%s): %s", path, type(exc).__name__, done.stderr.strip()[-300:])


def unmount_under(path: Path, mountinfo: str = "/proc/self/mountinfo") -> None:
    """Detach the mounts at or below `path`, deepest first: the size-limited tmpfs of a tree (a session's, or one an
    executor that was killed left mounted), which a removal could otherwise only empty."""
    if os.geteuid() != 0:
        return  # only root mounts trees
    prefix = os.path.realpath(path)
    try:
        with open(mountinfo) as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return
    # mountinfo escapes a space in a path as \040: trees are named by the executor, never with one.
    under = [p for p in points if p == prefix or p.startswith(prefix.rstrip("/") + "/")]
    for point in sorted(set(under), key=len, reverse=True):
        libc().umount2(point.encode(), MNT_DETACH)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def sweep_dead_roots(parent: Path, prefix: str) -> list[Path]:
    """Remove the work roots `PREFIX<pid>-*` under `parent` whose executor pid is gone: one killed with SIGKILL
    (the chaos test, an OOM kill) never ran its cleanup, and its trees and tmpfs mounts would stay for good. A root
    named otherwise, or whose pid is alive (ours included), is never touched."""
    removed = []
    for folder in sorted(parent.glob(f"{prefix}*")):
        pid = folder.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)) or not folder.is_dir() or folder.is_symlink():
            continue
        remove_tree(folder)
        removed.append(folder)
    return removed


def remove_path(path: Path) -> None:
    """Remove a file, symlink or folder without following symlinks."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        remove_tree(path)
    else:
        path.unlink()


def read_regular(path: Path, limit: int) -> bytes:
    """Read a regular file written by untrusted code: no symlinks (O_NOFOLLOW), no FIFOs/devices, at most `limit`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path.name} is not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{path.name} is larger than {limit} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
