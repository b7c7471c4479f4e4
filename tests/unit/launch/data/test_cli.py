import re

from envs.registry import Task
from envs.swe.taskset import format_summary, summarize, write_jsonl, write_manifest
from launch.data.cli import data_main


def task(i: int, repo: str, kind: str, split: str) -> Task:
    return Task(f"{repo}__{kind}__{i:010d}", "swe", "x", repo=repo, repo_url=f"embedded://{repo}",
                base_commit="c" * 40, patch="diff --git a/a b/a\n", fail_to_pass=("t.py::a",), split=split,
                metadata={"bug_kind": kind, "function": f"f{i}"})


def test_list_prints_counts_per_repository_kind_and_split(tmp_path, capsys):
    tasks = [task(0, "toolz", "op_change", "train"), task(1, "toolz", "cmp_flip", "train"),
             task(2, "parse", "op_change", "validation")]
    write_jsonl(tmp_path / "train.jsonl", tasks[:2])
    write_jsonl(tmp_path / "validation.jsonl", tasks[2:])
    write_manifest(tmp_path, {"seed": 3, "recipe_fingerprint": "abc", "recipe_version": 1, "build_seconds": 9.5})
    assert data_main(["list", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tasks: 3  (train 2, validation 1)  functions: 3" in out
    assert "  toolz            2" in out and "  parse            1" in out
    assert re.search(r"^  op_change +2$", out, re.M) and "built with seed 3" in out
    s = summarize(tmp_path)
    assert s["per_repo"] == {"toolz": 2, "parse": 1} and s["per_kind"] == {"op_change": 2, "cmp_flip": 1}
    assert format_summary(s) in out


def test_list_without_a_task_set_fails_with_a_hint(tmp_path, capsys):
    assert data_main(["list", "--data", str(tmp_path)]) == 1
    assert "grpo-fleet data build --out" in capsys.readouterr().err


def test_build_rejects_unknown_kinds_before_doing_anything(tmp_path, capsys):
    assert data_main(["build", "--out", str(tmp_path / "o"), "--kinds", "op_change,explode"]) == 2
    assert "explode" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_prepare_dataset_keeps_an_existing_task_set_and_ignores_generated_sources(tmp_path, capsys):
    from fleet.config import MasterConfig
    from fleet.config.env import DatasetConfig
    from launch.data.prepare import prepare_dataset

    cfg = MasterConfig()
    write_jsonl(tmp_path / "train.jsonl", [task(0, "toolz", "op_change", "train")])
    prepare_dataset(DatasetConfig(dataset_name="swe_embedded", data_path=str(tmp_path)), grpo=cfg.grpo,
                    sandbox=cfg.sandbox)
    assert f"SWE task set ready at {tmp_path}" in capsys.readouterr().out
    prepare_dataset(DatasetConfig(dataset_name="arith"), grpo=cfg.grpo, sandbox=cfg.sandbox)
    assert capsys.readouterr().out == ""
