"""A short local pre-training of the tiny model on a generated corpus: the base model of the skill demo (issue 21).

Real GRPO runs start from a pretrained base that already writes in the expected format; a randomly initialised tiny
model does not, and a demo that starts from one mostly shows the format being learned. `ensure_format_model` trains
`tiny-qwen2` (next-token loss on the whole chat text) on an environment's *format corpus*: its questions with
answers drawn at random, independent of the question (e.g. `envs.digits.format_corpus`; the caller passes it in:
`workshop/` does not import `envs/`). The result answers in the format and at chance level, so whatever it learns
beyond chance in GRPO it learned from the reward.

    python benchmarks/skill_demo.py pretrain     # .cache/models/tiny-qwen2-digits-format

Built in a temporary sibling and renamed into place (as `workshop.tinymodel` does); an existing folder is reused.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fleet.paths import tiny_model_dir
from workshop.tinymodel import _build_atomically, ensure_tiny_model

logger = logging.getLogger(__name__)

Corpus = Callable[[int], Iterator[tuple[str, str] | list[dict[str, str]]]]
"""(question, answer) pairs, or whole chats (role/content messages: a multi-turn episode, tool results included)."""


def ensure_format_model(out: Path, corpus: Corpus, *, name: str, steps: int = 50, batch: int = 64,
                        lr: float = 1e-3, seed: int = 0, init: Path | None = None,
                        extra_tokens: Sequence[str] = ()) -> Path:
    """Make the model pretrained on `corpus(seed)` (named `name` in its folder) at `out` unless it exists; return
    `out`. ~10 s on one CPU core.

    Defaults: 50 AdamW steps of 64 sequences at lr 1e-3: enough for the format (every greedy answer a digit followed
    by the end-of-turn token) and little more; longer pre-training on random answers makes the model more firmly
    ignore the question, and GRPO then takes longer to leave chance level (measured in a standalone sketch:
    100 steps of pre-training needed 70-150 GRPO steps to 0.8, 50 needed 60-135). `init`: the model folder to
    start from instead of `tiny-qwen2` (a pre-training in stages, each folder reused). `extra_tokens`: added to the
    tokenizer (as ordinary, non-special tokens: decoding keeps them) and to the embeddings before training, e.g.
    `<tool_call>`, a single token in real Qwen tokenizers (`envs.peek.TOOL_TOKENS`)."""
    if steps < 1 or batch < 1:
        raise ValueError(f"pretrain: steps ({steps}) and batch ({batch}) must be >= 1")

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from fleet.tokenizer import load_tokenizer

        base = init if init is not None else ensure_tiny_model(tiny_model_dir(), seed=0)
        tok = load_tokenizer(base)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            if tok.add_tokens(list(extra_tokens)):
                # New rows: the mean of the others (tied: in and out). Padded to a multiple of 64, as real Qwen
                # checkpoints are (151936 rows, 151665 tokens) and as vLLM pads its embedding anyway.
                model.resize_token_embeddings(len(tok), pad_to_multiple_of=64)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            pairs = corpus(seed)
            for step in range(steps):
                ids, mask = _batch(tok, list(itertools.islice(pairs, batch)))
                loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step % 10 == 0 or step == steps - 1:
                    logger.info("pretrain %s step %d/%d loss %.3f", name, step + 1, steps, loss.item())
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        start = (f" from {init.name}" if init is not None else "") + (f" +tokens {list(extra_tokens)}"
                                                                      if extra_tokens else "")
        (tmp / "PRETRAIN.txt").write_text(f"corpus={name} steps={steps} batch={batch} lr={lr} seed={seed}{start}: "
                                          "the format with random answers (workshop/pretrain.py)\n")

    return _build_atomically(out, build)


def _batch(tok, pairs: list[tuple[str, str] | list[dict[str, str]]]):  # -> (input_ids, attention_mask)
    import torch

    seqs = []
    for item in pairs:
        chat = item if isinstance(item, list) else [{"role": "user", "content": item[0]},
                                                     {"role": "assistant", "content": item[1]}]
        text = tok.apply_chat_template(chat, tokenize=False)
        seqs.append(list(tok(text.rstrip("\n"), add_special_tokens=False)["input_ids"]))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # right padding: positions as in generation, which starts at 0 too
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask
