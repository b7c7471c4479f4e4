"""Reading and writing files of a session's tree as the executor (root) without following anything the sandboxed
code planted: every path component is opened with `O_NOFOLLOW` relative to its parent (`openat`), so a symlink
anywhere in the path -- `link -> /etc`, `a/../..` -- cannot lead outside the tree. Files written are handed to the
session's uid, so the commands that follow can change them. Also: removing the session folders of dead executors."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from services.sandbox.fstree import remove_tree

log = logging.getLogger(__name__)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NAME_MAX, PATH_MAX = 255, 4095
"""Linux's limits on one path component and a whole path, in bytes: longer ones are the agent's error, not an OSError
deep in a request."""


class PathRefused(ValueError):
    """A path that is not a plain relative path inside the tree (absolute, `..`, empty, through a symlink)."""


def tree_parts(rel: str) -> tuple[str, ...]:
    """The components of `rel`, or PathRefused: relative, no `..`, no empty path, no NUL, valid UTF-8 (no lone
    surrogate), within the kernel's name and path lengths."""
    if not rel or "\0" in rel:
        raise PathRefused("path: must be a non-empty path relative to the repository root, without NUL bytes")
    try:
        raw = rel.encode()
    except UnicodeEncodeError:
        raise PathRefused(f"path: {rel!r} is not valid UTF-8 (a lone surrogate)") from None
    if len(raw) > PATH_MAX:
        raise PathRefused(f"path: {len(raw)} bytes is longer than the {PATH_MAX} a path can be")
    path = PurePosixPath(rel)
    if path.is_absolute():
        raise PathRefused(f"path: {rel!r} must be relative to the repository root, not absolute")
    parts = tuple(p for p in path.parts if p != ".")
    if not parts or ".." in parts:
        raise PathRefused(f"path: {rel!r} must stay inside the repository (no '..')")
    if long := next((p for p in parts if len(p.encode()) > NAME_MAX), None):
        raise PathRefused(f"path: the name {long[:40]!r}... is {len(long.encode())} bytes, longer than the "
                          f"{NAME_MAX} a file name can be")
    return parts


@contextmanager
def _parent_fd(tree: Path, parts: tuple[str, ...], *, create: bool, uid: int | None) -> Iterator[int]:
    fd = os.open(tree, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if uid is not None:
                    os.fchown(nxt, uid, uid)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise PathRefused(f"path: {'/'.join(parts)!r} goes through a symlink or a file") from exc
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def read_tree_file(tree: Path, rel: str, limit: int) -> tuple[bytes, int]:
    """(the first `limit` bytes, the file's size). FileNotFoundError if absent; PathRefused for a symlink,
    a folder or anything but a regular file."""
    parts = tree_parts(rel)
    with _parent_fd(tree, parts[:-1], create=False, uid=None) as dfd:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PathRefused(f"path: {rel!r} is a symlink") from exc
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"path: {rel!r} is not a regular file")
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st.st_size
    finally:
        os.close(fd)


def write_tree_file(tree: Path, rel: str, data: bytes, uid: int | None) -> None:
    """Create or replace a regular file (parents made as needed), owned by `uid`. A hard-linked file is refused:
    its other name may lie outside the tree."""
    parts = tree_parts(rel)
    with _parent_fd(tree, parts[:-1], create=True, uid=uid) as dfd:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise PathRefused(f"path: {rel!r} is a symlink, a folder or a special file") from exc
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise PathRefused(f"path: {rel!r} is not a plain file (special file or hard link)")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if uid is not None:
            os.fchown(fd, uid, uid)
    finally:
        os.close(fd)


def remove_dead_session_dirs(root: Path) -> None:
    """Session trees of executor processes that died (their flock on `sessions-*/.lock` is gone): removed, never
    adopted."""
    for folder in root.glob("sessions-*"):
        try:
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            remove_tree(folder)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live executor's
        finally:
            os.close(fd)
        log.info("removing the sessions of a dead executor: %s", folder)
        remove_tree(folder)
