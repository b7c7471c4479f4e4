"""The speedrun's prompt setting (benchmarks/speedrun/prompting.py): read once from the environment, carried into
the fleet's config, and refused where a model or SFT pairs were made for another one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
from prompting import MAX_NEW, Prompting  # noqa: E402

from fleet.config import parse_config  # noqa: E402


def test_the_environment_sets_the_budget_and_the_functions_and_the_fleet_gets_both() -> None:
    p = Prompting.from_env({"SPEEDRUN_MAX_PROMPT": "4096", "SPEEDRUN_CONTEXT_FUNCTIONS": "32"})
    assert (p.max_prompt_length, p.functions, p.row_tokens) == (4096, 32, 4096 + MAX_NEW)
    cfg = parse_config({}, p.overrides())
    for data in (cfg.data.train, cfg.data.validation_or_default()):  # validation builds the prompts GRPO trains on
        assert (data.max_prompt_length, data.context, data.context_functions) == (4096, "bm25_functions", 32)
    assert cfg.policy.max_total_sequence_length == 4096 + MAX_NEW
    assert Prompting.from_env({}) == Prompting() == Prompting(1792, "bm25_functions", 12)


@pytest.mark.parametrize(("name", "raw", "says"), [("SPEEDRUN_MAX_PROMPT", "4k", "not a whole number"),
                                                   ("SPEEDRUN_MAX_PROMPT", "100", r"outside \[256, 32768\]"),
                                                   ("SPEEDRUN_CONTEXT_FUNCTIONS", "0", r"outside \[1, 256\]")])
def test_a_bad_setting_is_refused_naming_the_variable(name: str, raw: str, says: str) -> None:
    with pytest.raises(SystemExit, match=f"{name}={raw!r}: {says}|{name}={raw}: {says}"):
        Prompting.from_env({name: raw})


def test_a_model_too_short_for_the_prompt_or_a_speedrun_model_made_for_another_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    Prompting().check_model(tmp_path)  # 1792 + 256: the seventeenth run's base
    with pytest.raises(SystemExit, match=r"2048 positions.*\(1792\)"):
        Prompting(max_prompt_length=4096).check_model(tmp_path)
    Prompting(max_prompt_length=1024).check_model(tmp_path)  # a model from elsewhere: any budget it holds
    (tmp_path / "SPEEDRUN.txt").write_text("sft\n")  # the speedrun's own: SFT taught it one prompt length
    with pytest.raises(SystemExit, match="made for prompts of 1792 tokens, this run builds 1024"):
        Prompting(max_prompt_length=1024).check_model(tmp_path)


def test_sft_pairs_made_for_another_prompt_are_refused_and_old_pairs_count_as_the_defaults(tmp_path: Path) -> None:
    old = [{"instance_id": "a", "prompt": "p", "completion": "c"}]  # made before the setting was recorded
    Prompting().check_pairs(old, tmp_path / "sft_tasks.jsonl.xz")
    with pytest.raises(SystemExit, match="sft_tasks.jsonl.xz: its SFT pairs were made for prompts"):
        Prompting(max_prompt_length=4096, functions=32).check_pairs(old, tmp_path / "sft_tasks.jsonl.xz")
    new = [{**old[0], **Prompting(4096, functions=32).figures()}]
    Prompting(4096, functions=32).check_pairs(new, tmp_path / "x")


def test_a_longer_prompt_keeps_the_tokens_a_pretraining_and_an_sft_step_take() -> None:
    import lm

    assert lm.rows_per_step(2048, 64) == 64 and lm.rows_per_step(2048, 32) == 32  # the runs so far
    long = Prompting(max_prompt_length=4096).row_tokens
    assert (lm.rows_per_step(long, 64), lm.rows_per_step(long, 32)) == (30, 15)
    assert 30 * long <= 64 * 2048 < 31 * long


def test_a_benchmarks_list_of_settings_reads_as_the_environment_does() -> None:
    assert Prompting.settings("1792:12,4096:32,3072") == [Prompting(1792), Prompting(4096, functions=32),
                                                           Prompting(3072)]
    with pytest.raises(SystemExit, match="SPEEDRUN_CONTEXT_FUNCTIONS=0"):
        Prompting.settings("1792:0")
