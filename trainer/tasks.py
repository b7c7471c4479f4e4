"""Task sources for the prompt feeder, from the `envs` registry: a dataset split + its environment's prompt builder.

Prompts are tokenized on first use and cached: the feeder asks for `num_prompts_per_step` tasks per step, and a
resume asks for the same indices again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.config.env import DataConfig, DatasetConfig, EnvConfig
from trainer.data import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceDeps:
    """What a task source needs beyond its dataset's config: the environments' settings, the data seed and where
    SWE prompts read repositories from (`sandbox.repos_root`, the executor's own)."""

    env: EnvConfig
    seed: int
    repos_root: str | None = None


class EnvTaskSource:
    def __init__(self, data_cfg: DatasetConfig, tokenizer: Any, deps: SourceDeps) -> None:
        from envs.registry import load_dataset, make_environment

        self.dataset = load_dataset(data_cfg, env_cfg=deps.env, seed=deps.seed)
        extra = {"repos_root": self._repos_root(deps)} if self.dataset.env_name == "swe" else {}
        self.env = make_environment(self.dataset.env_name, deps.env, **extra)
        self.tokenizer = tokenizer
        self.data_cfg = data_cfg
        self.task = lru_cache(maxsize=4096)(self._build)  # type: ignore[method-assign]
        self._repos: dict[str, str] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def _repos_root(self, deps: SourceDeps) -> str | None:
        """`sandbox.repos_root`, else the task set's own `repos/` (a built set read from `data_path`): the launcher
        wires only the sandbox's key, and the default task set's repositories are not this set's."""
        if deps.repos_root is not None:
            return deps.repos_root
        own = Path(self.dataset.root) / "repos" if self.dataset.root is not None else None
        return str(own) if own is not None and own.is_dir() else None

    def _build(self, index: int) -> Task:
        t = self.dataset[index]
        cfg = self.data_cfg
        prompt = self.env.build_prompt(t, self.tokenizer, cfg.max_prompt_length, cfg.context, cfg.context_functions)
        if getattr(prompt, "dropped_files", None):
            log.debug("task %s: context files dropped to fit the prompt: %s", t.instance_id, prompt.dropped_files)
        payload = json.dumps(self.env.task_to_payload(t), sort_keys=True).encode()
        return Task(t.env_name, t.instance_id, list(prompt.token_ids), payload, repo=t.repo)

    def task(self, index: int) -> Task:  # replaced per instance by the cached builder
        return self._build(index)

    def repo_of(self, task_id: str) -> str:
        if self._repos is None:  # once, on the first step that needs a name: the tasks are already in memory
            self._repos = {t.instance_id: t.repo for t in self.dataset}
        return self._repos.get(task_id, "")


def warn_on_test_runner_mismatch(task_set: str | Path, sandbox_urls: list[str]) -> list[str]:
    """A built task set's test ids are the names its pytest gave them (manifest `test_runner`); an executor on
    another pytest release may run the same tests under other ids, and their gold patches then grade NO: every answer
    to those tasks earns 0 and the run reads as a policy that cannot learn. Says so once at start for each executor
    that answers; returns the warnings."""
    from envs.swe.taskset import read_manifest
    from fleet.contracts.sandbox import runner_mismatch
    from sandbox_client.health import test_runners

    made_with = read_manifest(task_set).get("test_runner") or {}
    if not made_with:
        return []
    warnings = []
    for url, runs_with in test_runners(sandbox_urls).items():
        why = runner_mismatch(made_with, runs_with)
        if why:
            warnings.append(f"sandbox executor {url}: {why} (task set {task_set}; check it with "
                            f"`grpo-fleet data validate --remote`)")
            log.warning("%s", warnings[-1])
    return warnings


def load_sources(data: DataConfig, tokenizer: Any, deps: SourceDeps, *,
                 validate: bool) -> tuple[EnvTaskSource, EnvTaskSource | None]:
    """(training source, validation source or None). Validation defaults to the training source's validation split
    and is only loaded when `validate` (`grpo.val_period` > 0 or `grpo.val_at_start`)."""
    train = EnvTaskSource(data.train, tokenizer, deps)
    if train.dataset.env_name == "swe" and train.dataset.root is not None:
        warn_on_test_runner_mismatch(train.dataset.root, deps.env.code.sandbox_urls)
    if not validate:
        return train, None
    val_cfg = data.validation_or_default()
    try:
        return train, EnvTaskSource(val_cfg, tokenizer, deps)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        log.warning("no validation tasks (%s): validation is skipped", exc)
        return train, None
