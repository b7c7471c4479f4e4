"""The header codec: what a push announces before its bytes (`WeightSetHeader`: version, run epoch, every tensor's
name, shape and dtype, and where the bytes come from), both ways.

Sending: a `WeightSnapshot` (the trainer's CPU copy) encodes its header, with the fields of the transport that moves
the bytes. Receiving: `decode_header` reads the first `WeightChunk` of a `PushWeights` stream and checks the announced
set against the served model (`check_against_spec`) before any byte is received, so a wrong set costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fleet.contracts.weights import WeightsId
from grpofleet.v1 import common_pb2
from services.runtime.errors import InvalidArgument
from weightsync.dtypes import DTYPE_NAMES, DTYPES, element_size

Spec = Mapping[str, tuple[tuple[int, ...], str]]
"""HF checkpoint name -> (shape, dtype name) of every tensor a push must carry (a rollout engine's `weight_spec`)."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * element_size(self.dtype)


@dataclass
class WeightSet:
    """A received push: its header's contract and, once received, its tensors."""

    id: WeightsId
    transport: str
    metas: list[TensorMeta]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.id.version

    @property
    def epoch(self) -> int:
        return self.id.epoch

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.metas)


@dataclass(frozen=True)
class WeightSnapshot:
    """The trainer's weights of one identity, minted by the training loop (never patched afterwards)."""

    id: WeightsId
    tensors: dict[str, torch.Tensor]  # HF name -> CPU tensor in the served dtype, contiguous, not a parameter view

    @property
    def version(self) -> int:
        return self.id.version

    @property
    def epoch(self) -> int:
        return self.id.epoch

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def metas(self) -> list[TensorMeta]:
        return [TensorMeta(n, DTYPE_NAMES[t.dtype], tuple(t.shape)) for n, t in self.tensors.items()]

    def header(self, transport: str = "grpc", **where: Any) -> common_pb2.WeightSetHeader:
        """The header of a push of this snapshot; `where`: the transport's fields (stream_*, nccl_*)."""
        metas = [common_pb2.TensorMeta(name=m.name, dtype=m.dtype, shape=list(m.shape)) for m in self.metas()]
        return common_pb2.WeightSetHeader(version=self.version, epoch=self.epoch, tensors=metas, transport=transport,
                                          total_bytes=self.total_bytes, **where)


def decode_header(first: object | None, spec: Spec) -> tuple[common_pb2.WeightSetHeader, WeightSet]:
    """The header of a push (its first message) and the WeightSet it announces, checked against `spec`."""
    if first is None or first.WhichOneof("payload") != "header":  # type: ignore[attr-defined]
        raise InvalidArgument("a weight push must start with a header")
    h: common_pb2.WeightSetHeader = first.header  # type: ignore[attr-defined]
    if h.version < 0:
        raise InvalidArgument(f"weight version must be >= 0, got {h.version}")
    metas = [TensorMeta(t.name, t.dtype, tuple(int(d) for d in t.shape)) for t in h.tensors]
    check_against_spec(metas, spec)
    return h, WeightSet(WeightsId(h.epoch, h.version), h.transport or "grpc", metas)


def check_against_spec(metas: list[TensorMeta], spec: Spec) -> None:
    """Raise InvalidArgument naming the first tensor that the model does not have, or has with another shape/dtype.
    A push must cover every parameter of the model: a partial set would leave the engine half old, half new."""
    if not metas:
        raise InvalidArgument("weight push announces no tensors")
    seen: set[str] = set()
    for m in metas:
        if m.name in seen:
            raise InvalidArgument(f"tensor {m.name!r} announced twice")
        seen.add(m.name)
        if m.dtype not in DTYPES:
            raise InvalidArgument(f"tensor {m.name!r}: unsupported dtype {m.dtype!r} (expected one of {list(DTYPES)})")
        if m.name not in spec:
            raise InvalidArgument(f"tensor {m.name!r} is not a parameter of the served model")
        shape, dtype = spec[m.name]
        if tuple(shape) != m.shape:
            raise InvalidArgument(f"tensor {m.name!r}: shape {list(m.shape)} does not match the model's {list(shape)}")
        if dtype != m.dtype:
            raise InvalidArgument(f"tensor {m.name!r}: dtype {m.dtype} does not match the model's {dtype}")
    missing = sorted(set(spec) - seen)
    if missing:
        raise InvalidArgument(f"weight push lacks {len(missing)} model tensors, e.g. {missing[0]!r}")


def byte_view(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as a flat byte view (no copy; writable where the tensor is)."""
    if not t.numel():
        return memoryview(bytearray())
    return t.reshape(-1).view(torch.uint8).numpy().data
