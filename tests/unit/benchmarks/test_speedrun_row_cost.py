"""`benchmarks/speedrun/row_cost.py` measures what a pre-training token costs at each prompt setting's row length
through the trainer's own code, keeping the tokens a step; a call cut short must still leave what it measured."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workshop.tinymodel import ensure_tiny_model

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import row_cost  # noqa: E402
from prompting import MAX_NEW  # noqa: E402


def test_each_setting_keeps_the_tokens_a_step_and_every_round_is_written_as_it_ends(tmp_path: Path) -> None:
    tokenizer = ensure_tiny_model(tmp_path / "tiny")  # a model folder holds its tokenizer
    out = tmp_path / "row_cost.json"
    args = argparse.Namespace(budgets=[256, 768], tokenizer=tokenizer, rows_at_2048=4, steps=1, warmup=1, rounds=2,
                              cpu=True, out=out)
    result = row_cost.measure(args)

    assert json.loads(out.read_text()) == result
    first, second = result["settings"]
    assert [s["row_tokens"] for s in (first, second)] == [256 + MAX_NEW, 768 + MAX_NEW]
    assert [s["rows_per_step"] for s in (first, second)] == [16, 8]  # 4 rows of 2,048 tokens: 8,192 a step
    for s in (first, second):
        assert len(s["rounds"]) == 2 and all(r["tokens_per_s"] > 0 for r in s["rounds"])
        assert s["tokens_per_s"] == max(r["tokens_per_s"] for r in s["rounds"]) and "first_steps_s" in s
    assert first["cost_per_token_vs_first"] == 1.0
    assert second["cost_per_token_vs_first"] == round(first["tokens_per_s"] / second["tokens_per_s"], 3)
