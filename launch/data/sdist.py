"""Pinned sdists: downloaded through pip into a cache, checked against the recipe's sha256, extracted safely."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".zip", ".tar.bz2")


class SdistError(RuntimeError):
    """An sdist that cannot be fetched, or whose content is not the pinned one."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _canonical(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _cached(cache_dir: Path, package: str, version: str, sha256: str) -> Path | None:
    for path in sorted(cache_dir.glob("*")):
        stem = _canonical(path.name)
        if path.name.endswith(_ARCHIVE_SUFFIXES) and stem.startswith(f"{_canonical(package)}_{_canonical(version)}"):
            if sha256_file(path) == sha256:
                return path
            log.warning("cached %s does not match the pinned sha256; downloading again", path)
    return None


def fetch_sdist(package: str, version: str, sha256: str, cache_dir: str | Path) -> Path:
    """The sdist archive of `package==version` in `cache_dir`, downloaded with pip when absent.

    The hash is checked on every call (a cache can be tampered with or half-written), not only after downloads.
    """
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    hit = _cached(cache, package, version, sha256)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        # `--no-binary PACKAGE`, not `:all:`: the latter reaches the build environment that prepares the sdist's
        # metadata too (setuptools built from its own sdist): toolz took 17 s to download in the image, 3.5 s without.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", package, "--quiet",
               "--disable-pip-version-check", f"{package}=={version}", "-d", tmp]
        log.info("downloading sdist %s==%s", package, version)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SdistError(f"pip download {package}=={version} failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-2000:]}")
        archives = [p for p in Path(tmp).iterdir() if p.name.endswith(_ARCHIVE_SUFFIXES)]
        if len(archives) != 1:
            raise SdistError(f"pip download {package}=={version} produced {[p.name for p in archives]}, "
                             "expected one sdist archive")
        got = sha256_file(archives[0])
        if got != sha256:
            raise SdistError(f"{archives[0].name}: sha256 {got} differs from the recipe's {sha256} "
                             f"(the recipe pins {package}=={version})")
        # Rename into place so that a concurrent or interrupted build never sees a partial archive.
        final = cache / archives[0].name
        archives[0].replace(final)
        return final


def extract_sdist(archive: Path, dest: str | Path) -> Path:
    """Extract into `dest` and return the sdist's top-level folder."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise SdistError(f"{archive.name}: unsafe member path {name!r}")
            zf.extractall(out)
    else:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                # The "data" filter refuses absolute paths, links out of the tree and device files.
                tf.extractall(out, filter="data")
            else:  # Python before 3.11.4 (Debian bookworm's 3.11.2, in the images): the same refusals, by hand
                _check_members(archive, tf.getmembers())
                tf.extractall(out)
    tops = [p for p in out.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SdistError(f"{archive.name}: expected one top-level folder, found {[p.name for p in tops]}")
    return tops[0]


def _check_members(archive: Path, members: list[tarfile.TarInfo]) -> None:
    for m in members:
        parts = Path(m.name).parts
        link = Path(m.name).parent / m.linkname if m.issym() else Path(m.linkname)
        if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            raise SdistError(f"{archive.name}: unsafe member {m.name!r}")
        if (m.issym() or m.islnk()) and (m.linkname.startswith("/") or ".." in link.parts):
            raise SdistError(f"{archive.name}: link {m.name!r} points out of the tree")
