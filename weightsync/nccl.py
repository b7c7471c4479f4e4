"""transport=nccl (GPU trainer and GPU workers): one NCCL broadcast from the trainer (rank 0) to every rollout worker.

The gRPC `PushWeights` call still carries the contract (header: version, epoch, tensor names/shapes/dtypes, and the
rendezvous `tcp://HOST:PORT`, world size and this worker's rank); only the bytes travel over NCCL. The process group
is made once per rendezvous with a TCPStore and reused by every later push (creating an NCCL communicator costs
seconds; a push must not). Tensors are packed into per-dtype flat buckets so that a 0.5B model moves in a few large
collectives instead of hundreds of small ones.

`NcclSender` (trainer) makes the rendezvous and broadcasts; `NcclReceiver` (worker) joins it and receives the
buckets onto its GPU. Untested in CI (no GPUs there): benchmarks/gpu_weight_push.py and nccl_link_check.py run it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from fleet.config.infra import ServicesConfig
from fleet.config.policy import NcclWeightSyncConfig
from fleet.contracts.weights import WorkerRef
from grpofleet.v1 import common_pb2
from weightsync.base import OnStaged, PushResult, Stager, WeightReceiver, WeightSender, header_only
from weightsync.dtypes import DTYPES
from weightsync.header import TensorMeta, WeightSet, WeightSnapshot

log = logging.getLogger(__name__)
BUCKET_BYTES = 1 << 30
_links: dict[str, NcclLink] = {}
_lock = threading.Lock()


class NcclLink:
    """A stateless NCCL group between the trainer and the workers, independent of any default process group (the
    trainer's torchrun group and this one coexist)."""

    def __init__(self, init_method: str, world_size: int, rank: int, device: torch.device) -> None:
        url = urlparse(init_method)
        if url.scheme != "tcp" or not url.hostname or not url.port:
            raise ValueError(f"NCCL rendezvous must be tcp://HOST:PORT, got {init_method!r}")
        self.rank, self.world_size, self.device = rank, world_size, device
        # The PG's heartbeat monitor polls the rendezvous store every second for a "dump debug info" flag. The store
        # lives in the trainer, which exits (and restarts) while workers stay up: every poll would then log a
        # "Broken pipe" warning with a stack trace, forever. This link carries one broadcast per push; a hang shows
        # up as the push's deadline instead. Read when the PG is made; an explicit setting is kept.
        os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "0")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
        store_cls = dist.TCPStore  # type: ignore[attr-defined]
        self.store = store_cls(url.hostname, url.port, world_size, is_master=rank == 0, timeout=timedelta(seconds=120))
        self.pg = dist.ProcessGroupNCCL(self.store, rank, world_size, dist.ProcessGroupNCCL.Options())

    def close(self) -> None:
        abort = getattr(self.pg, "abort", None)  # frees the communicator without waiting for peers that are gone
        if abort is not None:
            try:
                abort()
            except Exception as exc:  # a link being dropped: nothing left to protect
                log.warning("aborting the NCCL weight link failed: %s", exc)

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()  # type: ignore[attr-defined]


def link(init_method: str, world_size: int, rank: int, device: torch.device) -> NcclLink:
    """The link for this rendezvous, made on first use. A new rendezvous means a new trainer run or worker set: the
    links to older ones are aborted (their peers are gone or have moved on)."""
    with _lock:
        existing = _links.get(init_method)
        if existing is None:
            for stale in [k for k in _links if k != init_method]:
                _links.pop(stale).close()
            existing = _links[init_method] = NcclLink(init_method, world_size, rank, device)
        return existing


def buckets(metas: list[TensorMeta]) -> list[tuple[str, list[int]]]:
    """Group tensor indices into same-dtype buckets of at most BUCKET_BYTES (a larger tensor gets its own)."""
    out: list[tuple[str, list[int]]] = []
    current: dict[str, tuple[list[int], int]] = {}
    for i, m in enumerate(metas):
        idx, size = current.get(m.dtype, ([], 0))
        if idx and size + m.nbytes > BUCKET_BYTES:
            out.append((m.dtype, idx))
            idx, size = [], 0
        idx.append(i)
        current[m.dtype] = (idx, size + m.nbytes)
    out.extend((dtype, idx) for dtype, (idx, _) in current.items() if idx)
    return out


