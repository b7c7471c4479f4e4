"""Local models for tests, examples and benchmarks: nothing here downloads anything.

`ensure_tiny_model` makes `tiny-qwen2`: a byte-level BPE tokenizer trained on a built-in corpus (English, Python
sources read from this interpreter's stdlib, unified diffs of them, arithmetic) and a randomly initialised
`Qwen2ForCausalLM` small enough to train on two CPU cores. `make_qwen2_like` makes random-weight models of other
shapes (benchmarks use ~50M and ~0.5B). Both folders load in transformers and in vLLM.

Folders are built in a temporary sibling and renamed into place, so a reader never sees a half-written model and two
processes racing to build the same one both end up with a complete folder.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import random
import shutil
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
TINY_VOCAB_SIZE = 2048

# Qwen2's pre-tokenizer split: digits are single tokens (arithmetic stays learnable), letters and punctuation runs
# are separate pieces, whitespace runs (code indentation) stay together.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Stdlib modules whose sources make the Python part of the corpus: plain, stable, English-commented code.
_STDLIB_MODULES = [
    "textwrap.py", "difflib.py", "heapq.py", "bisect.py", "fractions.py", "string.py", "shlex.py",
    "functools.py", "dataclasses.py", "statistics.py", "fnmatch.py", "glob.py", "queue.py", "copy.py",
    "json/encoder.py", "json/decoder.py", "unittest/case.py", "argparse.py",
]  # fmt: skip

_ENGLISH = [
    "The patch fixes the failing test by handling the empty list before computing the average.",
    "Read the issue carefully, find the function that raises the error, and change as little code as possible.",
    "A unified diff shows removed lines with a minus sign and added lines with a plus sign.",
    "The function returns None when the key is missing, which the caller did not expect.",
    "Tests pass when the output matches the expected value exactly, including whitespace.",
    "You are a helpful assistant that writes correct and minimal patches for Python repositories.",
    "Please explain the bug in one sentence, then give the diff.",
    "The sum of two numbers is computed digit by digit, carrying one when the total exceeds nine.",
]


def _stdlib_sources() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in _STDLIB_MODULES:
        p = root / name
        if p.is_file():  # a trimmed interpreter may lack some; the corpus is still large enough
            texts.append(p.read_text(encoding="utf-8", errors="replace"))
    return texts


def _diffs(sources: list[str], rng: random.Random, n: int) -> Iterator[str]:
    """Unified diffs of small, plausible edits to stdlib functions: the format agents must emit."""
    edits = [("==", "!="), (" + ", " - "), ("return ", "return not "), ("<", "<="), ("None", "0"), ("[0]", "[-1]")]
    for i in range(n):
        src = sources[i % len(sources)].splitlines(keepends=True)
        start = rng.randrange(max(1, len(src) - 12))
        before = src[start : start + 12]
        old, new = edits[rng.randrange(len(edits))]
        after = [line.replace(old, new, 1) for line in before]
        if after == before:
            after = before[:-1] + ["    pass\n"]
        name = _STDLIB_MODULES[i % len(_STDLIB_MODULES)]
        yield "".join(difflib.unified_diff(before, after, f"a/{name}", f"b/{name}"))


def _arithmetic(rng: random.Random, n: int) -> Iterator[str]:
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        yield f"{a} {op} {b} = {value}\n"


def corpus(seed: int = 0) -> Iterator[str]:
    """The tokenizer's training text; deterministic for a seed and an interpreter."""
    rng = random.Random(seed)
    sources = _stdlib_sources()
    if not sources:
        raise RuntimeError(f"no stdlib sources found under {sysconfig.get_paths()['stdlib']}")
    yield from _ENGLISH * 20
    yield from sources
    yield from _diffs(sources, rng, 400)
    yield from _arithmetic(rng, 4000)
    yield from _template_lines()


