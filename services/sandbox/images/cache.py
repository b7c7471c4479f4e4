"""The host-shared image cache: every image unpacked once, content-addressed, within a size budget.

Layout of `root` (`sandbox.image_cache_dir`), shared by every executor of the host:
  images/<digest>/rootfs/   the unpacked root filesystem (read-only to runs: they write to their own layer)
  images/<digest>/meta.json ref, layers, image config (Env, WorkingDir), bytes this image added to the cache
  refs/<sha256(ref)>        the digest last pulled for that reference (a hit needs no registry round trip)
  locks/                    flocks: `ref-*` (one pull per reference at a time), `img-*` (held shared while a run
                            uses the image; eviction needs it exclusive), `cache` (size bookkeeping, eviction)
  tmp/<id>/ + tmp/<id>.lock a pull in progress, locked by its puller
Crash safety: an image appears under images/ only by one rename of a complete folder, so a pull killed half way
leaves only tmp/<id>, whose lock died with its puller; the next pull or executor start removes it.
Shared layers: a new rootfs's files that are identical (same path, metadata and bytes) to those of the cached image
with the longest common layer prefix are hard links to them, so N instances of one repository hold their base and
environment layers once. Runs never write to these files (overlay copy-up, or a copy), so sharing them is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services.sandbox.images.pull import Puller, PullError, read_image
from services.sandbox.images.sharing import LISTED_LAYER_BYTES, layer_paths, share_files, touched

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedImage:
    ref: str
    digest: str
    path: Path
    layers: list[str] = field(default_factory=list)
    config: dict[str, object] = field(default_factory=dict)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    def env(self) -> dict[str, str]:
        """The image's `Env` (PATH of a conda image, for instance)."""
        raw = self.config.get("Env")
        pairs = [str(e).partition("=") for e in raw] if isinstance(raw, list) else []
        return {k: v for k, _, v in pairs if k}


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)


