"""SWE-bench task files (princeton-nlp format): JSON, JSONL or parquet, validated row by row.

FAIL_TO_PASS / PASS_TO_PASS may be lists or JSON-encoded strings (the hub's parquet files use strings). Every
problem is reported with its row number, instance id and field, all of them at once (up to a limit), so a bad file
is fixed in one pass. SWE-bench 5 rows also carry `image`, `eval_script`, `log_parser`, `eval_type`: the task runs
in that image. A row with neither `image` nor `repo_url` (the classic hub rows) gets the image SWE-bench publishes
for it, `sweb.eval.x86_64.<instance_id>` with `__` written `_1776_` (the executor adds `sandbox.image_namespace`,
`swebench` by default). SWE-Gym, R2E-Gym and SWE-smith rows: `envs/swe/formats.py`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.registry import Task

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig

REQUIRED_STR = ("instance_id", "repo", "base_commit", "patch", "problem_statement")
OPTIONAL_STR = ("test_patch", "version", "hints_text", "created_at", "environment_setup_commit", "repo_url",
                "test_command", "split")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
IMAGE_STR = ("image", "eval_script", "log_parser", "eval_type", "setup_patch")
"""Optional image fields, kept in `Task.metadata` and carried to the sandbox by the task payload."""
EVAL_TYPES = ("pass_and_fail", "fail_only")
_MAX_ERRORS = 20
RowParser = Callable[[Any, int], "tuple[Task | None, list[str]]"]


class Unsupported(str):
    """A row error meaning "valid, but this harness cannot grade it yet": counted per family at load time."""

    family: str
    why: str

    def __new__(cls, where: str, family: str, why: str) -> Unsupported:
        self = super().__new__(cls, f"{where}: {family}: cannot be graded yet: {why}")
        self.family, self.why = family, why
        return self


class DatasetFormatError(ValueError):
    """A task file that does not follow the SWE-bench format; `errors` lists `row N (id): field F: problem`."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source, self.errors = source, errors
        invalid = [e for e in errors if not isinstance(e, Unsupported)]
        refused = Counter((e.family, e.why) for e in errors if isinstance(e, Unsupported))
        parts = []
        if invalid:
            more = "" if len(invalid) <= _MAX_ERRORS else f"\n  ... and {len(invalid) - _MAX_ERRORS} more"
            listed = "\n  ".join(invalid[:_MAX_ERRORS])
            parts.append(f"{len(invalid)} invalid row field(s):\n  {listed}{more}")
        if refused:
            counts = "\n  ".join(f"{n} row(s) of {family}: {why}" for (family, why), n in refused.most_common())
            parts.append(f"{refused.total()} row(s) cannot be graded yet (refused rather than scored zero; "
                         f"drop them or see docs/swe-datasets.md):\n  {counts}")
        super().__init__(f"{source}: " + "\n".join(parts))


