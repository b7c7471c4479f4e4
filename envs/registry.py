"""Registry of environments (how an answer is scored) and datasets (where tasks come from), by name.

Wiring: the trainer loads tasks with `load_dataset(cfg.data.train, ...)`, builds prompts with the environment's
`build_prompt`, and ships `env.task_to_payload(task)` (JSON) in each `PromptGroup.env_payload`. A rollout worker
makes the same environment by name (`make_environment(group.env_name, cfg.env, scorer=...)`) and calls
`await env.score(payload, completion)`. Environments never talk to the network: the SWE environment gets a scorer
callback (the worker passes one built on `sandbox_client`), so `envs/` has no client code.

Built-in entries are import paths resolved on first use, so importing the registry imports neither LibCST nor
tokenizers; other task sources plug in with `register_dataset` / `register_environment`.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig, EnvConfig
    from fleet.contracts.sandbox import TaskSpec, Verdict


@dataclass(frozen=True)
class Task:
    """One task of any environment. SWE tasks carry the SWE-bench fields; others leave them empty."""

    instance_id: str
    env_name: str
    problem_statement: str
    repo: str = ""
    repo_url: str = ""
    base_commit: str = ""
    patch: str = ""
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    version: str = ""
    test_command: str | None = None
    split: str = "train"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    """Source-specific extras (bug_kind, function, test_files, the arith answer...)."""


@dataclass(frozen=True)
class PromptResult:
    token_ids: list[int]
    text: str
    context_files: list[str] = field(default_factory=list)
    """Files whose full content is in the prompt."""
    dropped_files: list[str] = field(default_factory=list)
    """Retrieved context files left out (whole) to fit the budget; never cut in half."""
    statement_truncated: bool = False
    """True when even the bare problem statement did not fit and was shortened (with a visible marker)."""


@dataclass
class ScoreResult:
    """What an environment says about one completion.

    `verdict` is always the sandbox's `Verdict` type so that every environment shares `reward_from_verdict`.
    `format_error` is set (missing / malformed / truncated) when the completion held no usable answer; the verdict is
    then `not_applied` and was never sent to a sandbox, and the worker reports VERDICT_STATUS_FORMAT_ERROR and
    scores it with `env.code.format_error_reward`.
    """

    verdict: Verdict
    format_error: str | None = None
    detail: str = ""
    infra_error: str | None = None
    """Set when the sandbox could not grade (verdict `infra_error`): the group must be retried, never scored."""
    retries: int = 0
    """Infrastructure retries spent by the scorer, when it reports them."""


Scorer = Callable[["TaskSpec"], Awaitable["Verdict"]]
"""Runs one TaskSpec in a sandbox (the rollout worker passes one built on sandbox_client)."""


@runtime_checkable
class Environment(Protocol):
    name: str

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        """The JSON-able payload the rollout worker needs to score answers to `task`."""
        ...

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "bm25",
                     context_functions: int = ...) -> PromptResult:
        """`context` and `context_functions`: `data.*.context`, `data.*.context_functions` (environments without
        retrieved code context ignore them)."""
        ...

    async def score(self, payload: dict[str, Any], completion_text: str, **context: Any) -> ScoreResult:
        """`context`: per-call collaborators (`scorer=`, `sandbox=`, `cfg=`, `truncated=`); unknown ones are ignored."""
        ...


class TaskDataset(Sequence[Task]):
    """An indexable, immutable list of tasks with the environment that scores them."""

    def __init__(self, name: str, env_name: str, tasks: list[Task], root: Path | None = None) -> None:
        self.name, self.env_name, self._tasks, self.root = name, env_name, list(tasks), root

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, i: int) -> Task:  # type: ignore[override]
        return self._tasks[i]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)


DatasetLoader = Callable[..., TaskDataset]
EnvFactory = Callable[..., Environment]

_DATASETS: dict[str, str | DatasetLoader] = {
    "swe_embedded": "envs.swe.taskset:load_embedded_dataset",
    "swebench": "envs.swe.assets:load_swebench_dataset",  # the loaders' one, then Multimodal images staged
    "swe_gym": "envs.swe.formats:load_swe_gym_dataset",
    "swe_smith": "envs.swe.formats:load_swe_smith_dataset",
    "r2e_gym": "envs.swe.formats:load_r2e_gym_dataset",
    "arith": "envs.arith:load_arith_dataset",
    "computer_use": "envs.computer_use.env:load_computer_use_dataset",
    "lookup": "envs.lookup:load_lookup_dataset",
    "peek": "envs.peek:load_peek_dataset",
    "digits": "envs.digits:load_digits_dataset",
    "digits_max": "envs.digits:load_digits_max_dataset",
}
_ENVIRONMENTS: dict[str, str | EnvFactory] = {
    "swe": "envs.swe_agent:make_swe_environment_for_mode",  # single-shot, or agent mode (env.code.mode)
    "arith": "envs.arith:make_arith_environment",
    "computer_use": "envs.computer_use.env:make_computer_use_environment",
    "lookup": "envs.lookup:make_lookup_environment",  # multi-turn, tools run in the rollout worker
    "peek": "envs.peek:make_peek_environment",  # multi-turn, the answer only a tool call gives
    "digits": "envs.digits:make_digits_environment",
}


def _resolve(table: dict[str, Any], kind: str, name: str) -> Any:
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}")
    entry = table[name]
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = getattr(importlib.import_module(module), attr)
        table[name] = entry
    return entry


def register_dataset(name: str, loader: DatasetLoader) -> None:
    """`loader(cfg: DatasetConfig, **kwargs) -> TaskDataset`."""
    _DATASETS[name] = loader


def register_environment(name: str, factory: EnvFactory) -> None:
    """`factory(env_cfg: EnvConfig | None, **deps) -> Environment`."""
    _ENVIRONMENTS[name] = factory


def dataset_names() -> list[str]:
    return sorted(_DATASETS)


def environment_names() -> list[str]:
    return sorted(_ENVIRONMENTS)


def load_dataset(cfg: DatasetConfig, **kwargs: Any) -> TaskDataset:
    """Tasks of `cfg.dataset_name`, split `cfg.split`, at most `cfg.max_samples` of them."""
    loader: DatasetLoader = _resolve(_DATASETS, "dataset", cfg.dataset_name)
    return loader(cfg, **kwargs)


def make_environment(name: str, env_cfg: EnvConfig | None = None, **deps: Any) -> Environment:
    """The environment `name`; `deps` are its collaborators (SWE: `scorer=` to grade, `repos_root=` for prompts)."""
    factory: EnvFactory = _resolve(_ENVIRONMENTS, "environment", name)
    return factory(env_cfg, **deps)


get_environment = make_environment

