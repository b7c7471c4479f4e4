"""The policy (and, when the KL penalty needs it, a frozen reference): HF load, precision, AC, compile, FSDP2.

Wrapping order follows torchtitan: activation checkpointing, then `torch.compile` per decoder layer, then
`fully_shard` per decoder layer and on the root. AC replaces a module's `forward` by a non-reentrant
`torch.utils.checkpoint` of it, so the checkpoint lies INSIDE the compiled layer (Dynamo traces it and AOTAutograd
recomputes the region in the backward), as torchtitan's compile-of-checkpoint-wrapper does; HF's
`gradient_checkpointing_enable` would checkpoint outside the compiled call. Scope `layer` checkpoints whole decoder
layers (least memory, one extra forward); `mlp` only each layer's MLP (its gate/up activations are most of a layer's
saved bytes, while attention, the costly part at long context, is not recomputed). Both AC and compile
(`nn.Module.compile`, in place) keep parameter names, so the state dict stays in HF checkpoint names: checkpoints
`save_pretrained` as-is and weight pushes need no renaming.

Precision: parameters are fp32 masters. With several ranks they are sharded by FSDP2 and computed in
`policy.precision` through `MixedPrecisionPolicy` (gradients reduced in fp32); a single process (CPU or one GPU)
keeps them whole and computes under autocast.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.dist import Dist
from trainer.logprobs import PackedInputs, linear_logprobs, unpack
from weightsync.dtypes import DTYPES  # torch only: the GPU bench machines have no pydantic or gRPC stubs

if TYPE_CHECKING:
    from fleet.config.policy import PolicyConfig

log = logging.getLogger(__name__)

# Rollout engines record RAW log-probs (log_softmax of the unmodified logits, before temperature: the contract in
# rollout/engine/base.py). pi_theta and pi_old must be the same quantity or the IS weight pi_old/pi_gen is biased.
LOGPROB_TEMPERATURE = 1.0


class PolicyModule(nn.Module):
    """An HF causal LM whose forward returns log pi(response token) instead of logits (see trainer.logprobs)."""

    lm: Any  # an HF PreTrainedModel; typed loosely because nn.Module attribute access is untyped
    image_codec: Any = None  # computer use: the processor's image side (workshop.vision.ImageCodec), set by the caller

    def __init__(self, lm: nn.Module, *, temperature: float, chunk_tokens: int, compiled: bool = False,
                 saved_grad_bytes: int = 0) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.compiled = compiled
        self.saved_grad_bytes = saved_grad_bytes
        if getattr(self.lm.get_output_embeddings(), "bias", None) is not None:
            raise ValueError("policy.model_name: an lm_head with a bias is not supported by the fused log-prob path")

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, gather_index: torch.Tensor, targets: torch.Tensor,
        images: tuple[bytes, ...] = (), attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`attention_mask`: [R, 1, L, L] bool (True: may attend), for rows that share prompts (`pack`); None:
        causal attention within each sample, from the position ids."""
        if images:  # computer use: M-RoPE positions from the image grid (trainer/vlm.py), never the packed ones
            from trainer.vlm import vision_hidden

            hidden = vision_hidden(self.lm, self.image_codec, input_ids, images)
        else:
            if attention_mask is not None and self.lm.config._attn_implementation == "eager":
                # Eager attention adds its mask to the scores (sdpa takes a boolean one as it is).
                dtype = self.lm.get_input_embeddings().weight.dtype
                attention_mask = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device) \
                    .masked_fill_(~attention_mask, torch.finfo(dtype).min)
            hidden = self.lm.model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                   use_cache=False).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, gather_index)
        weight = self.lm.get_output_embeddings().weight
        return linear_logprobs(picked, weight, targets, temperature=self.temperature, chunk=self.chunk_tokens,
                               compiled=self.compiled and picked.is_cuda, save_bytes=self.saved_grad_bytes)


def resolve_model_path(name: str) -> str:
    """An HF folder for `policy.model_name` (`tiny-qwen2` is made on first use), via the fleet's one resolver."""
    from workshop.resolve import resolve_model

    return resolve_model(name)


def _load_hf(path: str, cfg: PolicyConfig, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from workshop.tinyvlm import is_vision_model

    auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM  # the whole VLM, as served
    lm = auto.from_pretrained(path, dtype=dtype, attn_implementation=cfg.attn_implementation)
    lm.config.use_cache = False
    return lm


def _layers(lm: Any) -> list[nn.Module]:
    base = getattr(lm, "model", None)
    # A Qwen2-VL's decoder layers sit under its language model (the vision tower is wrapped with the root).
    layers = getattr(getattr(base, "language_model", base), "layers", None)
    if layers is None:
        raise ValueError("policy.model_name: expected a decoder-only HF model with `model.layers`")
    return list(layers)


def _shard(module: nn.Module, lm: Any, dist: Dist, mp_dtype: torch.dtype | None, reshard: bool = True) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32) if mp_dtype else MixedPrecisionPolicy()
    layers = _layers(lm)
    for i, layer in enumerate(layers):
        # The last layer's parameters are needed again right away by backward: keep them gathered.
        fully_shard(layer, reshard_after_forward=reshard and i < len(layers) - 1, mp_policy=mp)
    # Root: embeddings, final norm and lm_head (tied to the embeddings in small Qwen2 models) share one group.
    fully_shard(module, reshard_after_forward=False, mp_policy=mp)


def build_policy(cfg: PolicyConfig, path: str, dist: Dist) -> PolicyModule:
    """The trainable policy from an HF folder, on the device, wrapped per the config."""
    return wrap_policy(_load_hf(path, cfg, torch.float32), cfg, dist, name=path)


