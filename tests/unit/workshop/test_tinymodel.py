"""The tiny local model: deterministic, atomic to build, loadable by transformers with a Qwen-style chat template."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from workshop.tinymodel import IM_END, ensure_tiny_model, make_qwen2_like


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_tiny_model_is_deterministic_and_quick(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    a = ensure_tiny_model(tmp_path / "a", seed=0)
    assert time.perf_counter() - t0 < 60  # ~4 s on two cores
    b = ensure_tiny_model(tmp_path / "b", seed=0)
    assert digest(a) == digest(b)
    assert not list(tmp_path.glob(".*tmp*")), "the temporary build folder is renamed, not left behind"
    c = ensure_tiny_model(tmp_path / "c", seed=1)
    assert digest(c)["model.safetensors"] != digest(a)["model.safetensors"]
    assert digest(c)["tokenizer.json"] == digest(a)["tokenizer.json"]  # the seed draws weights, not the vocabulary


def test_existing_model_is_returned_untouched(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text("{}")
    assert ensure_tiny_model(path) == path
    assert [p.name for p in path.iterdir()] == ["config.json"]


def test_tiny_model_loads_and_chats(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from fleet.tokenizer import load_tokenizer

    path = ensure_tiny_model(tmp_path / "tiny")
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert len(tok) == model.config.vocab_size == 2048
    assert tok.eos_token == IM_END and tok.pad_token == "<|endoftext|>"
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads == 2
    assert 3e6 < sum(p.numel() for p in model.parameters()) < 5e6
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 35?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert [tok.decode([i]) for i in ids[:3]] == ["<|im_start|>", "user", "\n"]  # role names are single tokens
    code = "def f(x):\n    return x + 1\n--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n"
    assert tok.decode(tok(code)["input_ids"]) == code
    assert tok("12345")["input_ids"] == [tok.convert_tokens_to_ids(d) for d in "12345"]  # one token per digit
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), 2048)


def test_make_qwen2_like_builds_the_requested_shape(tmp_path: Path) -> None:
    from fleet.tokenizer import load_tokenizer

    tiny = ensure_tiny_model(tmp_path / "tiny")
    path = make_qwen2_like(
        tmp_path / "q",
        hidden=128,
        layers=2,
        heads=2,
        kv_heads=1,
        intermediate=256,
        vocab=4096,
        tokenizer_from=tiny,
        dtype="bfloat16",
    )
    cfg = json.loads((path / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["dtype"]) == (128, 2, 4096, "bfloat16")
    assert load_tokenizer(path).get_vocab() == load_tokenizer(tiny).get_vocab()
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        make_qwen2_like(
            tmp_path / "small",
            hidden=64,
            layers=1,
            heads=1,
            kv_heads=1,
            intermediate=64,
            vocab=100,
            tokenizer_from=tiny,
        )