def read_rows(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(1-based row number, raw row) of a .json (a list of objects), .jsonl or .parquet file."""
    p = Path(path)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq  # heavy; only for parquet

        for i, row in enumerate(pq.read_table(p).to_pylist(), 1):
            yield i, row
    elif p.suffix == ".jsonl":
        with p.open(encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as exc:
                    error = f"row {i}: not valid JSON: {exc.msg} (column {exc.colno})"
                    raise DatasetFormatError(str(p), [error]) from exc
    elif p.suffix == ".json":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(str(p), [f"not valid JSON: {exc.msg} (line {exc.lineno})"]) from exc
        if not isinstance(data, list):
            raise DatasetFormatError(str(p), [f"top level must be a list of task objects, got {type(data).__name__}"])
        yield from enumerate(data, 1)
    else:
        raise ValueError(f"{p}: unsupported task file type {p.suffix!r} (use .json, .jsonl or .parquet)")


def _test_list(value: Any) -> tuple[list[str] | None, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return None, f"is a string but not a JSON list ({exc.msg})"
    if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
        value = value.tolist()
    if not isinstance(value, list):
        return None, f"expected a list of test ids (or a JSON string of one), got {type(value).__name__}"
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        return None, f"test ids must be strings, got {type(bad[0]).__name__} {bad[0]!r}"
    return value, ""


def swebench_image(instance_id: str) -> str:
    """The instance image SWE-bench publishes (no namespace: the executor adds `sandbox.image_namespace`)."""
    return f"sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest".lower()


def parse_row(row: Any, row_no: int, *, env_name: str = "swe",
              derive_image: bool = False) -> tuple[Task | None, list[str]]:
    """A Task from one SWE-bench row, or the list of `row N (id): field F: problem` errors."""
    if not isinstance(row, dict):
        return None, [f"row {row_no}: expected an object, got {type(row).__name__}"]
    iid = row.get("instance_id")
    where = f"row {row_no}" + (f" ({iid})" if isinstance(iid, str) and iid else "")
    errors: list[str] = []
    for key in REQUIRED_STR:
        value = row.get(key)
        if key not in row or value is None:
            errors.append(f"{where}: field {key}: missing")
        elif not isinstance(value, str):
            errors.append(f"{where}: field {key}: expected a string, got {type(value).__name__}")
        elif not value.strip() and key != "problem_statement":
            errors.append(f"{where}: field {key}: empty")
    for key in (*OPTIONAL_STR, *IMAGE_STR):
        if row.get(key) is not None and not isinstance(row[key], str):
            errors.append(f"{where}: field {key}: expected a string, got {type(row[key]).__name__}")
    lists: dict[str, list[str]] = {}
    for key in TEST_LISTS:
        if key not in row or row[key] is None:
            errors.append(f"{where}: field {key}: missing")
            continue
        parsed, problem = _test_list(row[key])
        if parsed is None:
            errors.append(f"{where}: field {key}: {problem}")
        else:
            lists[key] = parsed
    if isinstance(row.get("eval_type"), str) and row["eval_type"] not in EVAL_TYPES:
        errors.append(f"{where}: field eval_type: must be one of {', '.join(EVAL_TYPES)}, got {row['eval_type']!r}")
    if "FAIL_TO_PASS" in lists and not lists["FAIL_TO_PASS"]:
        errors.append(f"{where}: field FAIL_TO_PASS: empty (a task needs at least one failing test)")
    if errors:
        return None, errors
    known = {*REQUIRED_STR, *TEST_LISTS, "test_patch", "version", "repo_url", "test_command", "split"}
    repo = row["repo"]
    task = Task(
        instance_id=row["instance_id"],
        env_name=env_name,
        problem_statement=row["problem_statement"],
        repo=repo,
        repo_url=row.get("repo_url") or f"https://github.com/{repo}.git",
        base_commit=row["base_commit"],
        patch=row["patch"],
        test_patch=row.get("test_patch") or "",
        fail_to_pass=tuple(lists["FAIL_TO_PASS"]),
        pass_to_pass=tuple(lists["PASS_TO_PASS"]),
        version=str(row.get("version") or ""),
        test_command=row.get("test_command"),
        split=row.get("split") or "test",
        metadata={k: v for k, v in row.items() if k not in known},
    )
    if derive_image and not row.get("image") and not row.get("repo_url"):
        task.metadata["image"] = swebench_image(task.instance_id)
    return task, []


def load_swebench_file(path: str | Path, *, env_name: str = "swe", derive_image: bool = False,
                       parse: RowParser | None = None) -> list[Task]:
    """Every task of the file, or one DatasetFormatError listing every bad row field. `parse`: another format's
    row parser (`envs/swe/formats.py`), same errors."""
    tasks: list[Task] = []
    errors: list[str] = []
    first_row: dict[str, int] = {}
    for row_no, row in read_rows(path):
        if parse is not None:
            task, row_errors = parse(row, row_no)
        else:
            task, row_errors = parse_row(row, row_no, env_name=env_name, derive_image=derive_image)
        errors += row_errors
        if task is None:
            continue
        if task.instance_id in first_row:
            errors.append(f"row {row_no} ({task.instance_id}): field instance_id: duplicate of row "
                          f"{first_row[task.instance_id]}")
            continue
        first_row[task.instance_id] = row_no
        tasks.append(task)
    if errors:
        raise DatasetFormatError(str(path), errors)
    return tasks


def task_to_row(task: Task) -> dict[str, Any]:
    """The SWE-bench row of a task (test lists as lists; extras from metadata kept)."""
    row: dict[str, Any] = {
        "instance_id": task.instance_id, "repo": task.repo, "repo_url": task.repo_url,
        "base_commit": task.base_commit, "problem_statement": task.problem_statement, "patch": task.patch,
        "test_patch": task.test_patch, "FAIL_TO_PASS": list(task.fail_to_pass),
        "PASS_TO_PASS": list(task.pass_to_pass), "version": task.version, "test_command": task.test_command,
        "split": task.split,
    }
    row.update(task.metadata)
    return row


def _split_file(folder: Path, split: str) -> Path:
    """The file of `split` in a folder: `{split}.jsonl|json|parquet`, or a hub shard `[data/]{split}-*.parquet`
    (`dev-00000-of-00001.parquet`). Any split name works; a missing one is named with the splits that are there."""
    patterns = (f"{split}.jsonl", f"{split}.json", f"{split}.parquet", f"{split}-*.parquet", f"data/{split}-*.parquet")
    for pattern in patterns:
        hits = sorted(folder.glob(pattern))
        if hits:
            return hits[0]
    found = sorted({f.name.split("-")[0] if f.suffix == ".parquet" and "-" in f.name else f.stem
                    for sub in (folder, folder / "data") if sub.is_dir()
                    for f in sub.iterdir() if f.suffix in (".jsonl", ".json", ".parquet") and f.is_file()}
                   - {"manifest"})
    there = f"the splits there: {', '.join(found)}" if found else "no task files there"
    raise FileNotFoundError(f"{folder}: no file of split {split!r} ({' / '.join(patterns)}); {there} "
                            "(set data.*.split to one of them)")


def dataset_file(cfg: DatasetConfig, name: str) -> Path:
    """The task file `data_path` names (a file, or a folder holding the split's file)."""
    if not cfg.data_path:
        raise ValueError(f"dataset {name} needs data_path (a .json/.jsonl/.parquet file or a folder of them)")
    path = Path(cfg.data_path).expanduser()
    return _split_file(path, cfg.split) if path.is_dir() else path
