"""`env.*` and `data.*`: where tasks come from and how answers are scored (seed key names kept)."""

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fleet.config.base import Section
from fleet.contracts.sandbox import DEFAULT_TASK_TIMEOUT_S, RewardMode

_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

AGENT_SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in the repository you are in. Look around with the tools, change "
    "the code (not the tests), check your change, then call submit."
)


class AgentConfig(Section):
    max_turns: int = Field(8, ge=1)
    """Model turns per episode; the episode ends after the last one (`max_turns`)."""
    max_total_tokens: int | None = Field(None, ge=16)
    """Prompt + generated + observation tokens of an episode (None: `policy.max_total_sequence_length`, which it
    may not exceed); an episode ends (`context_full`) before its next turn or observation would not fit."""
    max_new_tokens_per_turn: int | None = Field(None, ge=1)
    """Tokens one turn may generate (None: `policy.generation.max_new_tokens`)."""
    max_observation_tokens: int = Field(512, ge=16)
    """Tool output tokens appended per turn; longer output is cut in the middle, with a marker saying so."""
    episode_timeout_s: float = Field(600.0, gt=0)
    """Wall clock of one episode (generation and tools; grading comes after); past it the episode ends
    (`timeout`) with the turns it completed, so one straggler never holds its group back."""
    command_timeout_s: float = Field(30.0, gt=0)
    """Wall-clock limit of one shell command in the sandbox session (at most `sandbox.sessions.max_exec_timeout_s`)."""
    system_prompt: str = AGENT_SYSTEM_PROMPT
    """System message of an episode's prompt (the tool descriptions are added by the chat template)."""


class CodeEnvConfig(Section):
    mode: Literal["single_shot", "agent"] = "single_shot"
    """single_shot: one answer holding a patch per sample (the seed's mode). agent: each sample is a multi-turn
    episode of tool calls (shell, file editor, submit) in a sandbox session, graded on submit like a patch
    (`env.code.agent`; docs/agent-mode.md)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Agent-mode budgets and prompt."""
    sandbox_urls: list[str] = Field(default_factory=lambda: ["http://localhost:9090"])
    """Sandbox executors; the client spreads tasks over them (least outstanding first)."""
    reward_mode: RewardMode = "binary"
    """binary: 1 for a FULL resolution, else 0. pass_rate: fraction of FAIL_TO_PASS + PASS_TO_PASS tests passing (a
    patch that changes nothing earns the PASS_TO_PASS share, and a policy learns to write such patches).
    fail_to_pass: fraction of FAIL_TO_PASS tests passing times the fraction of PASS_TO_PASS tests still passing, so
    the unchanged code scores 0 and partial credit is only for progress on the bug."""
    fail_to_pass_first: bool = False
    """Ask the sandbox to run a task's FAIL_TO_PASS tests alone first and to skip the full run where none of them
    passes (`TaskSpec.fail_to_pass_first`): most wrong answers then cost a few tests, not the task's whole test files.
    The reward is unchanged under `binary` and `fail_to_pass`, which pay 0 when no FAIL_TO_PASS test passes; not
    allowed with `pass_rate`, which pays PASS_TO_PASS tests too."""
    integrity_check: bool = True
    """Refuse patches that touch test files or files of the test patch."""
    task_timeout: float = Field(DEFAULT_TASK_TIMEOUT_S, gt=0)
    """Seconds one task may take in the sandbox (tests included); 1800 is the SWE-bench harness's default. The
    executor refuses a task above `sandbox.max_timeout_s`."""
    num_workers: int | None = Field(None, ge=1)
    """Sandbox tasks one rollout worker keeps in flight. None: as many as the executors that are up have runners (the
    `sandbox.pool_size` each reports on /healthz, followed as executors go down and come back), so one worker keeps
    every runner busy; with several workers the extra tasks queue at the executors, and time queued there does not
    count against `task_timeout`. A number caps it (the executors then run at most `rollout.num_workers` times it)."""
    verdict_cache_size: int = Field(1024, ge=0)
    """Verdicts a rollout worker keeps, keyed by the whole task spec (task, commit, patch, tests, timeout): an
    answer whose patch another answer of the worker already sent is not run again, and identical answers in flight
    share one run. A policy that has learnt a task writes the same diff again (the eighth speedrun run: 1.4 % of the
    sync fleet's sandbox runs spared, 2.5 % of the async one's; 2.9 and 4.7 % in the run's second call). Only
    verdicts that say something about the patch are kept (completed, not applied, refused), never a timeout or an
    infrastructure failure. A flaky test is then graded once per distinct patch. A verdict holds its tests'
    statuses: a few KB for the embedded tasks, up to a few hundred KB for a repository of thousands of tests (lower
    it there). 0: every answer runs."""
    format_error_reward: float = 0.0
    """Reward of an answer with no usable patch."""
    integrity_violation_reward: float = -1.0
    """Reward of an `integrity_violation` verdict (a forged report, pytest manipulated from code under test): below
    any honest outcome, so a caught cheat never pays. Counted in the rollout workers' `integrity_violations`."""
    auth_token: str | None = None
    """Bearer token for the sandbox executors (or GRPO_FLEET_SANDBOX_TOKEN)."""
    max_retries: int = Field(5, ge=0)
    """Retries of a task after infrastructure failures before the group is given back."""

    @model_validator(mode="after")
    def _first_run_needs_a_reward_it_keeps(self) -> "CodeEnvConfig":
        if self.fail_to_pass_first and self.reward_mode == "pass_rate":
            raise ValueError("env.code.fail_to_pass_first=true needs env.code.reward_mode binary or fail_to_pass: "
                             "pass_rate pays PASS_TO_PASS tests, which a first run that settles the verdict skips")
        return self


