"""Receiving a weight push: validate the announced tensor set against the model, then receive the bytes into the
memory the engine staged for them.

The check happens on the header, before any byte is received and long before the engine is touched, so a wrong
tensor set costs nothing and changes nothing. The bytes come inside the gRPC stream (`WeightChunk` slices), over a
plain TCP stream (`rollout.tcp_stream`, the fast path on CPU), or over NCCL (`rollout.nccl`, GPUs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rollout import tcp_stream
from services.runtime.errors import InvalidArgument, Unavailable

# (name, shape, dtype name) in push order -> memory to receive into; the engine's `stage`.
Stager = Callable[[Sequence[tuple[str, tuple[int, ...], str]]], dict[str, torch.Tensor]]

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


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
        return n * torch.empty((), dtype=DTYPES[self.dtype]).element_size()


@dataclass
class WeightSet:
    version: int
    epoch: int
    transport: str
    metas: list[TensorMeta]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    nccl_init_method: str = ""
    nccl_world_size: int = 0
    nccl_rank: int = 0

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.metas)


def check_against_spec(metas: list[TensorMeta], spec: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
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


def _fresh(metas: Sequence[tuple[str, tuple[int, ...], str]]) -> dict[str, torch.Tensor]:
    return {name: torch.empty(shape, dtype=DTYPES[dtype]) for name, shape, dtype in metas}


def byte_view(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's memory as a flat byte view (no copy; writable where the tensor is)."""
    if not t.numel():
        return memoryview(bytearray())
    return t.reshape(-1).view(torch.uint8).numpy().data


async def receive(chunks: AsyncIterator[object], spec: Mapping[str, tuple[tuple[int, ...], str]], *,
                  stage: Stager = _fresh, on_staged: Callable[[Any], Awaitable[None]] | None = None,
                  peer_host: str = "127.0.0.1", timeout_s: float = 600.0) -> WeightSet:
    """Read a PushWeights stream (protobuf WeightChunk messages) into a WeightSet whose tensors are the `stage`d
    memory (on any failure here that memory is released, if it has a `release`). `on_staged(staged)` runs before the
    bytes are read (the engine may start loading as they come: over TCP each finished tensor is reported to
    `staged.tensor_received`). `peer_host`: where the call came from, the stream's host when the header leaves it
    empty."""
    it = aiter(chunks)
    first = await anext(it, None)
    if first is None or first.WhichOneof("payload") != "header":  # type: ignore[attr-defined]
        raise InvalidArgument("a weight push must start with a header")
    h = first.header  # type: ignore[attr-defined]
    if h.version < 0:
        raise InvalidArgument(f"weight version must be >= 0, got {h.version}")
    metas = [TensorMeta(t.name, t.dtype, tuple(int(d) for d in t.shape)) for t in h.tensors]
    check_against_spec(metas, spec)
    ws = WeightSet(h.version, h.epoch, h.transport or "grpc", metas, nccl_init_method=h.nccl_init_method,
                   nccl_world_size=h.nccl_world_size, nccl_rank=h.nccl_rank)
    if ws.transport == "nccl":
        return ws
    if ws.transport not in ("grpc", "tcp"):
        raise InvalidArgument(f"unknown weight transport {ws.transport!r} (expected 'grpc', 'tcp' or 'nccl')")
    if ws.transport == "tcp" and (not 0 < h.stream_port < 65536 or len(h.stream_token) != tcp_stream.TOKEN_BYTES):
        raise InvalidArgument(f"tcp weight push needs stream_port in 1..65535 and a {tcp_stream.TOKEN_BYTES}-byte "
                              f"stream_token, got port {h.stream_port} and {len(h.stream_token)} bytes")
    staged = stage([(m.name, m.shape, m.dtype) for m in metas])
    try:
        views = [byte_view(t) for t in staged.values()]
        if on_staged is not None:
            await on_staged(staged)
        if ws.transport == "tcp":
            reading = asyncio.ensure_future(asyncio.to_thread(
                tcp_stream.receive_into, h.stream_host or peer_host, h.stream_port, h.stream_token, views,
                timeout_s=timeout_s, on_tensor=getattr(staged, "tensor_received", None)))
            try:
                await asyncio.shield(reading)
            except asyncio.CancelledError:
                # The call was cancelled, but the thread still writes into the staging memory: it must end (the
                # sender finishes or the connection fails) before that memory goes back to the engine.
                await asyncio.gather(reading, return_exceptions=True)
                raise
            except tcp_stream.StreamError as exc:
                raise Unavailable(str(exc)) from exc
        else:
            await _assemble(it, metas, views)
    except BaseException:
        release = getattr(staged, "release", None)
        if release is not None:
            release()
        raise
    ws.tensors = staged
    return ws


async def _assemble(it: AsyncIterator[object], metas: list[TensorMeta], views: list[memoryview]) -> None:
    filled = [0] * len(metas)
    async for chunk in it:
        s = chunk.slice  # type: ignore[attr-defined]
        if not 0 <= s.tensor_index < len(metas):
            raise InvalidArgument(f"slice for tensor index {s.tensor_index} outside the announced set")
        buf = views[s.tensor_index]
        end = s.offset + len(s.data)
        if s.offset < 0 or end > buf.nbytes:
            raise InvalidArgument(f"slice [{s.offset}, {end}) outside tensor {metas[s.tensor_index].name!r}")
        buf[s.offset:end] = s.data
        filled[s.tensor_index] += len(s.data)
    for m, buf, n in zip(metas, views, filled, strict=True):
        if n != buf.nbytes:
            raise InvalidArgument(f"tensor {m.name!r}: received {n} of {buf.nbytes} bytes")
