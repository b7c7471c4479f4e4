"""Per-run writable layers over a cached image: the run sees the image's files and writes only to its own layer.

`overlay` (the executor is root and the kernel allows it): an overlayfs mount, lowerdir = the cached rootfs,
upperdir/workdir in the run's folder; a run costs one mount, whatever the image's size. `copy`: `cp -a
--reflink=auto` of the rootfs (reflink where the filesystem has it), for hosts where overlay mounts are refused.
Either way the cached image is never written: that is what lets every run and executor of the host share it.

Run folders live in `root/<executor id>/`, locked by their executor; `start()` unmounts and removes the folders of
executors that died (their lock is free), so a SIGKILLed executor leaves nothing behind after the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from services.sandbox.fstree import remove_tree

log = logging.getLogger(__name__)
LayerMode = Literal["auto", "overlay", "copy"]


@dataclass(frozen=True)
class Layer:
    path: Path
    merged: Path
    """What the run sees as `/`."""
    mounted: bool

    @property
    def io(self) -> Path:
        """Files the executor hands to the run (patch, eval script), bound read-only inside."""
        return self.path / "io"


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point.startswith(prefix):
                found.append(mount_point)
    return sorted(found, key=len, reverse=True)  # innermost first


def _umount(path: str) -> None:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True)  # busy: detach now, freed when idle


class RunLayers:
    """Creates and removes the per-run layers of one executor."""

    def __init__(self, root: Path, mode: LayerMode = "auto") -> None:
        self.root = root
        self.mode: LayerMode = mode
        self.own = root / uuid.uuid4().hex
        self._lock_fd: int | None = None
        self.created = 0

    def start(self) -> int:
        """Claim this executor's folder, clean up after dead executors, pick the layer mode; returns folders removed."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(f"{self.own}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.own.mkdir(mode=0o700)
        removed = self._sweep()
        if self.mode == "auto":
            self.mode = "overlay" if self._overlay_works() else "copy"
        elif self.mode == "overlay" and not self._overlay_works():
            raise RuntimeError(f"sandbox.image_layers=overlay but an overlay mount fails under {self.root} "
                               "(not root, or a filesystem overlay cannot use; try copy)")
        return removed

    def _sweep(self) -> int:
        removed = 0
        for entry in self.root.iterdir():
            if entry == self.own or entry.name.endswith(".lock") or not entry.is_dir():
                continue
            lock = self.root / f"{entry.name}.lock"
            fd = None
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue  # a live executor's runs
            try:
                for mount_point in _mounts_under(entry):
                    _umount(mount_point)
                remove_tree(entry)  # an agent's upper dir: any depth
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                removed += 1
                log.info("removed run layers left by a dead executor: %s", entry)
            finally:
                if fd is not None:
                    os.close(fd)
        return removed

    def _overlay_works(self) -> bool:
        if os.geteuid() != 0:
            return False
        probe = self.own / "probe"
        for sub in ("lower", "upper", "work", "merged"):
            (probe / sub).mkdir(parents=True)
        ok = self._mount(probe / "lower", probe) == 0
        if ok:
            _umount(str(probe / "merged"))
        shutil.rmtree(probe, ignore_errors=True)
        return ok

    @staticmethod
    def _mount(lower: Path, path: Path) -> int:
        opts = f"lowerdir={lower},upperdir={path / 'upper'},workdir={path / 'work'}"
        return subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(path / "merged")],
                              capture_output=True).returncode

    async def create(self, rootfs: Path) -> Layer:
        path = self.own / uuid.uuid4().hex
        layer = await asyncio.to_thread(self._create, rootfs, path)
        self.created += 1
        return layer

    def _create(self, rootfs: Path, path: Path) -> Layer:
        (path / "io").mkdir(parents=True)
        if self.mode == "overlay":
            for sub in ("upper", "work", "merged"):
                (path / sub).mkdir()
            if self._mount(rootfs, path) != 0:
                raise OSError(f"overlay mount over {rootfs} failed")
            return Layer(path, path / "merged", True)
        done = subprocess.run(["cp", "-a", "--reflink=auto", str(rootfs), str(path / "merged")],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"copy of {rootfs} failed: {done.stderr[-300:]}")
        return Layer(path, path / "merged", False)

    async def remove(self, layer: Layer) -> None:
        await asyncio.to_thread(self._remove, layer)

    @staticmethod
    def _remove(layer: Layer) -> None:
        for mount_point in _mounts_under(layer.path):
            _umount(mount_point)
        remove_tree(layer.path)

    def close(self) -> None:
        if self._lock_fd is None:
            return
        for mount_point in _mounts_under(self.own):
            _umount(mount_point)
        remove_tree(self.own)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.own}.lock")
        os.close(self._lock_fd)
        self._lock_fd = None
