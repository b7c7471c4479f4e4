"""The speedrun's SFT model travels between sessions in parts (`benchmarks/speedrun/model_parts.py`): `watch` sends
them back a few per device call, a later session carries them in folders of their own and joins them. A part cut
short or missing must stop the join before a model is written, since GRPO from a wrong model fails silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workshop.tinymodel import ensure_tiny_model

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import model_parts  # noqa: E402

PART = 1_000_000  # the tiny model's 7.4 MB of bf16 weights in 8 parts


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_parts_spread_over_calls_join_into_the_model_in_bf16(model: Path, tmp_path: Path) -> None:
    manifest = model_parts.pack(model, tmp_path / "parts", part_bytes=PART)
    assert len(manifest["parts"]) > 4 and all(p["bytes"] <= PART for p in manifest["parts"])
    groups = model_parts.spread(tmp_path / "parts", tmp_path / "up", first=2, per=4)
    assert [len(g) for g in groups][:2] == [2, 4] and sum(map(len, groups)) == len(manifest["parts"])

    joined = tmp_path / "sft"
    model_parts.join(sorted((tmp_path / "up").iterdir()), joined)
    before, after = weights(model), weights(joined)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert after[name].dtype == torch.bfloat16
        assert torch.equal(after[name], tensor.to(torch.bfloat16)), name
    assert (joined / "config.json").read_text() == (model / "config.json").read_text()
    assert (joined / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()

    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(joined, dtype=torch.float32)
    assert lm(torch.tensor([[1, 2, 3]])).logits.shape[-1] == lm.config.vocab_size


def test_a_part_cut_short_or_missing_stops_the_join_before_anything_is_written(model: Path, tmp_path: Path) -> None:
    model_parts.pack(model, tmp_path / "parts", part_bytes=PART)
    part = tmp_path / "parts" / "part-003"
    whole = part.read_bytes()
    part.write_bytes(whole[:-10])
    with pytest.raises(ValueError, match="part-003"):
        model_parts.join([tmp_path / "parts"], tmp_path / "sft")
    part.unlink()
    with pytest.raises(FileNotFoundError, match="part-003"):
        model_parts.join([tmp_path / "parts"], tmp_path / "sft")
    assert not (tmp_path / "sft").exists()
    (tmp_path / "parts" / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        model_parts.join([tmp_path / "parts"], tmp_path / "sft")


def test_watch_sends_the_sft_model_back_four_parts_a_call(model: Path, tmp_path: Path) -> None:
    """`swe_speedrun.sh watch` as the lent machine runs it, over a pipeline that is done: each call brings back
    the archive, the manifest and the next four parts, until every part has been sent once."""
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "sft").symlink_to(model)
    (work / "sft.json").write_text("{}")
    (work / "pipeline.start").write_text("0")
    (work / "pipeline.done").write_text("0")
    (work / "pipeline.log").write_text("pipeline: grpo with 556 s, training 386 s\n")
    bin_dir = tmp_path / "bin"  # the lent machine's python3 holds torch and safetensors, as this one does
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would lose the venv
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "SPEEDRUN_WORK": str(work), "MODEL_PART_BYTES": str(PART),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    outs = []
    for call in range(3):
        out = tmp_path / f"out{call}"
        out.mkdir()
        done = subprocess.run(["bash", "benchmarks/swe_speedrun.sh", "watch", "0"], cwd=ROOT, capture_output=True,
                              text=True, env={**env, "OUT": str(out)}, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "model parts sent" in done.stdout and (out / "speedrun.tar.xz").is_file()
        outs.append(out)
    sent = [sorted(p.name for p in out.glob("part-*")) for out in outs]
    total = len(json.loads((outs[0] / "manifest.json").read_text())["parts"])
    assert [len(s) for s in sent] == [4, min(4, total - 4), max(0, total - 8)]
    assert len({name for s in sent for name in s}) == total  # each part once
    model_parts.join(outs, tmp_path / "joined")
    assert weights(tmp_path / "joined").keys() == weights(model).keys()


def test_an_out_folder_that_is_not_ours_is_refused_not_wiped(model: Path, tmp_path: Path) -> None:
    model_parts.pack(model, tmp_path / "parts", part_bytes=PART)
    keep = tmp_path / "checkout"
    keep.mkdir()
    (keep / "README.md").write_text("mine")
    with pytest.raises(ValueError, match="refusing to replace"):
        model_parts.join([tmp_path / "parts"], keep)
    with pytest.raises(ValueError, match="refusing to replace"):
        model_parts.spread(tmp_path / "parts", keep, first=2, per=4)
    assert (keep / "README.md").read_text() == "mine"
    model_parts.spread(tmp_path / "parts", tmp_path / "up", first=2, per=4)
    model_parts.spread(tmp_path / "parts", tmp_path / "up", first=3, per=5)  # its own output is replaced
    assert len(list((tmp_path / "up" / "1").glob("part-*"))) == 3
    model_parts.join([tmp_path / "parts"], tmp_path / "sft")
    model_parts.join([tmp_path / "parts"], tmp_path / "sft")  # a model folder is replaced
