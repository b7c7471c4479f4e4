"""`fleet.tokenizer.load_tokenizer`: a model folder's tokenizer encodes as its `tokenizer.json` says, whatever class
transformers picks for the model type; and nothing in the project loads a tokenizer around it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from fleet.tokenizer import load_tokenizer, pipeline_differences
from workshop.tinymodel import ensure_tiny_model

ROOT = Path(__file__).resolve().parents[3]
TEXT = "diff --git a/src/pkg/mod.py b/src/pkg/mod.py\n+    return café(x) - 1\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def with_pipeline(tiny: Path, out: Path, **parts: object) -> Path:
    """A copy of the tiny model's folder (config.json says qwen2) whose tokenizer.json has `parts` replaced."""
    shutil.copytree(tiny, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    spec.update(parts)
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def test_a_qwen2_folder_with_its_own_split_encodes_as_its_file(tiny: Path, tmp_path: Path) -> None:
    # A split that isolates every character: far from Qwen2's, as a retrained tokenizer's may be.
    split = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    folder = with_pipeline(tiny, tmp_path / "model", pre_tokenizer=split)
    tok = load_tokenizer(folder)
    file = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok(TEXT, add_special_tokens=False)["input_ids"] == file.encode(TEXT, add_special_tokens=False).ids
    assert pipeline_differences(tok, folder / "tokenizer.json") == []
    # What the fleet needs of it besides the ids: the chat template, the end and padding tokens.
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # Saved again (a checkpoint saves its tokenizer), it is the same file's pipeline.
    tok.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())
    assert saved["pre_tokenizer"] == split


def test_a_hub_id_in_the_local_cache_encodes_as_its_cached_file(tiny: Path, tmp_path: Path) -> None:
    """A Hub model's files as huggingface_hub caches them (`models--org--name/snapshots/<commit>/`, `refs/main`):
    the cached tokenizer.json is compared the same way, with nothing downloaded."""
    split = {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False}
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--acme--tiny-custom"
    with_pipeline(tiny, repo / "snapshots" / commit, pre_tokenizer=split)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    tok = load_tokenizer("acme/tiny-custom", cache_dir=tmp_path / "hub", local_files_only=True)
    file = Tokenizer.from_file(str(repo / "snapshots" / commit / "tokenizer.json"))
    assert tok(TEXT, add_special_tokens=False)["input_ids"] == file.encode(TEXT, add_special_tokens=False).ids


def test_a_file_that_matches_keeps_the_model_types_class(tiny: Path, tmp_path: Path) -> None:
    """A Hub Qwen2 tokenizer.json (Qwen2's split and NFC): AutoTokenizer's own class is kept."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tiny)
    nfc = json.loads(auto.backend_tokenizer.to_str())["normalizer"]
    hub_like = with_pipeline(tiny, tmp_path / "hub", normalizer=nfc)
    assert type(load_tokenizer(hub_like)) is type(AutoTokenizer.from_pretrained(hub_like))
    assert pipeline_differences(load_tokenizer(hub_like), hub_like / "tokenizer.json") == []
    # The tiny model's own file has no normalizer (Qwen2Tokenizer adds NFC): loaded as it is.
    assert pipeline_differences(load_tokenizer(tiny), tiny / "tokenizer.json") == []


def test_no_code_loads_a_tokenizer_around_the_loader() -> None:
    loads = re.compile(r"\bAutoTokenizer\.from_pretrained\(")
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    skip = {"fleet/tokenizer.py", str(Path(__file__).relative_to(ROOT))}
    offenders = [f for f in tracked.stdout.split() if f not in skip and loads.search((ROOT / f).read_text())]
    assert tracked.stdout and offenders == []
