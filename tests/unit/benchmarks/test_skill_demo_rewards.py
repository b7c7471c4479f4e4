"""`skill_demo.py rewards`: the training reward of a comparison's runs in blocks of steps, read from a results file
of the real layout (the committed arith comparison); a block a run did not finish is left out, not half-counted."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks import skill_demo  # noqa: E402


def test_blocks_average_each_seeds_steps_and_leave_an_unfinished_block_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(ROOT / "benchmarks/results/arith_compare.json", tmp_path / "cmp.json")
    result = json.loads((tmp_path / "cmp.json").read_text())
    trl = [r for r in result["runs"] if r["name"].startswith("trl-")]
    trl[0]["train"] = [t for t in trl[0]["train"] if t["step"] <= 15]  # seed 1 stopped inside its second block
    (tmp_path / "cmp.json").write_text(json.dumps(result))
    monkeypatch.setattr(skill_demo, "RESULTS", tmp_path)
    skill_demo.rewards(argparse.Namespace(out="cmp", block=10, steps=20))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("trl"))
    first = [statistics.mean(t["reward"] for t in r["train"] if 1 <= t["step"] <= 10) for r in trl]
    second = [statistics.mean(t["reward"] for t in r["train"] if 11 <= t["step"] <= 20) for r in trl[1:]]
    assert f"1-10: {' '.join(f'{x:.3f}' for x in first)} (mean {statistics.mean(first):.3f})" in line
    assert f"11-20: {' '.join(f'{x:.3f}' for x in second)} (mean {statistics.mean(second):.3f})" in line


def test_reward_reach_is_the_first_step_whose_trailing_window_mean_reaches_the_level() -> None:
    run = next(r for r in json.loads((ROOT / "benchmarks/results/arith_compare.json").read_text())["runs"]
               if r["name"] == "sync-s1")
    train = run["train"]
    hit = skill_demo.reward_reach(train, 0.45)
    assert hit is not None
    rewards = {t["step"]: t["reward"] for t in train}
    window = [rewards[s] for s in range(hit["step"] - 9, hit["step"] + 1)]
    assert statistics.mean(window) >= 0.45
    assert all(statistics.mean(rewards[s] for s in range(end - 9, end + 1)) < 0.45 for end in range(10, hit["step"]))
    # A gap in the steps (a run's record lost) never lets a shorter window count.
    gapped = [t for t in train if t["step"] != hit["step"] - 3]
    later = skill_demo.reward_reach(gapped, 0.45)
    assert later is None or later["step"] >= hit["step"] + 7
    assert skill_demo.reward_reach(train, 2.0) is None
