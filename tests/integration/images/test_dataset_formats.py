"""One row of each dataset format loads, names its image the way its source does, and resolves on the image path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from image_helpers import IMAGE_F2P, ImageSet
from sandbox_helpers import P2P

from envs.registry import load_dataset
from envs.swe.harnesses.swesmith import reverse_patch
from envs.swe.loaders import DatasetFormatError
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor


def _rows(images: ImageSet) -> dict[str, tuple[dict[str, object], str]]:
    """format -> (row, image name the loader must give the task)."""
    repo = images.repo
    common = {"instance_id": "calc__1", "repo": "calc/calc", "base_commit": repo.base, "patch": repo.gold,
              "test_patch": repo.test_patch, "problem_statement": "add and mul are wrong",
              "FAIL_TO_PASS": json.dumps(IMAGE_F2P), "PASS_TO_PASS": json.dumps(P2P),
              # Not a SWE-bench repository: without its own test command the row would be refused.
              "test_command": "python3 -m pytest -p no:cacheprovider -rA tests"}
    # calc has no SWE-smith profile: a custom SWE-smith-style row names its own test command (and image).
    smith = {"instance_id": "calc__calc.1.bug", "repo": "swesmith/calc__calc.1", "image_name": "swe/calc-clean:v1",
             "patch": reverse_patch(repo.gold), "problem_statement": "add and mul are wrong",
             "FAIL_TO_PASS": IMAGE_F2P, "PASS_TO_PASS": P2P,
             "test_command": "python3 -m pytest -rA " + " ".join(sorted({t.split("::")[0] for t in IMAGE_F2P + P2P}))}
    return {"swebench": (common, "sweb.eval.x86_64.calc_1776_1:latest"),
            "swe_gym": (common, "xingyaoww/sweb.eval.x86_64.calc_s_1:latest"),
            "swe_smith": (smith, "swe/calc-clean:v1")}  # r2e_gym: test_r2e_gym.py, on an image of R2E's layout


async def test_a_row_of_each_format_loads_and_resolves(images: ImageSet, image_cfg: SandboxConfig,
                                                       tmp_path: Path) -> None:
    verdicts = {}
    async with Executor(image_cfg) as ex:
        for name, (row, image) in _rows(images).items():
            path = tmp_path / f"{name}.jsonl"
            path.write_text(json.dumps(row) + "\n")
            [task] = list(load_dataset(DatasetConfig(dataset_name=name, data_path=str(path))))
            assert task.metadata["image"] == image, name
            payload = task_to_payload(task)
            gold, empty = await ex.run(payload_to_spec(payload, task.patch)), await ex.run(payload_to_spec(payload, ""))
            verdicts[name] = (gold.resolution, empty.resolution, gold.error + empty.error)
    assert {k: v[:2] for k, v in verdicts.items()} == {k: ("FULL", "NO") for k in verdicts}, verdicts


@pytest.mark.parametrize("name,row,message", [
    ("swe_smith", {"instance_id": "x", "patch": "p", "problem_statement": "", "FAIL_TO_PASS": ["t"],
                   "PASS_TO_PASS": [], "test_command": "pytest"}, "row 1 (x): field image_name: missing"),
    ("swe_smith", {"instance_id": "x", "patch": "p", "problem_statement": "", "FAIL_TO_PASS": ["t"],
                   "PASS_TO_PASS": []}, "1 row(s) of swe_smith: no swesmith 0.0.9 profile for repo x"),
    ("r2e_gym", {"docker_image": "a/b:c", "repo_name": "pillow", "commit_hash": "c", "problem_statement": "s",
                 "parsed_commit_content": json.dumps({"file_diffs": []}), "expected_output_json": "[]"},
     "row 1 (a/b:c): field expected_output_json"),
    ("swebench", {"instance_id": "x", "repo": "r", "base_commit": "c", "patch": "p", "problem_statement": "",
                  "FAIL_TO_PASS": ["t"], "PASS_TO_PASS": [], "image": 3}, "row 1 (x): field image: expected a string"),
])
def test_bad_rows_name_the_row_and_field(name: str, row: dict[str, object], message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_dataset(DatasetConfig(dataset_name=name, data_path=str(path)))