def wrap_policy(lm: Any, cfg: PolicyConfig, dist: Dist, *, name: str = "policy") -> PolicyModule:
    """AC, compile, FSDP2 (or device placement) around an HF model holding fp32 parameters."""
    if cfg.low_precision_residual and not dist.distributed:
        low_precision_residual(lm, DTYPES[cfg.precision])
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(lm, cfg.activation_checkpointing_scope)
    if cfg.compile:
        if getattr(lm.config, "_attn_implementation", None) == "flash_attention_4":
            flash_attention_4_outside_compile()
        for layer in _layers(lm):
            layer.compile()
    module = PolicyModule(lm, temperature=LOGPROB_TEMPERATURE, chunk_tokens=cfg.logprob_chunk_tokens,
                          compiled=cfg.compile, saved_grad_bytes=int(cfg.logprob_saved_grad_gb * 2**30))
    compute = DTYPES[cfg.precision]
    if dist.distributed:
        _shard(module, lm, dist, compute if compute != torch.float32 else None, cfg.fsdp_reshard_after_forward)
    else:
        module.to(dist.device)
    module.train()
    log.info("%s: %.1fM parameters, %s compute, fsdp=%s, ac=%s, compile=%s", name,
             sum(p.numel() for p in lm.parameters()) / 1e6, cfg.precision, dist.distributed,
             cfg.activation_checkpointing and cfg.activation_checkpointing_scope, cfg.compile)
    return module


def flash_attention_4_outside_compile() -> None:
    """Run transformers' `flash_attention_4` attention eagerly inside compiled layers (a graph break around it).
    Traced by Dynamo, FlashAttention-4's CuTe DSL re-enters its JIT on every call (on an H200 a step never finished
    within 150 s); eager, its kernels are cached and the rest of the layer still compiles (docs/performance.md)."""
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward

    AttentionInterface.register("flash_attention_4", torch.compiler.disable(flash_attention_forward))


def low_precision_residual(lm: Any, dtype: torch.dtype) -> None:
    """Cast the input embeddings' output to `dtype` (in place, a forward hook), so the residual stream, the norms'
    inputs and what the layers save for the backward are `dtype` rather than the fp32 of the master weights: the
    single process then computes what FSDP2's bf16 MixedPrecisionPolicy (and a bf16 rollout engine) does, with half
    the bytes through every residual add and norm. No-op for float32."""
    if dtype == torch.float32:
        return

    def cast(_module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        return out.to(dtype) if out.is_floating_point() else out

    lm.get_input_embeddings().register_forward_hook(cast)


def _checkpointed(forward: Any) -> Any:
    """`forward`, run under a non-reentrant checkpoint: its activations are recomputed in the backward."""
    from torch.utils.checkpoint import checkpoint

    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_activation_checkpointing(lm: Any, scope: str) -> None:
    """Checkpoint every decoder layer (`scope="layer"`) or every layer's MLP (`"mlp"`), in place (module docstring)."""
    for layer in _layers(lm):
        target = layer if scope == "layer" else getattr(layer, "mlp", None)
        if scope not in ("layer", "mlp") or target is None:
            raise ValueError(f"policy.activation_checkpointing_scope={scope!r}: expected 'layer' or 'mlp' "
                             "(and decoder layers with an `mlp` module for 'mlp')")
        target.forward = _checkpointed(target.forward)


def packing_supported() -> bool:
    """Whether transformers turns restarting position ids into a block-diagonal mask (transformers >= 4.54).
    Without it, packed samples would attend to each other: the caller must not pack."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True


def build_reference(cfg: PolicyConfig, path: str, dist: Dist) -> PolicyModule:
    """A frozen copy of the initial policy, kept in the compute dtype (it never trains, so no fp32 masters)."""
    lm = _load_hf(path, cfg, DTYPES[cfg.precision])
    lm.requires_grad_(False)
    module = PolicyModule(lm, temperature=LOGPROB_TEMPERATURE, chunk_tokens=cfg.logprob_chunk_tokens,
                          compiled=cfg.compile)
    if dist.distributed:
        _shard(module, lm, dist, None)
    else:
        module.to(dist.device)
    return module.eval()


def autocast(cfg: PolicyConfig, dist: Dist) -> contextlib.AbstractContextManager[None]:
    """Mixed precision of the single-process path (FSDP2 casts by itself)."""
    dtype = DTYPES[cfg.precision]
    if dist.distributed or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=dist.device.type, dtype=dtype)


def forward_logprobs(module: PolicyModule, packed: PackedInputs, device: torch.device) -> torch.Tensor:
    """[B, T] log-probabilities of the response tokens of one packed micro-batch."""
    p = packed.to(device)
    values = module(p.input_ids, p.position_ids, p.gather_index, p.targets, p.images, p.attention_mask)
    return unpack(values, p)


def iter_full_state(module: PolicyModule) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of the policy's weights. Under FSDP2 every rank must iterate this in step
    (each `full_tensor()` is an all-gather); tied duplicates (lm_head = embeddings) are skipped, as save_pretrained
    does, so the names match an HF checkpoint's."""
    from torch.distributed.tensor import DTensor

    from trainer.vlm import checkpoint_names

    lm = module.lm
    tied = _tied_names(lm)
    renamed = checkpoint_names(lm)  # a VLM's module names differ from its checkpoint's (and the engine's)
    for name, value in lm.state_dict().items():
        if name in tied:
            continue
        yield renamed.get(name, name), value.full_tensor() if isinstance(value, DTensor) else value


def _tied_names(lm: Any) -> set[str]:
    if not getattr(lm.config, "tie_word_embeddings", False):
        return set()
    out = lm.get_output_embeddings()
    return {n + ".weight" for n, m in lm.named_modules() if m is out and n}
