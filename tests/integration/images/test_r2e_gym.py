"""An R2E-Gym row, in R2E-Gym-Subset's layout, graded on an image in R2E's layout as R2E's runtime grades it.

The image is built the way R2E's Dockerfiles build theirs: the repository at the base commit in /testbed with an
untracked `run_tests.sh` (R2E's test command) and `.venv` beside it, and the hidden tests in `/r2e_tests` (the row's
`execution_result_content` holds their code, as R2E's rows do). It is pushed under the row's own `docker_image`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from image_helpers import ImageSet

from envs.registry import Task, load_dataset
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor

DATA = json.loads((Path(__file__).resolve().parents[2] / "unit" / "envs" / "data" / "r2e_gym_row.json").read_text())
ROW: dict[str, Any] = DATA["row"]
_GIT_ENV = {"GIT_AUTHOR_NAME": "r2e", "GIT_AUTHOR_EMAIL": "r2e@localhost", "GIT_COMMITTER_NAME": "r2e",
            "GIT_COMMITTER_EMAIL": "r2e@localhost"}


def _testbed(dest: Path) -> Path:
    """The tree before the fix (the files of the commit, before), committed, plus R2E's untracked files."""
    for diff in json.loads(ROW["parsed_commit_content"])["file_diffs"]:
        if diff["old_file_content"]:
            path = dest / diff["header"]["file"]["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(diff["old_file_content"])
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(dest), *argv], check=True, capture_output=True,
                       env={**os.environ, **_GIT_ENV})
    (dest / "run_tests.sh").write_text(DATA["run_tests_sh"])
    (dest / ".venv" / "bin").mkdir(parents=True)
    (dest / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    return dest


@pytest.fixture(scope="module")
def r2e_task(images: ImageSet, tmp_path_factory: pytest.TempPathFactory) -> Task:
    execution = json.loads(ROW["execution_result_content"])
    hidden = {f"/r2e_tests/{name}": code
              for name, code in zip(execution["test_file_names"], execution["test_file_codes"], strict=True)}
    images.builder.instance("r2e-pillow", _testbed(tmp_path_factory.mktemp("r2e") / "testbed"), extra=hidden)
    images.builder.push("r2e-pillow", f"{images.registry}/{ROW['docker_image']}")
    path = tmp_path_factory.mktemp("r2e-rows") / "train.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    [task] = list(load_dataset(DatasetConfig(dataset_name="r2e_gym", data_path=str(path))))
    return task


async def _run(cfg: SandboxConfig, task: Task, patches: list[str]) -> list[Any]:
    async with Executor(cfg) as ex:
        return [await ex.run(payload_to_spec(task_to_payload(task), p, timeout=120.0)) for p in patches]


async def test_gold_patch_grades_full_and_no_patch_grades_no(r2e_task: Task, image_cfg: SandboxConfig) -> None:
    # A context line off: every `git apply` of the chain fails (--reject after writing files) and `patch --fuzz`
    # applies it; the untracked run_tests.sh and .venv must survive the resets between attempts.
    fuzzy = r2e_task.patch.replace(" def scale(n, k):", " def scale(n, k):  # fuzz")
    gold, empty, fuzzed = await _run(image_cfg, r2e_task, [r2e_task.patch, "", fuzzy])
    expected = json.loads(ROW["expected_output_json"])
    assert (gold.status, gold.resolution) == ("completed", "FULL"), gold.error + gold.stdout_tail[-3000:]
    assert gold.test_status == expected  # R2E's keys, the expected FAILED one included
    assert gold.report == {"expected_status": {"success": sorted(expected), "failure": []}}
    assert (empty.status, empty.resolution) == ("completed", "NO")
    assert empty.test_status["TestImageFile.test_parser"] == "FAILED"
    assert fuzzed.resolution == "FULL", fuzzed.error + fuzzed.stdout_tail[-3000:]


async def test_patch_over_the_images_run_tests_sh_is_refused(r2e_task: Task, image_cfg: SandboxConfig) -> None:
    forged = ("diff --git a/run_tests.sh b/run_tests.sh\n--- a/run_tests.sh\n+++ b/run_tests.sh\n@@ -1 +1 @@\n"
              f"-{DATA['run_tests_sh']}\n\\ No newline at end of file\n+echo 'short test summary info'\n")
    [verdict] = await _run(image_cfg, r2e_task, [r2e_task.patch + forged])
    assert verdict.status == "refused" and "run_tests.sh" in verdict.error, verdict
