import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.registry import load_dataset
from envs.swe.loaders import DatasetFormatError, load_swebench_file, task_to_row
from fleet.config.env import DatasetConfig


def row(i: int, **over):
    base = {
        "instance_id": f"org__repo-{i}", "repo": "org/repo", "base_commit": "a" * 40, "patch": "diff --git a/x b/x\n",
        "test_patch": "", "problem_statement": "it breaks", "FAIL_TO_PASS": ["t.py::test_a"], "PASS_TO_PASS": [],
        "version": "1.0", "created_at": "2024-01-01",
    }
    base.update(over)
    return base


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_with_lists_and_json_strings(tmp_path):
    rows = [row(1), row(2, FAIL_TO_PASS=json.dumps(["a::b", "a::c"]), PASS_TO_PASS="[]")]
    tasks = load_swebench_file(write_jsonl(tmp_path / "t.jsonl", rows))
    assert [t.instance_id for t in tasks] == ["org__repo-1", "org__repo-2"]
    assert tasks[1].fail_to_pass == ("a::b", "a::c")
    assert tasks[0].repo_url == "https://github.com/org/repo.git"
    assert tasks[0].metadata == {"created_at": "2024-01-01"}


def test_json_list_and_parquet_with_string_test_lists(tmp_path):
    rows = [row(1), row(2)]
    (tmp_path / "t.json").write_text(json.dumps(rows))
    assert len(load_swebench_file(tmp_path / "t.json")) == 2
    # The hub's parquet files hold FAIL_TO_PASS / PASS_TO_PASS as JSON strings.
    flat = [{**r, "FAIL_TO_PASS": json.dumps(r["FAIL_TO_PASS"]), "PASS_TO_PASS": "[]"} for r in rows]
    pq.write_table(pa.Table.from_pylist(flat), tmp_path / "test-00000-of-00001.parquet")
    tasks = load_swebench_file(tmp_path / "test-00000-of-00001.parquet")
    assert tasks[0].fail_to_pass == ("t.py::test_a",)


def test_errors_name_row_instance_and_field(tmp_path):
    rows = [row(1), row(2, FAIL_TO_PASS="not json"), row(3, base_commit=None), row(4, PASS_TO_PASS=[1]),
            {k: v for k, v in row(5).items() if k != "problem_statement"}, row(6, FAIL_TO_PASS=[]), row(1)]
    with pytest.raises(DatasetFormatError) as info:
        load_swebench_file(write_jsonl(tmp_path / "bad.jsonl", rows))
    errors = info.value.errors
    assert "row 2 (org__repo-2): field FAIL_TO_PASS: is a string but not a JSON list" in errors[0]
    assert errors[1] == "row 3 (org__repo-3): field base_commit: missing"
    assert errors[2].startswith("row 4 (org__repo-4): field PASS_TO_PASS: test ids must be strings")
    assert errors[3] == "row 5 (org__repo-5): field problem_statement: missing"
    assert errors[4].startswith("row 6 (org__repo-6): field FAIL_TO_PASS: empty")
    assert errors[5] == "row 7 (org__repo-1): field instance_id: duplicate of row 1"
    assert "bad.jsonl: 6 invalid" in str(info.value)


def test_invalid_json_line_names_its_row(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row(1)) + "\n{oops\n")
    with pytest.raises(DatasetFormatError, match="row 2: not valid JSON"):
        load_swebench_file(path)


def test_wrong_types_name_the_field(tmp_path):
    with pytest.raises(DatasetFormatError, match=r"row 1 \(org__repo-1\): field repo: expected a string, got int"):
        load_swebench_file(write_jsonl(tmp_path / "t.jsonl", [row(1, repo=5)]))
    with pytest.raises(DatasetFormatError, match="row 1: expected an object, got list"):
        load_swebench_file(write_jsonl(tmp_path / "u.jsonl", [[1, 2]]))


def test_unsupported_suffix_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(ValueError, match="unsupported task file type"):
        load_swebench_file(tmp_path / "t.csv")


def test_row_round_trip(tmp_path):
    tasks = load_swebench_file(write_jsonl(tmp_path / "t.jsonl", [row(1)]))
    again = load_swebench_file(write_jsonl(tmp_path / "u.jsonl", [task_to_row(tasks[0])]))
    assert again == tasks


def test_swebench_dataset_reads_a_folder_split_and_caps_samples(tmp_path):
    # A SWE-bench repository and version: rows of any other repo are refused (they have no harness spec).
    write_jsonl(tmp_path / "test.jsonl", [row(i, repo="psf/requests", version="2.0") for i in range(5)])
    ds = load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(tmp_path), split="test", max_samples=3))
    assert (ds.env_name, len(ds)) == ("swe", 3)
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        load_dataset(DatasetConfig(dataset_name="swebench", data_path=str(tmp_path), split="train"))
    with pytest.raises(ValueError, match="needs data_path"):
        load_dataset(DatasetConfig(dataset_name="swebench"))
