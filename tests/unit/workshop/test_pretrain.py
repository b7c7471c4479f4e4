import itertools

import pytest

from envs.digits import format_corpus
from workshop.pretrain import ensure_format_model


def test_format_model_is_built_once_and_loads(tmp_path):
    out = ensure_format_model(tmp_path / "m", format_corpus, name="digits", steps=2, batch=4)
    assert (out / "config.json").is_file() and "corpus=digits steps=2" in (out / "PRETRAIN.txt").read_text()
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert ensure_format_model(out, format_corpus, name="digits", steps=2, batch=4) == out  # reused, not rebuilt
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    from transformers import AutoModelForCausalLM

    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(out)
    AutoModelForCausalLM.from_pretrained(out)
    q, _ = next(itertools.islice(format_corpus(0), 1))
    assert tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False).startswith("<|im_start|>user")


def test_bad_step_count_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"steps \(0\)"):
        ensure_format_model(tmp_path / "m", format_corpus, name="digits", steps=0)