def send(lk: NcclLink, metas: list[TensorMeta], tensors: Mapping[str, torch.Tensor]) -> None:
    """Trainer side (rank 0): broadcast every bucket."""
    for dtype, idx in buckets(metas):
        flat = torch.cat([tensors[metas[i].name].detach().to(lk.device, DTYPES[dtype]).reshape(-1) for i in idx])
        lk.broadcast(flat)
    torch.cuda.synchronize(lk.device)


def recv(lk: NcclLink, metas: list[TensorMeta]) -> dict[str, torch.Tensor]:
    """Worker side: receive every bucket and split it back into named tensors (views of the bucket)."""
    out: dict[str, torch.Tensor] = {}
    for dtype, idx in buckets(metas):
        numels = [_numel(metas[i].shape) for i in idx]
        flat = torch.empty(sum(numels), dtype=DTYPES[dtype], device=lk.device)
        lk.broadcast(flat)
        for i, part in zip(idx, torch.split(flat, numels), strict=True):
            out[metas[i].name] = part.view(metas[i].shape)
    torch.cuda.synchronize(lk.device)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class NcclSender(WeightSender):
    """Header over gRPC, bytes over one NCCL broadcast (trainer rank 0 = NCCL rank 0, workers 1..N).

    A communicator is made once per worker set and reused (making one costs seconds); a new worker set gets a new
    rendezvous port. The tcp sender serves late joiners (see `factory.make_senders`)."""

    sync: NcclWeightSyncConfig

    def __init__(self, sync: NcclWeightSyncConfig, services: ServicesConfig, device: torch.device) -> None:
        super().__init__(sync, services)
        self.device = device
        self._link_key: tuple[str, ...] = ()
        self._init_method = ""

    def _rendezvous(self, workers: list[WorkerRef]) -> str:
        key = tuple(w.worker_id for w in workers)
        if key != self._link_key:
            addr = self.sync.nccl_address
            if addr is None:
                with socket.socket() as s:
                    s.bind(("", 0))
                    addr = f"{socket.gethostname()}:{s.getsockname()[1]}"
            self._link_key, self._init_method = key, f"tcp://{addr}"
        return self._init_method

    async def push(self, snapshot: WeightSnapshot, workers: list[WorkerRef]) -> list[PushResult]:
        init = self._rendezvous(workers)
        world = len(workers) + 1

        def header(rank: int) -> AsyncIterator[common_pb2.WeightChunk]:
            return header_only(snapshot.header("nccl", nccl_init_method=init, nccl_world_size=world, nccl_rank=rank))

        n = snapshot.total_bytes
        calls = [asyncio.ensure_future(self._call(w, header(i + 1), n)) for i, w in enumerate(workers)]
        metas = snapshot.metas()

        def broadcast() -> None:
            send(link(init, world, 0, self.device), metas, snapshot.tensors)

        try:
            await asyncio.to_thread(broadcast)
        except Exception as exc:  # the next push makes a fresh rendezvous
            log.error("NCCL weight broadcast failed: %s", exc)
            self._link_key = ()
        return list(await asyncio.gather(*calls))


class NcclReceiver(WeightReceiver):
    """Joins the header's rendezvous and receives the buckets onto this process's GPU (no host staging: the engine
    copies them in on the device). Runs in a thread: the collective blocks until the trainer sends."""

    def __init__(self, header: common_pb2.WeightSetHeader, *, peer_host: str, timeout_s: float,
                 device: torch.device | None = None) -> None:
        super().__init__(header, peer_host=peer_host, timeout_s=timeout_s)
        self.device = device

    async def receive(self, ws: WeightSet, rest: AsyncIterator[object], stage: Stager,
                      on_staged: OnStaged | None) -> None:
        h = self.header
        dev = self.device or torch.device("cuda", torch.cuda.current_device())

        def work() -> dict[str, torch.Tensor]:
            return recv(link(h.nccl_init_method, h.nccl_world_size, h.nccl_rank, dev), ws.metas)

        ws.tensors = await asyncio.to_thread(work)
