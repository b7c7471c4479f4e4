"""Files two cached images share are stored once, and never a file that a later layer changed."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from services.sandbox.images.sharing import layer_paths, share_files


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (1_000_000, 1_000_000))
    return path


def test_untouched_files_are_linked_and_tail_changes_are_not(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        _write(root, "usr/lib/same.py", "shared\n")
    _write(old, "testbed/core.py", "aaaa\n")
    _write(new, "testbed/core.py", "bbbb\n")  # same size and mtime, other bytes, written by a tail layer
    share_files(new, old, tail_paths={"testbed"})
    assert os.stat(new / "usr/lib/same.py").st_ino == os.stat(old / "usr/lib/same.py").st_ino
    assert (new / "testbed/core.py").read_text() == "bbbb\n"
    assert os.stat(new / "testbed/core.py").st_ino != os.stat(old / "testbed/core.py").st_ino


def test_without_layer_listings_bytes_are_compared(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _write(old, "etc/conf", "xxxx\n")
    _write(new, "etc/conf", "yyyy\n")
    _write(old, "etc/same", "same\n")
    _write(new, "etc/same", "same\n")
    share_files(new, old, tail_paths=None)
    assert (new / "etc/conf").read_text() == "yyyy\n"
    assert os.stat(new / "etc/same").st_ino == os.stat(old / "etc/same").st_ino


def test_layer_paths_include_what_whiteouts_delete(tmp_path: Path) -> None:
    blob = tmp_path / "layer.tar"
    with tarfile.open(blob, "w") as tar:
        for name in ("./testbed/a.py", "./etc/.wh.passwd", "./opt/env/.wh..wh..opq"):
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO(b""))
    assert layer_paths(blob) == ["testbed/a.py", "etc/passwd", "opt/env"]
