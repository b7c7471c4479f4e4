"""Stages 2 and 3 of the SWE speedrun (GPU): pre-training on the code corpus, then SFT on generated fixes.

Both train through the project's own trainer code, the code GRPO later runs: `trainer.model.wrap_policy` (fp32
masters, bf16 autocast, `torch.compile` per decoder layer), `trainer.logprobs.pack` + `PolicyModule` (the fused,
chunked lm_head + log-softmax that never materialises [tokens, vocab] logits) and `trainer.step.make_optimizer` /
`fused_clip_step` (fused AdamW, clipping without a host sync). The loss is the mean negative log-likelihood of the
trained tokens: every next token of a pre-training row; the completion (the fixing diff) of an SFT example.

Pre-training rows: the corpus' files tokenised, joined by `<|endoftext|>` and cut into rows of `seq_len` tokens
(no document masking: position ids run 0..seq_len-1 per row, as in GPT-style pre-training). Bits per byte on the
held-out files = (sum of token NLLs in nats) / ln 2 / (UTF-8 bytes of those files).
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# The "100M" Qwen2 shape of the speedrun (88M parameters with the 16k vocabulary, tied embeddings).
SHAPE = {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "intermediate": 2048}
SMOKE_SHAPE = {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128}


def make_model(tokenizer_dir: Path, out: Path, shape: dict[str, int], *, max_positions: int, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 of `shape` with the corpus tokenizer, saved (fp32) at `out`."""
    from fleet.tokenizer import load_tokenizer
    from workshop.tinymodel import ENDOFTEXT, IM_END, _save_model, _token_id

    tok = load_tokenizer(tokenizer_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    _save_model(out, seed=seed, vocab=-(-len(tok) // 64) * 64, hidden=shape["hidden"], layers=shape["layers"],
                heads=shape["heads"], kv_heads=shape["kv_heads"], intermediate=shape["intermediate"],
                eos_id=_token_id(tok, IM_END), pad_id=_token_id(tok, ENDOFTEXT), dtype="float32", tie=True,
                max_positions=max_positions)
    return out


def rows_per_step(row_tokens: int, rows_at_2048: int) -> int:
    """Rows a step for a prompt setting: as many tokens a step as the runs at 2,048-token rows took (`rows_at_2048`
    rows), so that a longer prompt neither changes the batch's tokens nor runs out of the GPU's memory."""
    return max(1, rows_at_2048 * 2048 // row_tokens)


def tokenize_corpus(tokenizer_dir: Path, texts: Iterator[str], *, batch: int = 2048) -> tuple[torch.Tensor, int]:
    """All texts as one int32 stream, each followed by `<|endoftext|>`; and their UTF-8 byte count."""
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    chunks: list[torch.Tensor] = []
    nbytes = 0
    buf: list[str] = []

    def flush() -> None:
        for ids in tok(buf, add_special_tokens=False)["input_ids"]:
            chunks.append(torch.tensor([*ids, eot], dtype=torch.int32))
        buf.clear()

    for text in texts:
        buf.append(text)
        nbytes += len(text.encode())
        if len(buf) == batch:
            flush()
    flush()
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.int32), nbytes


@dataclass
class TrainSetup:
    module: Any  # trainer.model.PolicyModule
    optimizer: torch.optim.Optimizer
    device: torch.device
    autocast: Callable[[], Any]
    pad_id: int


def setup(model_dir: Path, *, lr: float, weight_decay: float, device: str, compile: bool) -> TrainSetup:
    """The model under the trainer's own wrapping (compile, precision) and its fused AdamW."""
    from fleet.config.policy import OptimizerConfig, PolicyConfig
    from trainer.dist import Dist, DistEnv
    from trainer.model import autocast, build_policy
    from trainer.step import make_optimizer

    on_gpu = device == "cuda"
    cfg = PolicyConfig(model_name=str(model_dir), precision="bfloat16" if on_gpu else "float32",
                       compile=compile and on_gpu, low_precision_residual=False,
                       optimizer=OptimizerConfig(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95)))
    dist = Dist(DistEnv(0, 1, 0), torch.device(device), timeout_s=60)
    module = build_policy(cfg, str(model_dir), dist)
    opt, _ = make_optimizer(module, cfg.optimizer)
    pad = module.lm.config.pad_token_id
    return TrainSetup(module, opt, torch.device(device), lambda: autocast(cfg, dist), int(pad or 0))


def nll(s: TrainSetup, prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], row_tokens: int
        ) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of `targets` after `prompts` (packed), and the number of target tokens."""
    from trainer.logprobs import pack

    packed = pack(prompts, targets, row_tokens=row_tokens, pad_id=s.pad_id, pad_multiple=64).to(s.device)
    with s.autocast():
        logp = s.module(packed.input_ids, packed.position_ids, packed.gather_index, packed.targets)
    return -logp.float().sum(), int(packed.targets.numel())


def lr_at(step: int, steps: int, warmup: int, peak: float) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(s: TrainSetup, batches: Callable[[int], tuple[list[list[int]], list[list[int]]]], *, steps: int,
          peak_lr: float, warmup: int, row_tokens: int, max_seconds: float, log_every: int = 20,
          on_log: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """`steps` optimizer steps (or fewer if `max_seconds` runs out) on `batches(step)`; the loss curve."""
    from trainer.step import fused_clip_step

    params = [p for p in s.module.parameters() if p.requires_grad]
    curve: list[dict[str, float]] = []
    t0 = time.perf_counter()
    tokens = 0
    done = 0
    for step in range(steps):
        for g in s.optimizer.param_groups:
            g["lr"] = lr_at(step, steps, warmup, peak_lr)
        prompts, targets = batches(step)
        loss_sum, n = nll(s, prompts, targets, row_tokens)
        (loss_sum / max(1, n)).backward()
        loss_sum = loss_sum.detach()
        if s.device.type == "cuda":
            fused_clip_step(s.optimizer, params, 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        tokens += sum(len(p) + len(t) for p, t in zip(prompts, targets, strict=True))
        done = step + 1
        if step % log_every == 0 or step == steps - 1:
            row = {"step": done, "loss": float(loss_sum) / max(1, n), "lr": s.optimizer.param_groups[0]["lr"],
                   "seconds": time.perf_counter() - t0, "tokens": tokens}
            curve.append(row)
            log.info("step %d/%d loss %.3f lr %.2e %.0f tok/s", done, steps, row["loss"], row["lr"],
                     tokens / row["seconds"])
            if on_log:
                on_log(row)
        if time.perf_counter() - t0 > max_seconds:
            log.info("stopping at step %d: the time budget (%.0f s) is spent", done, max_seconds)
            break
    seconds = time.perf_counter() - t0
    return {"steps": done, "seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "curve": curve}


@torch.no_grad()
def evaluate_nll(s: TrainSetup, prompts: list[list[int]], targets: list[list[int]], row_tokens: int,
                 batch: int) -> tuple[float, int]:
    """Summed NLL (nats) and token count over all examples."""
    s.module.eval()
    total, count = 0.0, 0
    for i in range(0, len(prompts), batch):
        loss_sum, n = nll(s, prompts[i:i + batch], targets[i:i + batch], row_tokens)
        total += float(loss_sum)
        count += n
    s.module.train()
    return total, count


def rows_of(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


def pretrain(model_dir: Path, corpus_dir: Path, *, out: Path, seq_len: int, rows_per_step: int, steps: int,
             peak_lr: float, max_seconds: float, device: str, compile: bool, seed: int = 0,
             max_eval_rows: int = 256) -> dict[str, Any]:
    from corpus import read_texts, training_parts

    t0 = time.perf_counter()
    parts = training_parts(corpus_dir)  # the capped sample, then any parts of the rest carried beside it
    train_stream, train_bytes = tokenize_corpus(model_dir, read_texts(*parts))
    held_stream, held_bytes = tokenize_corpus(model_dir, read_texts(corpus_dir / "heldout.jsonl.xz"))
    tokenize_s = time.perf_counter() - t0
    rows = rows_of(train_stream, seq_len)
    held = rows_of(held_stream, seq_len)[:max_eval_rows]
    log.info("corpus: %d train tokens (%d rows of %d), %d held-out tokens, tokenised in %.0f s",
             train_stream.numel(), len(rows), seq_len, held_stream.numel(), tokenize_s)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rows), generator=gen)
    s = setup(model_dir, lr=peak_lr, weight_decay=0.1, device=device, compile=compile)

    def batches(step: int) -> tuple[list[list[int]], list[list[int]]]:
        idx = order[(torch.arange(rows_per_step) + step * rows_per_step) % len(rows)]
        picked = rows[idx].tolist()
        return [r[:1] for r in picked], [r[1:] for r in picked]

    stats = train(s, batches, steps=steps, peak_lr=peak_lr, warmup=max(1, steps // 50), row_tokens=seq_len,
                  max_seconds=max_seconds)
    held_rows = held.tolist()
    total, count = evaluate_nll(s, [r[:1] for r in held_rows], [r[1:] for r in held_rows], seq_len, 8)
    # Bits per byte: nats per token / ln 2 * tokens per byte of the held-out files (the rows evaluated are a prefix
    # of them, at the files' average bytes per token).
    loss = total / max(1, count)
    stats.update(heldout_loss=loss, heldout_bits_per_byte=loss / math.log(2) * held_stream.numel() / held_bytes,
                 heldout_tokens_evaluated=count,
                 train_tokens=int(train_stream.numel()), train_bytes=train_bytes, train_parts=[p.name for p in parts],
                 epochs=stats["tokens"] / max(1, train_stream.numel()), tokenize_s=tokenize_s,
                 params=sum(p.numel() for p in s.module.lm.parameters()))
    save(s, model_dir, out, note=f"pre-trained on {corpus_dir.name}: {json.dumps(_brief(stats))}")
    return stats


def _brief(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items() if k != "curve"}


def save(s: TrainSetup, model_dir: Path, out: Path, *, note: str) -> None:
    """The trained weights (fp32 masters: GRPO's trainer starts from them as they are) with `model_dir`'s tokenizer."""
    lm = s.module.lm
    lm.save_pretrained(out, safe_serialization=True)  # compiled layers keep their parameter names
    for f in model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja",
                                                        "generation_config.json"):
            shutil.copy(f, out / f.name)
    (out / "SPEEDRUN.txt").write_text(note + "\n")


def sft(model_dir: Path, examples: list[dict[str, str]], *, out: Path, epochs: float, batch: int, peak_lr: float,
        max_seconds: float, device: str, compile: bool, row_tokens: int, max_completion_tokens: int,
        seed: int = 0) -> dict[str, Any]:
    """Fine-tune on (prompt, completion) pairs: the loss covers the completion tokens only. A completion longer
    than `max_completion_tokens` (with its end token) is left out: GRPO's generations stop there, unfinished."""
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    all_completions = [[*ids, eos] for ids in tok([e["completion"] for e in examples], add_special_tokens=False)
                       ["input_ids"]]
    keep = [i for i, c in enumerate(all_completions) if len(c) <= max_completion_tokens]
    too_long = len(examples) - len(keep)
    examples, completions = [examples[i] for i in keep], [all_completions[i] for i in keep]
    prompts = tok([e["prompt"] for e in examples], add_special_tokens=False)["input_ids"]
    rng = random.Random(seed)
    order = list(range(len(examples)))
    steps = max(1, int(epochs * len(examples) / batch))
    schedule: list[int] = []
    while len(schedule) < steps * batch:
        rng.shuffle(order)
        schedule += order
    s = setup(model_dir, lr=peak_lr, weight_decay=0.0, device=device, compile=compile)

    def batches(step: int) -> tuple[list[list[int]], list[list[int]]]:
        idx = schedule[step * batch:(step + 1) * batch]
        return [prompts[i] for i in idx], [completions[i] for i in idx]

    stats = train(s, batches, steps=steps, peak_lr=peak_lr, warmup=max(1, steps // 20), row_tokens=row_tokens,
                  max_seconds=max_seconds, log_every=10)
    stats.update(examples=len(examples), completions_too_long=too_long,
                 completion_tokens_mean=sum(map(len, completions)) / len(completions),
                 prompt_tokens_mean=sum(map(len, prompts)) / len(prompts))
    save(s, model_dir, out, note=f"SFT on {len(examples)} generated fixes: {json.dumps(_brief(stats))}")
    return stats