ArithOp = Literal["+", "-", "*"]


class ArithEnvConfig(Section):
    max_operand: int = Field(20, ge=1)
    """Largest operand of the generated arithmetic tasks."""
    num_tasks: int = Field(2000, ge=1)
    """Tasks in the generated training set."""
    ops: list[ArithOp] = Field(default_factory=lambda: list[ArithOp](["+", "-"]), min_length=1)
    """Operators the generated questions use (subtractions keep a non-negative answer)."""
    answer_format: Literal["tag", "number"] = "tag"
    """tag: the answer is the last `<answer>N</answer>`. number: the first integer in the completion is the answer,
    so that a randomly initialised model can stumble on well-formed answers (the learning demo)."""
    reward_mode: Literal["binary", "pass_rate"] = "binary"
    """binary: 1 for a right answer, else 0. pass_rate: a verdict has two tests, `format` (an answer was found) and
    `answer` (it is right), so a well-formed wrong answer earns 0.5: the shaping a model learning from scratch needs."""
    format_error_reward: float = 0.0
    """Reward of a completion with no answer in the expected format."""


class LookupEnvConfig(Section):
    num_keys: int = Field(10, ge=1, le=1000)
    """Keys `k0`..`k{num_keys-1}` a task's table draws from."""
    table_size: int = Field(4, ge=1)
    """Keys in one task's table (at most `num_keys`); the question names one of them."""
    max_value: int = Field(99, ge=1)
    """Values are random integers in [10, max_value] (in [0, max_value] when it is below 10), new per task."""
    num_tasks: int = Field(4000, ge=1)
    """Tasks in the generated training set."""
    reward_mode: Literal["binary", "pass_rate"] = "binary"
    """binary: 1 for the right value, else 0. pass_rate: the fraction of three tests, `format` (an answer was
    given), `lookup` (the question's key was looked up) and `answer` (the right value)."""
    format_error_reward: float = 0.0
    """Reward of an episode that never called `answer`."""


