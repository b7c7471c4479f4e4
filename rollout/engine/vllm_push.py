"""How a weight push reaches vLLM's workers, for `VllmEngine._apply_update` (rollout/engine/vllm_engine.py).

A push ends as one `WorkerExtension` RPC (rollout/engine/vllm_worker.py) run under the pause. Everything that can
happen before the pause happens here, while generation goes on: tensors handed over in memory of their own are
copied into a tmpfs staging file (`copy_to_stage`), and with the packed CPU layout the staged push is packed into new
GEMM kernels on a thread of each worker (`pack_off_pause`), so the RPC under the pause only swaps them in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rollout.engine import vllm_worker
from rollout.engine.base import StagedWeights
from rollout.engine.vllm_staging import FileStaged, StageIndex, copy_into

if TYPE_CHECKING:
    import torch

RpcCall = tuple[str, tuple[Any, ...]]
"""A `WorkerExtension` method's name and its arguments."""
Stage = Callable[[Sequence[tuple[str, tuple[int, ...], str]]], StagedWeights]
"""`GenerationEngine.stage`: somewhere to receive tensors of these names, shapes and dtypes."""


async def rpc(llm: Any, call: RpcCall) -> list[Any]:
    """Run a `WorkerExtension` method on every vLLM worker of `llm` (an `AsyncLLM`); one result per worker."""
    method, args = call
    return list(await llm.collective_rpc(method, args=args))


def start_packing(staged: FileStaged, load: set[str]) -> RpcCall:
    """The RPC that starts packing `staged` on each vLLM worker (sorted: msgpack carries lists, not sets)."""
    return "grpo_fleet_start_packing", (staged.file.path, staged.index, staged.push_id, sorted(load))


async def copy_to_stage(stage: Stage, items: list[tuple[str, torch.Tensor]], min_bytes: int) -> FileStaged | None:
    """Tensors handed over in memory of their own, copied into a staging file (before the pause), unless they are
    below `min_bytes` or no staging file can be had: those travel inline."""
    if sum(t.numel() * t.element_size() for _, t in items) < min_bytes:
        return None
    own = stage([(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in items])
    if not isinstance(own, FileStaged):
        own.release()
        return None
    await asyncio.to_thread(copy_into, own, items)
    return own


async def load_call(llm: Any, items: list[tuple[str, torch.Tensor]], staged: StagedWeights | None, load_mode: str,
                    version: int, served_version: int) -> RpcCall:
    """The RPC that loads the push under the pause; a staged push is packed first, off the pause (packed CPU)."""
    if not isinstance(staged, FileStaged):
        return "grpo_fleet_load_inline", (vllm_worker.InlinePush(items), load_mode)
    # The loaded names are the validated ones (a tied head's alias is received, not loaded).
    names = {name for name, _ in items}
    index = [e for e in staged.index if e[0] in names]
    if load_mode == "packed":
        await pack_off_pause(llm, staged, index, version, served_version)
        return "grpo_fleet_commit_packed", (staged.file.path,)
    return "grpo_fleet_load_staged", (staged.file.path, index, load_mode)


async def pack_off_pause(llm: Any, staged: FileStaged, index: StageIndex, version: int, served_version: int) -> None:
    """Packed CPU layout: load and pack the staged push (the tensors of `index`) into new kernels on a thread of each
    vLLM worker while generation goes on (`vllm_cpu.pack_gemms`), so that the pause only swaps kernels and copies the
    small rest. A failure here leaves the served model as it was. A push received over TCP is usually being packed
    already, as it arrived (`VllmEngine.on_staged`)."""
    path = staged.file.path
    try:
        staged.complete()  # every byte is in (a receiver marks them as they come; a plain copy does not)
        if not staged.packing:
            await rpc(llm, start_packing(staged, {e[0] for e in index}))
        while True:
            states = await rpc(llm, ("grpo_fleet_packing_state", (path,)))
            failed = [st for st in states if st not in ("running", "done")]
            if failed:
                raise RuntimeError(failed[0])
            if all(st == "done" for st in states):
                return
            await asyncio.sleep(0.01)
    except BaseException as exc:
        await asyncio.shield(rpc(llm, ("grpo_fleet_drop_packed", (path,))))
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise RuntimeError(f"packing weight version {version} failed (still serving {served_version}): "
                           f"{exc}") from exc
