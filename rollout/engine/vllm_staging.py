"""Tmpfs staging of weight pushes for the vLLM engine: one raw file per push (`policy.generation.vllm_cfg.staging_dir`)
that the engine process writes (a receiver writes the pushed bytes straight into views of its mapping) and vLLM's
worker process maps (`map_stage`: `torch.from_file(shared=True)`, no read copy), so only a path and an index cross
the process boundaries. The file is kept and reused by the next push (its pages are allocated once).

The first 64 bytes are progress words (`Progress`: the push's id and how many tensors hold their bytes), which the
worker's packer polls to pack each decoder layer as soon as its bytes are in (rollout/engine/vllm_worker.py). Both
processes import this module; it imports neither vLLM nor the engine.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollout.engine.base import GenerationEngine, StagedWeights

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

StageIndex = list[tuple[str, str, tuple[int, ...], int, int]]
"""(name, torch dtype name, shape, byte offset, byte length) of each tensor in a staging file."""

def map_stage(path: str) -> torch.Tensor:
    """The whole staging file as shared uint8 memory (getsize first: from_file(shared=True) would create a missing
    file rather than fail)."""
    import torch

    return torch.from_file(path, shared=True, size=os.path.getsize(path), dtype=torch.uint8)


def staged_tensors(buf: torch.Tensor, index: StageIndex) -> list[tuple[str, torch.Tensor]]:
    import torch

    return [(name, buf[off : off + n].view(getattr(torch, dtype)).view(shape)) for name, dtype, shape, off, n in index]


class Progress:
    """The first bytes of a staging file: two int64 words, the push's id and how many of its tensors (in arrival
    order) hold their bytes; -1 = abandoned. The receiver writes them, the vLLM worker's packer reads them."""

    BYTES = 64

    @staticmethod
    def write(mapping: mmap.mmap, push_id: int, done: int) -> None:
        struct.pack_into("<qq", mapping, 0, push_id, done)


def aligned_index(metas: Sequence[tuple[str, tuple[int, ...], str]]) -> tuple[StageIndex, int]:
    """Where each tensor lies in a staging file (64-byte aligned starts after the progress words), and its size."""
    import torch

    index: StageIndex = []
    offset = Progress.BYTES
    for name, shape, dtype in metas:
        offset += -offset % 64
        n = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        for d in shape:
            n *= d
        index.append((name, dtype, tuple(shape), offset, n))
        offset += n
    return index, offset


@dataclass
class StageFile:
    """A raw staging file on tmpfs and this process's writable mapping of it."""

    path: str
    size: int
    mapping: mmap.mmap
    inode: int = -1

    def still_there(self) -> bool:
        """The path still names this file (not removed, nor replaced by another file)."""
        try:
            return os.stat(self.path).st_ino == self.inode
        except FileNotFoundError:
            return False

    @classmethod
    def create_in(cls, staging_dir: str | None, size: int) -> StageFile | None:
        """A new staging file of `size` bytes, or None without a staging dir with room for it."""
        if staging_dir is None or not os.path.isdir(staging_dir):
            return None
        if shutil.disk_usage(staging_dir).free < size + (64 << 20):  # e.g. Docker's 64 MB /dev/shm
            log.warning("staging dir %s lacks room for %d MB; weights travel inline", staging_dir, size >> 20)
            return None
        return cls.create(staging_dir, size)

    @classmethod
    def create(cls, staging_dir: str, size: int) -> StageFile:
        path = os.path.join(staging_dir, f"grpo-fleet-stage-{os.getpid()}-{time.monotonic_ns()}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # Pages allocated and mapped now rather than faulted in one by one while the push is received.
            os.posix_fallocate(fd, 0, max(size, 1))
            mapping = mmap.mmap(fd, max(size, 1), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            inode = os.fstat(fd).st_ino
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(path, size, mapping, inode)

    def remove(self) -> None:
        try:
            self.mapping.close()
        except BufferError:  # a view is still referenced somewhere; the mapping goes when it does
            pass
        if self.still_there():
            os.unlink(self.path)


def remove_orphaned_stages(staging_dir: str | None) -> None:
    if staging_dir is None or not os.path.isdir(staging_dir):
        return
    for path in Path(staging_dir).glob("grpo-fleet-stage-*-*.bin"):
        try:
            os.kill(int(path.name.split("-")[3]), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            log.info("removed %s (its process is gone)", path)
        except (ValueError, PermissionError, IndexError):  # not ours to judge
            continue


class FileStaged(StagedWeights):
    """Staged tensors that are views of a `StageFile`'s mapping, laid out as `index` says."""

    def __init__(self, tensors: dict[str, torch.Tensor], owner: GenerationEngine, file: StageFile,
                 index: StageIndex) -> None:
        super().__init__(tensors, owner)
        self.file = file
        self.index = index
        self.push_id = time.monotonic_ns()
        self.packing = False  # whether the vLLM worker already packs it as it arrives
        Progress.write(file.mapping, self.push_id, 0)

    @classmethod
    def over(cls, file: StageFile, index: StageIndex, owner: GenerationEngine) -> FileStaged:
        """Views of `file`'s mapping, laid out as `index` says."""
        import torch

        buf = torch.frombuffer(file.mapping, dtype=torch.uint8)
        tensors = {name: buf[off : off + n].view(getattr(torch, dtype)).view(shape)
                   for name, dtype, shape, off, n in index}
        return cls(tensors, owner, file, index)

    def tensor_received(self, i: int) -> None:
        Progress.write(self.file.mapping, self.push_id, i + 1)

    def complete(self) -> None:
        Progress.write(self.file.mapping, self.push_id, len(self.index))


def copy_into(staged: FileStaged, items: list[tuple[str, torch.Tensor]]) -> None:
    """Write tensors that were not received into the staging file into it (before the pause)."""
    for name, t in items:
        staged[name].copy_(t)
    staged.complete()