ComputerUseFamily = Literal["click_button", "type_submit", "checkboxes", "pick_option"]
COMPUTER_USE_SYSTEM_PROMPT = (
    "You operate a web page through its screenshots. Each turn, look at the latest screenshot and call one action "
    "with pixel coordinates of that screenshot. When the task is done, call done."
)


class ComputerUseEnvConfig(Section):
    viewport: list[int] = Field(default_factory=lambda: [224, 224])
    """[width, height] of the page and of every screenshot, in pixels; both multiples of 28 (a Qwen2-VL image is
    whole 28x28 merged patches: 224x224 is 64 image tokens)."""
    num_tasks: int = Field(2000, ge=1)
    """Tasks in the generated training split."""
    num_validation_tasks: int = Field(200, ge=1)
    """Tasks in the generated validation split (parameter sets disjoint from training's)."""
    families: list[ComputerUseFamily] = Field(
        default_factory=lambda: list[ComputerUseFamily](["click_button", "type_submit", "checkboxes", "pick_option"]),
        min_length=1)
    """Task families generated, in turn (docs/computer-use.md shows one page of each)."""
    action_timeout_s: float = Field(10.0, gt=0, le=120)
    """Wall clock the sandbox gives the renderer for one action and its screenshot; past it the renderer counts as
    hung: an infrastructure failure, never a failed episode."""
    max_actions: int = Field(8, ge=1, le=256)
    """Actions one episode may send (`done` not counted); the sandbox refuses more (400)."""
    system_prompt: str = COMPUTER_USE_SYSTEM_PROMPT
    """System message of an episode's prompt (the action tools are added by the chat template)."""

    @field_validator("viewport")
    @classmethod
    def _whole_patches(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or any(not 56 <= v <= 1344 or v % 28 for v in value):
            raise ValueError(f"env.computer_use.viewport: {value} must be [width, height], each a multiple of 28 "
                             "between 56 and 1344 (whole 28x28 patches), e.g. [224, 224]")
        return value


class EnvConfig(Section):
    code: CodeEnvConfig = Field(default_factory=CodeEnvConfig)
    """The SWE coding environment (patch -> sandbox verdict -> reward)."""
    arith: ArithEnvConfig = Field(default_factory=ArithEnvConfig)
    """A small verifiable environment a tiny model learns in minutes (scored through the same reward path)."""
    computer_use: ComputerUseEnvConfig = Field(default_factory=ComputerUseEnvConfig)
    """Screenshots in, clicks and keys out: small HTML tasks rendered by Chromium in the sandbox
    (docs/computer-use.md)."""
    lookup: LookupEnvConfig = Field(default_factory=LookupEnvConfig)
    """A multi-turn tool environment (agent episodes, tools run in the rollout worker): the answer is a value only
    the `lookup` tool returns (envs/lookup.py; budgets from `env.code.agent`)."""

    def reward_settings(self, env_name: str) -> tuple[RewardMode, float]:
        """(reward mode, format-error reward) of an environment: its own section if it has one, else `env.code`."""
        section: CodeEnvConfig | ArithEnvConfig | LookupEnvConfig = \
            self.arith if env_name == "arith" else self.lookup if env_name == "lookup" else self.code
        return section.reward_mode, section.format_error_reward


class DatasetConfig(Section):
    dataset_name: str = "swe_embedded"
    """Registry name of the task source: `swe_embedded` (the task set `grpo-fleet data build` makes), `swebench`
    (SWE-bench JSON/JSONL/parquet files), `arith`, or one added with `envs.registry.register_dataset`."""
    data_path: str | None = None
    """File or folder of the data. swe_embedded: the task-set folder (None: `.cache/tasks` under the repository
    root, built on first `grpo-fleet up`); swebench: a task file, or a folder holding `{split}.jsonl|json|parquet`;
    arith: unused (tasks are generated from `grpo.seed`)."""
    split: str = "train"
    """Split of the source to read: any name its files exist for (`train`, `validation`, `test`, SWE-bench's `dev`,
    ...). A folder's split file is `{split}.jsonl|json|parquet`, `{split}-*.parquet` or `data/{split}-*.parquet` (the
    hub's layout). The embedded task set and the generated sets (arith, ...) read `test` as `validation`."""
    max_prompt_length: int = Field(1536, ge=8)
    """Prompt token budget; code context is dropped file by file (never cut silently) to fit."""
    max_samples: int | None = Field(None, ge=1)
    """Use at most this many tasks (the first ones of the split)."""
    context: Literal["bm25", "bm25_functions", "none"] = "bm25"
    """Code context in the prompt: bm25, the repository's source files at `base_commit` that best match the problem
    statement (BM25, as SWE-bench's retrieval setting; needs a local checkout of the repository, else no code);
    bm25_functions, the same ranking over its functions and methods (each shown whole under `[start of
    path:line qualname]`: more of the relevant code within a small budget); or none. Nothing in a prompt comes from
    the gold patch."""
    context_functions: int = Field(12, ge=1, le=256)
    """bm25_functions: how many of the best-ranked functions a prompt may choose from (each shown whole; of those,
    the set that fits `max_prompt_length` and is worth most, a function at rank r worth 1 / (r + 1)). Raise it with
    the budget: at 12, a larger budget is left unused."""
    assets_dir: str | None = None
    """Folder of the rows' image assets (SWE-bench Multimodal `image_assets`), one file per URL named
    `<sha256 of the URL>.<ext>`; None: `assets/` beside the data. Fill it where there is internet with
    `python scripts/fetch_image_assets.py DATA_FILE --out DIR` (docs/data.md)."""
    allow_missing_assets: bool = False
    """Load rows whose problem-statement images are not in `assets_dir` (the prompt names each missing image in
    text) instead of refusing the data set."""
    first_run_repos: list[str] | None = Field(default_factory=lambda: ["inflection", "toolz"])
    """swe_embedded: the recipe repositories (launch/data/recipe.yaml) that a run builds when `data_path` holds no task
    set yet -- a small slice, so that a first run trains within minutes. None: every repository. A task set already
    there is used as it is; the full set builds on demand with `grpo-fleet data build`."""
    first_run_tasks: int | None = Field(None, ge=1)
    """swe_embedded: tasks that slice aims for, spread evenly over `first_run_repos` (a repository may yield fewer).
    None: one distinct prompt per step's slot, `grpo.num_prompts_per_step` x `grpo.max_num_steps`, kept between 8
    and 16 (a longer run goes over the slice again, as it would over any task set)."""

    @field_validator("split")
    @classmethod
    def _split_name(cls, value: str) -> str:
        # The name becomes part of a file pattern: no path separators or glob characters.
        if not _SPLIT_NAME.fullmatch(value):
            raise ValueError(f"data.*.split: {value!r} is not a split name (letters, digits, `_`, `-`, `.`; "
                             "e.g. train, dev, test)")
        return value

    @field_validator("context", mode="before")
    @classmethod
    def _no_oracle(cls, value: object) -> object:
        if value == "oracle":
            raise ValueError("data.*.context: 'oracle' (the files the gold patch touches) is gone: it tells the "
                             "policy where the fix is; use 'bm25' (files retrieved from the problem statement) or "
                             "'none'")
        return value


class DataConfig(Section):
    train: DatasetConfig = Field(default_factory=DatasetConfig)
    """Training tasks."""
    validation: DatasetConfig | None = None
    """Validation tasks (None: the validation split of the training source, all of it)."""
    shuffle: bool = True
    """Shuffle training tasks each epoch (seeded by `grpo.seed`)."""

    def validation_or_default(self) -> DatasetConfig:
        """`validation`, or the training source's validation split when it is not set."""
        if self.validation is not None:
            return self.validation
        return self.train.model_copy(update={"split": "validation", "max_samples": None})
