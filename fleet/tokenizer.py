"""A tokenizer loaded as its folder's `tokenizer.json` defines it.

transformers 5 builds some model types' tokenizers in code. For a folder whose `config.json` says `qwen2`,
`AutoTokenizer` returns `Qwen2Tokenizer`: it takes the vocabulary and merges from `tokenizer.json`, then sets Qwen2's
own split regex and an NFC normalizer in place of the file's. A tokenizer trained with another split then encodes
every prompt and target differently from how it was trained, and nothing says so. The speedrun's tokenizer keeps a
path's tokens the same in a code header and in a diff; its ninth run pre-trained, fine-tuned and ran GRPO with
Qwen2's split instead (docs/swe-learning.md, "Ninth run").

`load_tokenizer` keeps AutoTokenizer's choice when its pipeline is the file's (every Hub Qwen2 model), and otherwise
loads the file as it is, chat template and special tokens included. Every process of the project loads tokenizers
through it (tests/unit/fleet/test_tokenizer_loading.py checks that no other code calls AutoTokenizer). A Hub id is
checked against its tokenizer.json in the local Hub cache.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# The parts of a tokenizers pipeline that decide the ids of a text, or the text of ids.
PIPELINE = ("normalizer", "pre_tokenizer", "decoder")


def _pipeline(backend: Any) -> dict[str, Any]:
    """The `PIPELINE` parts of a `tokenizers.Tokenizer`, each serialised alone (`__getstate__`, the JSON that
    tokenizer.json holds for it): the whole tokenizer's JSON would carry the vocabulary and merges too, megabytes for
    a Hub model, at every process start."""
    return {part: None if (c := getattr(backend, part)) is None else json.loads(c.__getstate__()) for part in PIPELINE}


def pipeline_differences(tokenizer: Any, tokenizer_json: Path) -> list[str]:
    """The parts of `PIPELINE` in which `tokenizer`'s backend differs from the file (empty when it has no backend)."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return []
    loaded, saved = _pipeline(backend), _pipeline(Tokenizer.from_file(str(tokenizer_json)))
    return [part for part in PIPELINE if loaded[part] != saved[part]]


def tokenizer_json(name_or_path: str | Path, *, revision: str | None = None,
                   cache_dir: str | Path | None = None) -> Path | None:
    """The `tokenizer.json` AutoTokenizer reads for `name_or_path`: a folder's, or a Hub id's in the local Hub cache
    (nothing is downloaded); None where there is none (a folder with a slow tokenizer's files only)."""
    local = Path(name_or_path) / "tokenizer.json"
    if local.is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(str(name_or_path), "tokenizer.json", revision=revision, cache_dir=cache_dir)
    except ValueError:  # a folder's path is no Hub id
        return None
    return Path(cached) if isinstance(cached, str) else None


def load_tokenizer(name_or_path: str | Path, **kwargs: Any) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(name_or_path)`, unless that tokenizer's pipeline is not the one in its
    `tokenizer.json` (a folder's or a cached Hub id's): then the file's, loaded as it is."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    file = tokenizer_json(name_or_path, revision=kwargs.get("revision"), cache_dir=kwargs.get("cache_dir"))
    if file is None:
        return tokenizer
    differs = pipeline_differences(tokenizer, file)
    if not differs:
        return tokenizer
    log.info("%s: %s replaces the %s of tokenizer.json; loading the file as it is", name_or_path,
             type(tokenizer).__name__, ", ".join(differs))
    exact = PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    left = pipeline_differences(exact, file)
    if left:  # a transformers that rewrites even the generic class: the ids would be wrong, say so rather than train
        raise RuntimeError(f"{file}: transformers loads its {', '.join(left)} differently from the file")
    return exact