def _try_flock(path: Path) -> int | None:
    """An exclusive non-blocking lock (its fd), or None when someone holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def tree_bytes(path: Path, seen: set[tuple[int, int]] | None = None) -> int:
    """Disk bytes under `path`, each inode once (hard links shared with folders already in `seen` are free)."""
    seen = set() if seen is None else seen
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


class ImageCache:
    """`async with cache.use(ref) as image:` an unpacked image, pulled on a miss, held against eviction."""

    def __init__(self, root: Path, puller: Puller, budget_bytes: int) -> None:
        self.root = root
        self.puller = puller
        self.budget = budget_bytes
        self.unpacks = 0
        self._pulling: dict[str, asyncio.Task[CachedImage]] = {}
        for sub in ("images", "refs", "locks", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    # -- lookups ----------------------------------------------------------------------------------------------
    def _lookup(self, ref: str) -> CachedImage | None:
        try:
            digest = (self.root / "refs" / _key(ref)).read_text().strip()
            return self._load(ref, digest)
        except (FileNotFoundError, ValueError):
            return None

    def _load(self, ref: str, digest: str) -> CachedImage:
        path = self.root / "images" / digest.replace(":", "-")
        meta = json.loads((path / "meta.json").read_text())
        return CachedImage(ref, digest, path, list(meta.get("layers", [])), dict(meta.get("config", {})))

    def images(self) -> list[Path]:
        return sorted(p for p in (self.root / "images").iterdir() if (p / "meta.json").is_file())

    def size(self) -> int:
        """Bytes the cache holds, as recorded (each shared file once)."""
        try:
            return int(json.loads((self.root / "state.json").read_text())["bytes"])
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    # -- use and pull -----------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, ref: str) -> AsyncIterator[CachedImage]:
        """The image of `ref`, held (shared lock) until the block ends; raises PullError naming it."""
        image = await self.ensure(ref)
        fd = await asyncio.to_thread(self._hold, image)
        if fd is None:  # evicted between ensure and hold: pull again, once
            image = await self.ensure(ref)
            fd = await asyncio.to_thread(self._hold, image)
            if fd is None:
                raise PullError(ref, "evicted from the image cache while starting (cache too small?)")
        try:
            os.utime(image.path / "meta.json")  # LRU order
            yield image
        finally:
            os.close(fd)

    def _hold(self, image: CachedImage) -> int | None:
        fd = os.open(self.root / "locks" / f"img-{image.digest.replace(':', '-')}", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if not (image.path / "meta.json").is_file():
            os.close(fd)
            return None
        return fd

    async def ensure(self, ref: str) -> CachedImage:
        """The cached image of `ref`, pulled and unpacked once per host however many ask at the same time."""
        hit = self._lookup(ref)
        if hit is not None:
            return hit
        task = self._pulling.get(ref)
        if task is None:  # one pull per reference in this process; the ref flock covers other processes
            task = asyncio.ensure_future(self._pull_locked(ref))
            self._pulling[ref] = task
            task.add_done_callback(lambda _: self._pulling.pop(ref, None))
        return await asyncio.shield(task)

    async def _pull_locked(self, ref: str) -> CachedImage:
        lock = self.root / "locks" / f"ref-{_key(ref)}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            hit = self._lookup(ref)  # another executor pulled it while we waited
            if hit is not None:
                return hit
            return await self._pull(ref)
        finally:
            os.close(fd)

    async def _pull(self, ref: str) -> CachedImage:
        tid = uuid.uuid4().hex
        tmp = self.root / "tmp" / tid
        lock_fd = os.open(self.root / "tmp" / f"{tid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            await asyncio.to_thread(self.sweep)
            tmp.mkdir()
            t0 = time.monotonic()
            await self.puller.fetch(ref, tmp / "oci")
            digest, layers, config = read_image(tmp / "oci")
            final = self.root / "images" / digest.replace(":", "-")
            if not (final / "meta.json").is_file():
                await self.puller.unpack(ref, tmp / "oci", tmp / "rootfs")
                added = await asyncio.to_thread(self._finish, tmp, layers)
                self._publish(tmp, final, {"ref": ref, "digest": digest, "layers": layers, "config": config,
                                           "bytes": added})
                self.unpacks += 1
                log.info("image %s (%s) cached in %.1f s, %d MB", ref, digest[:19], time.monotonic() - t0,
                         added >> 20)
            (self.root / "refs" / _key(ref)).write_text(digest + "\n")
            await asyncio.to_thread(self._account, ref, digest)
            return self._load(ref, digest)
        except OSError as exc:
            raise PullError(ref, f"cache write failed: {exc}") from exc
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.root / "tmp" / f"{tid}.lock")
            os.close(lock_fd)

    def _finish(self, tmp: Path, layers: list[str]) -> int:
        self._list_layers(tmp / "oci", layers[1:])
        shutil.rmtree(tmp / "oci")  # the blobs are not needed once unpacked
        donor, shared = self._donor(layers)
        if donor is not None:
            theirs = json.loads((donor / "meta.json").read_text()).get("layers", [])
            share_files(tmp / "rootfs", donor / "rootfs", self._tail_paths([*layers[shared:], *theirs[shared:]]))
        seen: set[tuple[int, int]] = set()
        if donor is not None:
            tree_bytes(donor / "rootfs", seen)
        return tree_bytes(tmp / "rootfs", seen)

    def _list_layers(self, layout: Path, layers: list[str]) -> None:
        """Record the paths each small layer touches, once per layer digest on this host (`layers/`)."""
        (self.root / "layers").mkdir(exist_ok=True)
        for digest in layers:
            out = self.root / "layers" / f"{digest.replace(':', '-')}.json"
            blob = layout / "blobs" / digest.replace(":", "/", 1)
            if out.exists() or not blob.is_file() or blob.stat().st_size > LISTED_LAYER_BYTES:
                continue
            try:
                paths = layer_paths(blob)
            except (tarfile.TarError, EOFError, OSError, zlib.error):  # zstd or odd layers: compare their bytes
                continue
            tmp = out.with_suffix(f".{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps(paths))
            os.replace(tmp, out)

    def _tail_paths(self, layers: list[str]) -> set[str] | None:
        """Every path the given layers touch (None when one of them was too big to list)."""
        listings = []
        for digest in layers:
            try:
                listings.append(json.loads((self.root / "layers" / f"{digest.replace(':', '-')}.json").read_text()))
            except (FileNotFoundError, ValueError):
                return None
        return touched(listings)

    def _donor(self, layers: list[str]) -> tuple[Path | None, int]:
        """The cached image sharing the longest leading run of layers with `layers`, and that run's length."""
        best, best_n = None, 0
        for path in self.images():
            with contextlib.suppress(FileNotFoundError, ValueError):
                theirs = json.loads((path / "meta.json").read_text()).get("layers", [])
                n = next((i for i, (a, b) in enumerate(zip(layers, theirs, strict=False)) if a != b),
                         min(len(layers), len(theirs)))
                if n > best_n:
                    best, best_n = path, n
        return best, best_n

    @staticmethod
    def _publish(tmp: Path, final: Path, meta: dict[str, object]) -> None:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)  # atomic: a reader sees a complete image or none
        except OSError:
            if not (final / "meta.json").is_file():
                raise

    # -- size budget ------------------------------------------------------------------------------------------
    def _account(self, ref: str, new_digest: str) -> None:
        """Evict LRU images not in use until the cache fits its budget; if the new image still does not fit, it
        goes too and the pull fails (naming the image): a full cache is an infrastructure error."""
        keep = new_digest.replace(":", "-")
        with _flock(self.root / "locks" / "cache", fcntl.LOCK_EX):
            total = sum(int(json.loads((p / "meta.json").read_text()).get("bytes", 0)) for p in self.images())
            if total > self.budget:
                total = self._evict(total, keep=keep)
            full = total > self.budget
            if full:
                self._remove(self.root / "images" / keep)
                total = self._recount()
            (self.root / "state.json").write_text(json.dumps({"bytes": total, "images": len(self.images())}))
        if full:
            raise PullError(ref, f"image cache full: images in use hold more than the budget of "
                                 f"{self.budget >> 20} MB (sandbox.image_cache_gb)")

    def _remove(self, path: Path) -> None:
        gone = self.root / "tmp" / f"evict-{uuid.uuid4().hex}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, gone)
            shutil.rmtree(gone, ignore_errors=True)

    def _evict(self, total: int, keep: str) -> int:
        by_age = sorted(self.images(), key=lambda p: (p / "meta.json").stat().st_mtime)
        for path in by_age:
            if total <= self.budget:
                break
            if path.name == keep:
                continue
            fd = _try_flock(self.root / "locks" / f"img-{path.name}")
            if fd is None and (self.root / "locks" / f"img-{path.name}").exists():
                continue  # in use by a run
            try:
                self._remove(path)
                log.info("evicted image %s from the cache (LRU)", path.name)
            finally:
                if fd is not None:
                    os.close(fd)
            total = self._recount()
        return total

    def _recount(self) -> int:
        """Bytes per image again, each shared inode charged to the oldest image that holds it."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for path in sorted(self.images(), key=lambda p: (p / "meta.json").stat().st_ctime):
            added = tree_bytes(path / "rootfs", seen)
            meta = json.loads((path / "meta.json").read_text())
            meta["bytes"] = added
            (path / "meta.json").write_text(json.dumps(meta, indent=1))
            total += added
        return total

    # -- crash recovery ---------------------------------------------------------------------------------------
    def sweep(self) -> int:
        """Remove pulls and evictions that a killed process left in tmp/; returns how many went."""
        removed = 0
        tmp = self.root / "tmp"
        for entry in list(tmp.iterdir()):
            if entry.name.endswith(".lock"):
                continue
            lock = tmp / f"{entry.name}.lock"
            fd = _try_flock(lock)
            if fd is None and lock.exists():
                continue  # a live pull
            try:
                shutil.rmtree(entry, ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                removed += 1
            finally:
                if fd is not None:
                    os.close(fd)
        return removed

    def stats(self) -> dict[str, object]:
        return {"image_cache_bytes": self.size(), "images_held": len(self.images()),
                "pulls_in_flight": self.puller.in_flight, "image_pulls": self.puller.pulls,
                "image_unpacks": self.unpacks}
