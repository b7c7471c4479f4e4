"""Per-token log-probabilities of response tokens: sequence packing and a fused, chunked lm_head + log-softmax.

Two costs dominate a naive `model(input_ids).logits.log_softmax(-1).gather(...)` on a 150k-token vocabulary:
the [T, V] logits (bf16, then an fp32 copy for the softmax: ~2.4 GB for one 4k sequence of Qwen2) and padding. So:

* `pack()` lays a micro-batch's samples into rows of at most `row_tokens` tokens (first-fit decreasing). Each
  sample's position ids restart at 0, which transformers turns into a block-diagonal causal mask (no cross-sample
  attention). Padding only fills the tail of the last row segment and *continues* its positions: causal attention
  never lets a real token see a later pad, and a row holding one sample keeps plain `is_causal` attention (the
  flash kernel on GPUs).
* With `share_prefixes`, samples with the same prompt (a GRPO group's G answers) share one copy of it: a row holds
  the prompt once, then each response, with positions continuing from the prompt's end, and an explicit [R, 1, L, L]
  mask lets a response token see the prompt and its own earlier tokens only. Log-probs and gradients are the
  unshared layout's (the prompt's hidden states are the same computation; its gradient sums over the responses),
  for 1/G of the prompt's compute. The mask is L^2 bytes per row, and it rules out FlashAttention's kernels.
* `trained_only()` drops the positions the loss masks out (an agent trajectory's observation tokens) from the
  lm_head's work.
* `linear_logprobs()` takes the final hidden states of the response positions only (prompt positions never reach
  the lm_head), and computes `log softmax(h W^T / temperature)[target]` over chunks of tokens in fp32. The backward
  pass needs d log p / d logits = (onehot(target) - softmax) / temperature for every chunk. Up to `save_bytes` of
  it is computed in the forward pass (in place over the chunk's logits, one fused pass) and kept, so the backward is
  two matmuls over it; beyond that budget the backward recomputes each chunk's logits instead (peak memory one
  chunk's [chunk, V]). Saving skips one [T, H] x [H, V] matmul and one pass over [T, V] per backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass
class PackedInputs:
    """One micro-batch, packed. Index tensors map between the packed rows and a padded [B, T] response layout."""

    input_ids: torch.Tensor  # [R, L] long
    position_ids: torch.Tensor  # [R, L] long
    gather_index: torch.Tensor  # [N] flat index into R*L: the position whose hidden state predicts a response token
    targets: torch.Tensor  # [N] the response token predicted there
    dest_index: torch.Tensor  # [N] flat index into B*T of that token's slot in the padded response layout
    num_samples: int  # B
    max_response: int  # T
    padded_tokens: int  # R*L - tokens laid out (waste, for metrics)
    images: tuple[bytes, ...] = ()  # computer use: the rows' screenshots (PNG), in row-major placeholder order
    attention_mask: torch.Tensor | None = None  # [R, 1, L, L] bool, True = may attend; None: causal per sample
    shared_tokens: int = 0  # prompt tokens not laid out again because an earlier sample of the row shares them

    def to(self, device: torch.device) -> PackedInputs:
        move = {k: v.to(device, non_blocking=True) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return PackedInputs(**{**vars(self), **move})


def _assign_rows(lengths: Sequence[int], capacity: int, packing: bool) -> list[list[int]]:
    """Sample indices per row: first-fit decreasing when packing (deterministic: ties keep input order)."""
    if not packing:
        return [[i] for i in range(len(lengths))]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        for r, used in enumerate(fill):
            if used + lengths[i] <= capacity:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    return rows


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    row_tokens: int,
    packing: bool = True,
    pad_id: int = 0,
    pad_multiple: int = 1,
    share_prefixes: bool = False,
) -> PackedInputs:
    """Pack (prompt, response) samples. Every prompt needs at least one token (it predicts the first response token).
    `share_prefixes`: samples with equal prompts share one copy of it (see the module docstring)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every sample needs a non-empty prompt")
    if share_prefixes:
        return _pack_shared(prompts, responses, max([row_tokens, *lengths]), packing, pad_id, pad_multiple)
    rows = _assign_rows(lengths, max([row_tokens, *lengths]), packing)
    width = max((sum(lengths[i] for i in row) for row in rows), default=1)
    width = -(-width // pad_multiple) * pad_multiple
    max_resp = max((len(r) for r in responses), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    gather: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    dest: list[torch.Tensor] = []
    for r, row in enumerate(rows):
        offset, last_len = 0, 0
        for i in row:
            seq = torch.tensor([*prompts[i], *responses[i]], dtype=torch.long)
            n, p, k = lengths[i], len(prompts[i]), len(responses[i])
            ids[r, offset : offset + n] = seq
            pos[r, offset : offset + n] = torch.arange(n)
            j = torch.arange(k)
            gather.append(r * width + offset + p - 1 + j)
            targets.append(seq[p:])
            dest.append(i * max_resp + j)
            offset, last_len = offset + n, n
        # The pad tail continues the last segment's positions (see the module docstring).
        pos[r, offset:] = torch.arange(last_len, last_len + width - offset)
    return _packed(ids, pos, gather, targets, dest, len(prompts), max_resp, sum(lengths))


def _packed(ids: torch.Tensor, pos: torch.Tensor, gather: list[torch.Tensor], targets: list[torch.Tensor],
            dest: list[torch.Tensor], num_samples: int, max_resp: int, laid_out: int,
            mask: torch.Tensor | None = None, shared: int = 0) -> PackedInputs:
    empty = torch.zeros(0, dtype=torch.long)
    return PackedInputs(
        input_ids=ids,
        position_ids=pos,
        gather_index=torch.cat(gather) if gather else empty,
        targets=torch.cat(targets) if targets else empty,
        dest_index=torch.cat(dest) if dest else empty,
        num_samples=num_samples,
        max_response=max_resp,
        padded_tokens=ids.numel() - laid_out,
        attention_mask=mask,
        shared_tokens=shared,
    )


def _prompt_trees(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                  capacity: int) -> list[list[int]]:
    """Sample indices per tree: samples with equal prompts, in input order, cut so that the prompt plus the tree's
    responses fit `capacity` tokens."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(i)
    trees: list[list[int]] = []
    for members in groups.values():
        tree: list[int] = []
        fill = 0
        for i in members:
            if tree and fill + len(responses[i]) > capacity:
                trees.append(tree)
                tree = []
            if not tree:
                fill = len(prompts[i])
            tree.append(i)
            fill += len(responses[i])
        trees.append(tree)
    return trees


def _pack_shared(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], capacity: int, packing: bool,
                 pad_id: int, pad_multiple: int) -> PackedInputs:
    """`pack` with each tree's prompt laid out once (see the module docstring)."""
    trees = _prompt_trees(prompts, responses, capacity)
    sizes = [len(prompts[t[0]]) + sum(len(responses[i]) for i in t) for t in trees]
    rows = _assign_rows(sizes, capacity, packing)
    width = max((sum(sizes[t] for t in row) for row in rows), default=1)
    width = -(-width // pad_multiple) * pad_multiple
    max_resp = max((len(r) for r in responses), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    # Pads see only themselves: a query that may attend to nothing would give NaN.
    mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1, 1)
    gather: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    dest: list[torch.Tensor] = []
    for r, row in enumerate(rows):
        offset = 0
        for t in row:
            prompt = prompts[trees[t][0]]
            p = len(prompt)
            ids[r, offset : offset + p] = torch.tensor(prompt, dtype=torch.long)
            pos[r, offset : offset + p] = torch.arange(p)
            mask[r, 0, offset : offset + p, offset : offset + p] = torch.ones(p, p, dtype=torch.bool).tril()
            s = offset + p
            for i in trees[t]:
                k = len(responses[i])
                if k == 0:
                    continue
                ids[r, s : s + k] = torch.tensor(responses[i], dtype=torch.long)
                pos[r, s : s + k] = torch.arange(p, p + k)
                mask[r, 0, s : s + k, offset : offset + p] = True
                mask[r, 0, s : s + k, s : s + k] = torch.ones(k, k, dtype=torch.bool).tril()
                # The first response token is predicted by the prompt's last position, shared by the whole tree.
                gather.append(r * width + torch.cat([torch.tensor([offset + p - 1]), torch.arange(s, s + k - 1)]))
                targets.append(torch.tensor(responses[i], dtype=torch.long))
                dest.append(i * max_resp + torch.arange(k))
                s += k
            offset = s
    laid_out = sum(sizes)
    shared = sum(len(p) + len(r) for p, r in zip(prompts, responses, strict=True)) - laid_out
    return _packed(ids, pos, gather, targets, dest, len(prompts), max_resp, laid_out, mask, shared)


def trained_only(packed: PackedInputs, mask: torch.Tensor) -> PackedInputs:
    """`packed` with only the response positions the loss trains on (`mask` [B, T] != 0) left for the lm_head.

    An agent trajectory's observation tokens (tool output: most of its tokens) are context for the decoder but never
    in the loss, so their lm_head forward and backward (a tokens x hidden x vocab matmul each way, plus the softmax
    passes) would be thrown away; `unpack` gives them log-prob 0, which every loss term masks out. The decoder still
    runs over every token. Call it on CPU tensors (before `.to(device)`): selecting on the device would sync."""
    keep = mask.reshape(-1).index_select(0, packed.dest_index) != 0
    if bool(keep.all()):
        return packed
    return replace(packed, gather_index=packed.gather_index[keep], targets=packed.targets[keep],
                   dest_index=packed.dest_index[keep])


def unpack(values: torch.Tensor, packed: PackedInputs) -> torch.Tensor:
    """Per-token values [N] -> padded [B, T] response layout (zeros where there is no token); differentiable."""
    out = values.new_zeros(packed.num_samples * packed.max_response)
    out = out.index_copy(0, packed.dest_index.to(values.device), values)
    return out.view(packed.num_samples, packed.max_response)


def _fwd_chunk(logits: torch.Tensor, targets: torch.Tensor, inv_temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p[target], logsumexp) of one chunk of (low-precision) logits, computed in fp32."""
    x = logits.float() * inv_temp
    lse = torch.logsumexp(x, dim=-1)
    return x.gather(1, targets[:, None]).squeeze(1) - lse, lse


def _bwd_chunk(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor,
               inv_temp: float) -> torch.Tensor:
    """d(sum_t grad_t log p_t)/d logits = grad * (onehot(target) - softmax) / T, in the logits' dtype. Written as
    pure pointwise ops over an iota comparison so that torch.compile fuses it into one pass over the chunk."""
    x = logits.float() * inv_temp
    onehot = torch.arange(x.shape[-1], device=x.device)[None, :] == targets[:, None]
    out = (onehot.float() - torch.exp(x - lse[:, None])) * (grad[:, None] * inv_temp)
    return out.to(logits.dtype)


def _fwd_chunk_save(logits: torch.Tensor, targets: torch.Tensor, inv_temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fwd_chunk`, and overwrite `logits` IN PLACE with d log p[target] / d logits = (onehot - softmax) / T (the
    backward's `_bwd_chunk` before the per-token gradient scale), in the logits' dtype."""
    x = logits.float() * inv_temp
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, targets[:, None]).squeeze(1) - lse
    onehot = torch.arange(x.shape[-1], device=x.device)[None, :] == targets[:, None]
    logits.copy_((onehot.float() - torch.exp(x - lse[:, None])) * inv_temp)
    return picked, lse


# torch.compile'd versions of the chunk kernels (CUDA only): one fused pass over each [chunk, vocab] block instead of
# five eager ones (cast, scale, logsumexp, exp, scatter). Made on first use; dynamic in the chunk's rows, so the last
# short chunk does not recompile, but static in the vocabulary (`_static_vocab`): compiled with a symbolic row length
# they ran at half this speed on an H200 (docs/performance.md, issue 22).
_COMPILED: dict[str, object] = {}
HEAD_RANGE = "lm_head_logprobs"  # the profiler range around the fused head's forward and backward


def _static_vocab(*tensors: torch.Tensor) -> None:
    """Mark the vocabulary dimension (dim 1) of the compiled chunk kernels' [rows, vocab] inputs static."""
    for t in tensors:
        torch._dynamo.mark_static(t, 1)


def _kernels(compiled: bool) -> tuple[object, object, object]:
    if not compiled:
        return _fwd_chunk, _bwd_chunk, _fwd_chunk_save
    if not _COMPILED:
        _COMPILED["fwd"] = torch.compile(_fwd_chunk, dynamic=True)
        _COMPILED["bwd"] = torch.compile(_bwd_chunk, dynamic=True)
        _COMPILED["fwd_save"] = torch.compile(_fwd_chunk_save, dynamic=True)
    return _COMPILED["fwd"], _COMPILED["bwd"], _COMPILED["fwd_save"]


def _matmul_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The lm_head matmul's dtype: autocast's when it is on (the residual stream may be fp32 next to fp32 masters),
    else the hidden states' own."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return hidden.dtype


class _LinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        inv_temp: float,
        chunk: int,
        compiled: bool,
        save_rows: int,
    ) -> torch.Tensor:
        with torch.profiler.record_function(HEAD_RANGE):  # a named range in profiles (benchmarks/)
            return _LinearLogprob._forward(ctx, hidden, weight, targets, inv_temp, chunk, compiled, save_rows)

    @staticmethod
    def _forward(ctx: torch.autograd.function.FunctionCtx, hidden: torch.Tensor, weight: torch.Tensor,
                 targets: torch.Tensor, inv_temp: float, chunk: int, compiled: bool, save_rows: int) -> torch.Tensor:
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        dtype = _matmul_dtype(hidden)
        h_all, w = hidden.to(dtype), weight.to(dtype)
        fwd, _, fwd_save = _kernels(compiled)
        # Rows [0, save_rows) keep their logit gradient (one [save_rows, V] buffer); the rest are recomputed.
        saved = torch.empty((save_rows, w.shape[0]), dtype=dtype, device=hidden.device)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logits = torch.mm(h_all[s:e], w.t(), out=saved[s:e]) if e <= save_rows else h_all[s:e] @ w.t()
            if compiled:
                _static_vocab(logits)
            kernel = fwd_save if e <= save_rows else fwd
            out[s:e], lse[s:e] = kernel(logits, targets[s:e], inv_temp)  # type: ignore[operator]
        ctx.save_for_backward(hidden, weight, targets, lse, saved)
        ctx.inv_temp, ctx.chunk, ctx.compiled, ctx.dtype = inv_temp, chunk, compiled, dtype  # type: ignore
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        with torch.profiler.record_function(HEAD_RANGE):
            return _LinearLogprob._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse, saved = ctx.saved_tensors  # type: ignore[attr-defined]
        inv_temp, chunk = ctx.inv_temp, ctx.chunk  # type: ignore[attr-defined]
        _, bwd, _ = _kernels(ctx.compiled)  # type: ignore[attr-defined]
        # Backward runs outside autocast: use the dtype the forward's matmuls had, explicitly.
        h_all, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)  # type: ignore[attr-defined]
        grad_out = grad_out.float()
        grad_h = torch.empty_like(hidden)
        k = saved.shape[0]
        if k:
            # saved = d log p / d logits per row; the per-token gradient scales rows, so it moves onto the small
            # operands: grad_h = g * (saved @ W), grad_W = saved^T @ (g * h) — one matmul each over all saved rows.
            g = grad_out[:k, None]
            grad_h[:k] = (saved @ w).float() * g
            grad_w = (saved.t() @ (h_all[:k].float() * g).to(saved.dtype)).float()
        else:
            # fp32 accumulator: the weight gradient sums over every chunk (bf16 partial sums would lose bits).
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(k, hidden.shape[0], chunk):
            h = h_all[s : s + chunk]
            # The chunk's logits are recomputed rather than saved: saving them is the [T, vocab] memory we avoid.
            logits = h @ w.t()
            if ctx.compiled:  # type: ignore[attr-defined]
                _static_vocab(logits)
            g = bwd(logits, targets[s : s + chunk], lse[s : s + chunk], grad_out[s : s + chunk],  # type: ignore
                    inv_temp)
            grad_h[s : s + chunk] = g @ w
            grad_w.add_(g.t() @ h)
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None


def linear_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0, chunk: int = 1024,
    compiled: bool = False, save_bytes: int = 0,
) -> torch.Tensor:
    """log softmax(hidden @ weight^T / temperature)[targets] for hidden [N, H], weight [V, H] -> [N] fp32.
    `compiled` fuses the per-chunk softmax arithmetic with torch.compile (meant for CUDA). When a gradient will be
    needed, up to `save_bytes` of logit gradients (whole chunks) are kept from the forward pass for the backward."""
    if chunk < 1:
        raise ValueError(f"policy.logprob_chunk_tokens must be >= 1, got {chunk}")
    inv_temp = 1.0 if temperature <= 0 else 1.0 / temperature
    save_rows = 0
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        row_bytes = weight.shape[0] * torch.empty((), dtype=_matmul_dtype(hidden)).element_size()
        save_rows = min(hidden.shape[0], save_bytes // row_bytes // chunk * chunk)
    out: torch.Tensor = _LinearLogprob.apply(hidden, weight, targets, inv_temp, chunk, compiled,
                                             save_rows)
    return out