def _train_tokenizer(vocab_size: int, texts: Iterator[str] | None = None,
                     split_pattern: str = QWEN_SPLIT_PATTERN):  # -> PreTrainedTokenizerFast (lazy)
    """The same tokenizer for every model seed (its corpus is always drawn with seed 0), so that models of any seed
    or shape made here share one vocabulary. `texts`: train on these instead (a larger corpus, a larger vocabulary);
    the chat template's layout is added to them so that it still tokenizes into few pieces. `split_pattern`: the
    pre-tokenizer's regex (Qwen2's by default)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(0) if texts is None else _with_template(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
    )


def tokenizer_fingerprint(folder: str | Path) -> str:
    """sha256 of what decides the token ids (the vocabulary, merges, pre-tokenizer and added tokens of
    `folder/tokenizer.json`) in canonical JSON, so that two saves of one tokenizer agree whatever their layout."""
    data = json.loads((Path(folder) / "tokenizer.json").read_text())
    kept = {key: data.get(key) for key in ("model", "pre_tokenizer", "added_tokens")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _template_lines() -> Iterator[str]:
    for _ in range(20):  # so that role names and the template's layout become single tokens
        for line in _ENGLISH:
            yield f"{IM_START}system\n{_ENGLISH[4]}{IM_END}\n{IM_START}user\n{line}{IM_END}\n{IM_START}assistant\n"


def _with_template(texts: Iterator[str]) -> Iterator[str]:
    yield from texts
    yield from _template_lines()


def _token_id(tok: Any, token: str) -> int:
    i = tok.convert_tokens_to_ids(token)
    if not isinstance(i, int):
        raise TypeError(f"{token!r} is not a single token of the tokenizer")
    return i


def _save_tokenizer(tok, out: Path) -> None:
    tok.save_pretrained(out)
    # transformers 5 writes its own class name ("TokenizersBackend"); the generic fast class also loads in 4.x.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def _save_model(
    out: Path, *, seed: int, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
    eos_id: int, pad_id: int, dtype: str, tie: bool, max_positions: int,
) -> None:  # fmt: skip
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tie,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype=dtype,
    )
    with torch.random.fork_rng():  # seed the init without changing the caller's global RNG stream
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)


def _build_atomically(path: Path, build) -> Path:  # build: Callable[[Path], None]
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        t0 = time.perf_counter()
        build(tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            # Another process renamed its complete build into place first; theirs is as good as ours.
            if not (path / "config.json").is_file():
                raise
        logger.info("built model %s in %.1f s", path, time.perf_counter() - t0)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def ensure_tiny_model(path: Path, *, seed: int = 0) -> Path:
    """Make the tiny Qwen2 model + tokenizer at `path` unless it exists; return `path`.

    Shape: vocab 2048, hidden 256, 4 layers, 4 heads (head_dim 64, supported by every vLLM attention backend),
    2 KV heads, MLP 768, tied embeddings: ~3.7M parameters, float32. Same seed and interpreter -> same bytes;
    `seed` draws the weights only (the tokenizer is the same for every seed). Builds in ~4 s on two cores.
    """

    def build(out: Path) -> None:
        tok = _train_tokenizer(TINY_VOCAB_SIZE)
        _save_tokenizer(tok, out)
        _save_model(
            out, seed=seed, vocab=len(tok), hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768,
            eos_id=_token_id(tok, IM_END), pad_id=_token_id(tok, ENDOFTEXT), dtype="float32", tie=True,
            max_positions=4096,
        )  # fmt: skip

    return _build_atomically(path, build)


def make_qwen2_like(
    path: Path,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    *,
    seed: int = 0,
    dtype: str = "float32",
    tie_word_embeddings: bool = True,
    tokenizer_from: Path | None = None,
) -> Path:
    """Make a random-weight Qwen2 of the given shape at `path` (unless it exists), with the tiny tokenizer.

    `vocab` must be at least the tokenizer's size (2048); ids beyond it exist only in the embedding, as in Qwen's
    own padded vocabularies. The tokenizer is copied from `tokenizer_from` (a tiny-model folder) or trained anew.
    Qwen2.5-0.5B's shape is hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocab 151936.
    """
    from transformers import PreTrainedTokenizerBase

    from fleet.tokenizer import load_tokenizer

    def build(out: Path) -> None:
        tok: PreTrainedTokenizerBase = (
            load_tokenizer(tokenizer_from) if tokenizer_from else _train_tokenizer(TINY_VOCAB_SIZE)
        )
        if vocab < len(tok):
            raise ValueError(f"vocab={vocab} is smaller than the tokenizer ({len(tok)} tokens)")
        _save_tokenizer(tok, out)
        _save_model(
            out, seed=seed, vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
            intermediate=intermediate, eos_id=_token_id(tok, IM_END), pad_id=_token_id(tok, ENDOFTEXT), dtype=dtype,
            tie=tie_word_embeddings, max_positions=4096,
        )  # fmt: skip

    return _build_atomically(path, build)


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    t = time.perf_counter()
    out = ensure_tiny_model(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen2"))
    print(out, f"{time.perf_counter() - t:.1f}s")
