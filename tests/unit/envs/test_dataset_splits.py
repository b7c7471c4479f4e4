"""A split is any name the data folder has files for: SWE-bench Lite's `dev`, laid out as on the hub."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.registry import load_dataset
from fleet.config.env import DatasetConfig

# The hub's column types: test lists are JSON strings, every other field a string.
HUB_SCHEMA = pa.schema([(name, pa.string()) for name in (
    "repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "hints_text", "created_at",
    "version", "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit")])


def hub_row(instance_id: str) -> dict[str, str]:
    return {
        "repo": "sqlfluff/sqlfluff", "instance_id": instance_id,
        "base_commit": "a820c139ccbe6d1865d73c4a459945cd69899f8f",
        "patch": "diff --git a/src/sqlfluff/rules/L031.py b/src/sqlfluff/rules/L031.py\n"
                 "--- a/src/sqlfluff/rules/L031.py\n+++ b/src/sqlfluff/rules/L031.py\n@@ -1 +1 @@\n-x\n+y\n",
        "test_patch": "", "problem_statement": "TSQL - L031 incorrectly triggers for alias in a join", "hints_text": "",
        "created_at": "2022-01-01T00:00:00Z", "version": "0.8",
        "FAIL_TO_PASS": json.dumps(["test/rules/std_L031_test.py::test_rules_std_L031"]), "PASS_TO_PASS": "[]",
        "environment_setup_commit": "a5c4eae4e3e419fe95460c9afd9cf39a35a470c4",
    }


def hub_folder(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    for split, ids in (("dev", ["sqlfluff__sqlfluff-1625", "sqlfluff__sqlfluff-2419"]),
                       ("test", ["sqlfluff__sqlfluff-1517"])):
        table = pa.Table.from_pylist([hub_row(i) for i in ids], schema=HUB_SCHEMA)
        pq.write_table(table, root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def test_the_dev_split_of_a_hub_folder_loads(tmp_path):
    folder = hub_folder(tmp_path / "SWE-bench_Lite")
    ds = load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(folder), split="dev"))
    assert [t.instance_id for t in ds] == ["sqlfluff__sqlfluff-1625", "sqlfluff__sqlfluff-2419"]
    assert ds[0].fail_to_pass == ("test/rules/std_L031_test.py::test_rules_std_L031",)


def test_a_split_with_no_file_is_named_with_the_splits_there(tmp_path):
    folder = hub_folder(tmp_path / "SWE-bench_Lite")
    with pytest.raises(FileNotFoundError, match=r"no file of split 'validation' .*the splits there: dev, test"):
        load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(folder), split="validation"))


def test_a_flat_folder_lists_its_splits_too(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps(hub_row("a__b-1")) + "\n")
    with pytest.raises(FileNotFoundError, match=r"split 'dev'.*the splits there: train"):
        load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(tmp_path), split="dev"))
