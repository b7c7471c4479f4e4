"""What a run needs on disk before the fleet starts: the embedded SWE task set's first slice, built on first use.

`grpo-fleet up` and `grpo-fleet prepare` (the compose and k8s init step) call `prepare_dataset` for each configured
split before any service starts; the trainer only reads a built set (`envs/swe/taskset.py`) and, when it is
missing, fails naming these commands. The build validates every bug with the real sandbox executor in process,
which is why it lives on the launch floor and not in `envs/`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter

from envs.swe.taskset import task_dir_of
from fleet.config.algorithm import GrpoConfig
from fleet.config.env import DatasetConfig
from fleet.config.infra import SandboxConfig
from launch.data.builder import BuildOptions, build_taskset
from launch.data.recipe import load_recipe

log = logging.getLogger(__name__)


def first_run_plan(grpo: GrpoConfig, ds: DatasetConfig) -> tuple[list[str] | None, int]:
    """(repositories, tasks per repository) of the slice a run builds when no task set is there."""
    repos = ds.first_run_repos
    count = len(repos) if repos else len(load_recipe().repos)
    want = ds.first_run_tasks or min(16, max(8, grpo.num_prompts_per_step * grpo.max_num_steps))
    return repos, min(32, -(-want // count))


def prepare_embedded_dataset(ds: DatasetConfig, *, grpo: GrpoConfig, sandbox: SandboxConfig) -> None:
    """Build the embedded task set at `ds.data_path` (default: the cache's `tasks`) unless one is already there:
    the small slice `ds.first_run_repos` / `ds.first_run_tasks` name, with a progress bar."""
    from fleet.progress import counting

    folder = task_dir_of(ds)
    if (folder / "train.jsonl").is_file():
        print(f"grpo-fleet: SWE task set ready at {folder}", flush=True)
        return
    repos, per_repo = first_run_plan(grpo, ds)
    workers = sandbox.pool_size or os.cpu_count() or 2
    names = ", ".join(repos) if repos else "every repository"
    print(f"grpo-fleet: building a first SWE task slice in {folder} ({names}, up to {per_repo} tasks each; the full "
          f"set: grpo-fleet data build --out {folder}) ...", flush=True)
    bar = counting("tasks", total=per_repo * (len(repos) if repos else len(load_recipe().repos)), unit="task")
    tried = Counter[str]()

    def decided(repo: str, accepted: bool) -> None:
        tried[repo] += 1
        bar.update(1 if accepted else 0)
        bar.set_postfix_str(f"{sum(tried.values())} candidates tried", refresh=False)

    opts = BuildOptions(out=folder, repos=repos, max_per_repo=per_repo, seed=0, workers=workers,
                        sandbox=sandbox, if_missing=True, on_decided=decided)
    executor_log = logging.getLogger("services.sandbox.executor")
    level = executor_log.level
    executor_log.setLevel(max(level, logging.WARNING))  # a line per sandbox run would break the bar (as `data build`)
    try:
        # if_missing: a build already running into the same folder is waited for, not raced.
        report = asyncio.run(build_taskset(opts))
    finally:
        bar.close()
        executor_log.setLevel(level)
    if report.reused:
        print(f"grpo-fleet: SWE task set ready at {folder} (built by another process)", flush=True)
    else:
        print(f"grpo-fleet: built {len(report.tasks)} tasks in {report.seconds:.0f} s", flush=True)


def prepare_dataset(ds: DatasetConfig, *, grpo: GrpoConfig, sandbox: SandboxConfig) -> None:
    """Make `ds` available before a run (the embedded task set is built on first use); a no-op for other sources,
    which are read as they are or generated in memory."""
    if ds.dataset_name == "swe_embedded":
        prepare_embedded_dataset(ds, grpo=grpo, sandbox=sandbox)
