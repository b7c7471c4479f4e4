"""Row parsers of the other SWE dataset formats; each gives the task its environment image.

  swe_gym    SWE-bench rows; image `xingyaoww/sweb.eval.x86_64.<instance_id>` with `__` written `_s_`.
  swe_smith  one image per repo@commit, named as swesmith's repo profile names it; the row's `patch` is the bug: it
             becomes the task's `setup_patch` (applied and committed as the tree's only commit before the agent's
             patch), and its reverse is the gold patch.
  r2e_gym    `docker_image` (or `namanjain12/<repo_name>_final:<commit_hash>`); the hidden tests live in the image
             (`/r2e_tests`, linked in by the eval script as R2E's runtime does), and every outcome the row's
             `expected_output_json` lists must match exactly (R2E's rule); the gold patch is `parsed_commit_content`.
Each format's harness (image names, eval scripts, parsers, refusals) lives in `envs/swe/harnesses/`.
Errors are those of `loaders.parse_row`: `row N (id): field F: problem`, all at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envs.registry import TaskDataset
from envs.swe.harnesses.r2e import parse_r2e_gym
from envs.swe.harnesses.swebench import parse_swe_gym
from envs.swe.harnesses.swesmith import parse_swe_smith
from envs.swe.loaders import dataset_file, load_swebench_file

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig


_PARSERS = {"swe_gym": parse_swe_gym, "swe_smith": parse_swe_smith, "r2e_gym": parse_r2e_gym}


def _loader(name: str) -> Any:
    def load(cfg: DatasetConfig, **_: Any) -> TaskDataset:
        file = dataset_file(cfg, name)
        tasks = load_swebench_file(file, parse=_PARSERS[name])
        if cfg.max_samples is not None:
            tasks = tasks[: cfg.max_samples]
        return TaskDataset(name, "swe", tasks, root=file.parent)

    load.__doc__ = f"`data.*.dataset_name={name}`: `data_path` is a task file, or a folder holding `{{split}}.*`."
    return load


load_swe_gym_dataset = _loader("swe_gym")
load_swe_smith_dataset = _loader("swe_smith")
load_r2e_gym_dataset = _loader("r2e_gym")
