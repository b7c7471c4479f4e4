"""Picking the halves: `make_senders` from `policy.weight_sync` (trainer), `make_receiver` from a push's header
(worker), and `receive`, the whole receiving side of one `PushWeights` call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import torch

from fleet.config.infra import ServicesConfig
from fleet.config.policy import GrpcWeightSyncConfig, NcclWeightSyncConfig, WeightSyncConfig
from grpofleet.v1 import common_pb2
from services.runtime.errors import InvalidArgument
from weightsync.base import OnStaged, Stager, WeightReceiver, WeightSender
from weightsync.dtypes import DTYPES
from weightsync.grpc import GrpcReceiver, GrpcSender
from weightsync.header import Spec, WeightSet, decode_header
from weightsync.tcp import TcpReceiver, TcpSender


def make_senders(sync: WeightSyncConfig, services: ServicesConfig,
                 device: torch.device) -> tuple[WeightSender, WeightSender]:
    """(sender of every publish, sender for late joiners). Late joiners are synced over tcp when the transport is
    nccl (a new NCCL group per joiner would cost seconds each), else over the chosen transport."""
    if isinstance(sync, GrpcWeightSyncConfig):
        sender = GrpcSender(sync, services)
        return sender, sender
    late = TcpSender(sync, services)
    if isinstance(sync, NcclWeightSyncConfig):
        if device.type != "cuda":
            raise ValueError("policy.weight_sync.transport=nccl needs a CUDA trainer; use tcp on CPU")
        from weightsync.nccl import NcclSender  # torch.distributed only where NCCL is used

        return NcclSender(sync, services, device), late
    return late, late


def make_receiver(header: common_pb2.WeightSetHeader, *, peer_host: str, timeout_s: float) -> WeightReceiver:
    """The receiving half of the header's transport (an empty one is grpc, the proto's default)."""
    transport = header.transport or "grpc"
    if transport == "tcp":
        return TcpReceiver(header, peer_host=peer_host, timeout_s=timeout_s)
    if transport == "grpc":
        return GrpcReceiver(header, peer_host=peer_host, timeout_s=timeout_s)
    if transport == "nccl":
        from weightsync.nccl import NcclReceiver

        return NcclReceiver(header, peer_host=peer_host, timeout_s=timeout_s)
    raise InvalidArgument(f"unknown weight transport {transport!r} (expected 'grpc', 'tcp' or 'nccl')")


def _fresh(metas: Sequence[tuple[str, tuple[int, ...], str]]) -> dict[str, torch.Tensor]:
    return {name: torch.empty(shape, dtype=DTYPES[dtype]) for name, shape, dtype in metas}


async def receive(chunks: AsyncIterator[object], spec: Spec, *, stage: Stager = _fresh,
                  on_staged: OnStaged | None = None, peer_host: str = "127.0.0.1",
                  timeout_s: float = 600.0) -> WeightSet:
    """Read a PushWeights stream (protobuf WeightChunk messages) into a WeightSet. The header is checked against
    `spec` before any byte is received. Host transports (tcp, grpc) receive into the `stage`d memory (on any failure
    here that memory is released, if it has a `release`); `on_staged(staged)` runs before the bytes are read (the
    engine may start loading as they come: over TCP each finished tensor is reported to `staged.tensor_received`).
    nccl receives onto this process's GPU. `peer_host`: where the call came from, the stream's host when the header
    leaves it empty."""
    it = aiter(chunks)
    header, ws = decode_header(await anext(it, None), spec)
    receiver = make_receiver(header, peer_host=peer_host, timeout_s=timeout_s)
    await receiver.receive(ws, it, stage, on_staged)
    return ws

