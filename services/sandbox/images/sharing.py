"""Storing the files two cached images share once: hard links between their unpacked root filesystems.

The donor is the cached image with the longest common run of leading layers. A file of the new rootfs becomes a
hard link to the donor's file at the same path when both are the same regular file (size, mode, owner, mtime) and
either no layer after the shared prefix, in either image, touched that path (then both copies come from the same
layer blob: equal without reading them), or their bytes compare equal. Which paths a layer touches is read from the
layer's tar headers once per layer (small layers only, `LISTED_LAYER_BYTES`), and kept in the image's metadata.
"""

from __future__ import annotations

import contextlib
import filecmp
import gzip
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

LISTED_LAYER_BYTES = 256 << 20
"""Layers up to this (compressed) size get their paths listed; a bigger tail layer means comparing bytes."""


def layer_paths(blob: Path) -> list[str]:
    """Paths a layer tar touches: its entries, and for whiteouts the path they delete (opaque: the folder)."""
    paths = []
    opener = gzip.open if _is_gzip(blob) else open
    with opener(blob, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        for info in tar:
            name = os.path.normpath(info.name.lstrip("./") or ".")
            head, base = os.path.split(name)
            if base == ".wh..wh..opq":
                name = head
            elif base.startswith(".wh."):
                name = os.path.join(head, base[4:])
            paths.append(name)
    return paths


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def touched(listings: Iterable[list[str]]) -> set[str]:
    return {p for paths in listings for p in paths}


def _untouched(rel: str, paths: set[str]) -> bool:
    """No tail layer wrote, deleted or replaced `rel` or a folder above it."""
    while rel not in ("", "."):
        if rel in paths:
            return False
        rel = os.path.dirname(rel)
    return True


def _same_meta(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mode, a.st_uid, a.st_gid, int(a.st_mtime)) == \
        (b.st_size, b.st_mode, b.st_uid, b.st_gid, int(b.st_mtime))


def share_files(new: Path, old: Path, tail_paths: set[str] | None = None) -> int:
    """Hard-link files of `new` identical to the same path in `old`; returns bytes saved. `tail_paths`: every path
    the layers after the shared prefix touched, in both images (None: unknown, compare every file's bytes)."""
    saved = 0
    for dirpath, _, filenames in os.walk(new):
        rel_dir = os.path.relpath(dirpath, new)
        for name in filenames:
            mine, theirs = os.path.join(dirpath, name), os.path.join(old, rel_dir, name)
            try:
                a, b = os.lstat(mine), os.lstat(theirs)
            except FileNotFoundError:
                continue
            if not (os.path.isfile(mine) and not os.path.islink(mine) and os.path.isfile(theirs)
                    and not os.path.islink(theirs)) or a.st_ino == b.st_ino or not _same_meta(a, b):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not (tail_paths is not None and _untouched(rel, tail_paths)) and \
                    not filecmp.cmp(mine, theirs, shallow=False):
                continue
            tmp = f"{mine}.grpo-link"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.link(theirs, tmp)
            os.replace(tmp, mine)
            saved += a.st_blocks * 512
    return saved
