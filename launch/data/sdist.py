"""Pinned sdists: fetched from the package index by their sha256 (pip as the fallback) into a cache, checked against
the recipe's sha256, extracted safely."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
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


PYPI_SIMPLE = "https://pypi.org/simple"
_JSON_SIMPLE = "application/vnd.pypi.simple.v1+json"


@functools.cache
def index_url() -> str:
    """The index pip would use: its `index-url` from the environment or its config files (`pip config list` shows
    both), else PyPI's."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60, check=False)
    found = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url"):
            found[key.split(".")[0]] = value.strip().strip("'\"")
    # pip's own precedence: the environment over the `download` command's section over `global`.
    return next((found[k] for k in (":env:", "download", "global") if k in found), PYPI_SIMPLE)


@functools.cache
def _tls_context(cafile: str | None) -> ssl.SSLContext:
    # Loading the CA bundle takes ~30 ms: once per process, not once per sdist (226 of them for the corpus).
    return ssl.create_default_context(cafile=cafile)


def download_from_index(package: str, version: str, sha256: str, dest: Path, index: str | None = None) -> Path | None:
    """The file with this sha256 among `package`'s files on the index's JSON simple page (PEP 691), downloaded into
    `dest` and checked; None when the index has no JSON page or no such file, or cannot be reached (pip then tries).

    A pinned sdist needs no resolver: the recipe's hash names the file. pip download instead prepares the sdist's
    metadata in a fresh build environment (setuptools installed for each one), which was nearly all of the time it
    took: 30 s a package on two busy cores."""
    base = (index or index_url()).rstrip("/")
    page = f"{base}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    context = _tls_context(os.environ.get("PIP_CERT") or None)
    try:
        req = urllib.request.Request(page, headers={"Accept": _JSON_SIMPLE})
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            if not resp.headers.get("Content-Type", "").startswith(_JSON_SIMPLE):
                log.info("%s serves no JSON simple page (PEP 691); pip fetches %s==%s", base, package, version)
                return None
            files = json.loads(resp.read())["files"]
        match = next((f for f in files if f.get("hashes", {}).get("sha256") == sha256), None)
        if match is None:
            log.info("%s lists no file of %s with the pinned sha256; pip fetches %s==%s", page, package, package,
                     version)
            return None
        name = Path(match["filename"]).name  # a bare name by PEP 691; never a path out of `dest`
        if not name.endswith(_ARCHIVE_SUFFIXES):
            log.info("%s: the pinned file %s is no sdist archive; pip fetches %s==%s", page, name, package, version)
            return None
        out = dest / name
        with urllib.request.urlopen(urllib.parse.urljoin(page, match["url"]), timeout=600, context=context) as resp, \
                out.open("wb") as f:
            for block in iter(lambda: resp.read(1 << 20), b""):
                f.write(block)
    # URLError and timeouts are OSErrors (so is an index URL holding credentials, which pip reads and urllib does not);
    # a malformed page, ValueError or KeyError. pip then fetches it as before.
    except (OSError, ValueError, KeyError) as e:
        log.info("%s: %s; pip fetches %s==%s", page, e, package, version)
        return None
    got = sha256_file(out)
    if got != sha256:
        raise SdistError(f"{page} lists {name} with sha256 {sha256} (the pin of {package}=={version}), but the file "
                         f"it served has {got}")
    return out


def pip_download(package: str, requirement: str, dest: Path) -> Path:
    """The one sdist archive `pip download` writes into `dest` for `requirement` (`package==version`, or `package`
    for its newest); SdistError with pip's message when it fails."""
    # `--no-binary PACKAGE`, not `:all:`: the latter reaches the build environment that prepares the sdist's metadata
    # too (setuptools built from its own sdist): toolz took 17 s to download in the image, 3.5 s without.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", package, "--quiet",
           "--disable-pip-version-check", requirement, "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise SdistError(f"pip download {requirement}: no answer in 600 s") from None
    if proc.returncode != 0:
        raise SdistError(f"pip download {requirement} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    archives = [p for p in dest.iterdir() if p.name.endswith(_ARCHIVE_SUFFIXES)]
    if len(archives) != 1:
        raise SdistError(f"pip download {requirement} produced {[p.name for p in archives]}, expected one sdist "
                         "archive")
    return archives[0]


def fetch_sdist(package: str, version: str, sha256: str, cache_dir: str | Path) -> Path:
    """The sdist archive of `package==version` in `cache_dir`, fetched by its hash from the index when absent
    (`download_from_index`; pip download where the index cannot answer that way).

    The hash is checked on every call (a cache can be tampered with or half-written), not only after downloads.
    """
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    hit = _cached(cache, package, version, sha256)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        fetched = download_from_index(package, version, sha256, Path(tmp))
        if fetched is not None:
            log.info("fetched sdist %s from the index", fetched.name)
            # Renamed into place so that a concurrent or interrupted build never sees a partial archive.
            return fetched.replace(cache / fetched.name)
        log.info("downloading sdist %s==%s", package, version)
        archive = pip_download(package, f"{package}=={version}", Path(tmp))
        got = sha256_file(archive)
        if got != sha256:
            raise SdistError(f"{archive.name}: sha256 {got} differs from the recipe's {sha256} "
                             f"(the recipe pins {package}=={version})")
        final = cache / archive.name
        archive.replace(final)
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
