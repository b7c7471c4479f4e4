"""End to end: build a slice of the embedded task set through the real sandbox executor, twice, and grade it.

One repository (inflection: one test file, the fastest suite), three tasks. The sdist is downloaded through pip once
per session into a temporary cache.
"""

from __future__ import annotations

import asyncio
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import pytest

from envs.registry import load_dataset, make_environment
from envs.swe.payload import payload_to_spec, task_to_payload
from envs.swe.taskset import read_manifest, read_split
from fleet.config.env import DatasetConfig
from fleet.config.infra import SandboxConfig
from launch.data.builder import BuildOptions, BuildReport, build_taskset
from launch.data.cli import data_main
from launch.data.recipe import DEFAULT_RECIPE
from services.sandbox.executor import Executor

pytestmark = pytest.mark.slow

REPO, TASKS, SEED = "inflection", 3, 1


@pytest.fixture(scope="session")
def sdist_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sdists")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, sdist_cache: Path) -> tuple[Path, Path, BuildReport]:
    first, second = tmp_path_factory.mktemp("set-a"), tmp_path_factory.mktemp("set-b")
    rc = data_main(["build", "--out", str(first), "--repos", REPO, "--max-per-repo", str(TASKS), "--seed", str(SEED),
                    "--workers", "2", "--cache-dir", str(sdist_cache)])
    assert rc == 0
    report = asyncio.run(build_taskset(BuildOptions(out=second, repos=[REPO], max_per_repo=TASKS, seed=SEED,
                                                    workers=1, cache_dir=sdist_cache)))
    return first, second, report


def test_a_build_out_of_time_writes_what_it_accepted_and_says_so(built, sdist_cache, tmp_path):
    """`--max-seconds`: a window that closes (a lent GPU host's call) still writes a whole task set (splits,
    manifest, no staging left) naming the repository cut short. The window here closes before validation starts, so
    the set is empty and the subset check below is trivially true: that the tasks kept are a prefix of the full
    selection is checked deterministically in tests/unit/launch/data/test_builder.py."""
    first, _, _ = built
    out = tmp_path / "cut"
    rc = data_main(["build", "--out", str(out), "--repos", REPO, "--max-per-repo", str(TASKS), "--seed", str(SEED),
                    "--workers", "1", "--cache-dir", str(sdist_cache), "--max-seconds", "0.01"])
    assert rc == 0
    manifest = read_manifest(out)
    assert manifest["max_seconds"] == 0.01 and manifest["cut_short"] == [REPO]
    assert manifest["tasks"] == len(rows(out)) < TASKS
    assert {r["instance_id"] for r in rows(out)} <= {r["instance_id"] for r in rows(first)}
    assert not (out / ".staging").exists()


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for split in ("train", "validation") for line in (folder / f"{split}.jsonl").open()]


def test_same_recipe_and_seed_give_the_same_tasks_for_any_worker_count(built):
    first, second, report = built
    a, b = rows(first), rows(second)
    assert len(a) == TASKS == len(report.tasks)
    keys = ("instance_id", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "problem_statement", "split")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert all(r["instance_id"].startswith(f"{REPO}__{r['bug_kind']}__") for r in a)
    manifest = read_manifest(first)
    assert manifest["seed"] == SEED and manifest["repos"][REPO]["accepted"] == TASKS
    assert not (first / ".staging").exists()
    # The test ids are pytest's names under the versions the executor tested with, recorded beside them.
    assert manifest["test_runner"] == {"python": platform.python_version(), "pytest": pytest.__version__}


def test_validating_on_another_pytest_release_than_the_sets_says_so(built, tmp_path, capsys):
    """A lent GPU host's system pytest (8.x) named a boltons test `test_regex[magnet:?xt=...]` where the set, built
    with pytest 9.2, says `test_regex[test_url16]` (9.0 names a string parameter over 100 characters by its index):
    both gold patches of those tasks graded NO. `data validate` names the two versions whenever their releases
    differ, and records them in its report."""
    first, _, _ = built
    folder = tmp_path / "set"
    shutil.copytree(first, folder)
    manifest = read_manifest(folder)
    manifest["test_runner"] = {"python": platform.python_version(), "pytest": "8.3.5"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "report.json"
    args = ["validate", "--gold", "1", "--workers", "1", "--out", str(report), "data.train.dataset_name=swe_embedded",
            f"data.train.data_path={folder}"]
    assert data_main(args) == 0  # the ids here are 9.2's on both sides: the gold still resolves
    out = capsys.readouterr().out
    assert f"tests ran with Python {platform.python_version()}, pytest {pytest.__version__}" in out
    warning = next(line for line in out.splitlines() if line.startswith("warning:"))
    assert "pytest 8.3.5" in warning and f"pytest {pytest.__version__}" in warning and "sandbox.python" in warning
    runner = json.loads(report.read_text())["test_runner"]
    assert runner["task_set"]["pytest"] == "8.3.5" and runner["executor"]["pytest"] == pytest.__version__
    assert runner["mismatch"] == warning.removeprefix("warning: ")

    manifest["test_runner"]["pytest"] = pytest.__version__  # the same release: nothing to say
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert data_main(args) == 0
    assert "warning:" not in capsys.readouterr().out
    assert json.loads(report.read_text())["test_runner"]["mismatch"] is None


def test_a_trainer_whose_executor_runs_another_pytest_release_says_so_at_start(built, tmp_path, caplog, capsys):
    """The same check where a run starts: the trainer reads the set's manifest and asks each executor's /healthz
    (a real sandbox server here) what its tests run with; and `data validate --remote`, through the rollout
    workers' client, reads the same field."""
    from services.sandbox.server import SandboxServer
    from trainer.tasks import warn_on_test_runner_mismatch

    first, _, _ = built
    folder = tmp_path / "set"
    shutil.copytree(first, folder)
    manifest = read_manifest(folder)

    def write(pytest_version: str) -> None:
        manifest["test_runner"] = {"python": platform.python_version(), "pytest": pytest_version}
        (folder / "manifest.json").write_text(json.dumps(manifest))

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        server = SandboxServer(SandboxConfig(repos_root=str(folder / "repos"), pool_size=1), "127.0.0.1", 0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}"
        try:
            write("8.3.5")
            other = await asyncio.to_thread(warn_on_test_runner_mismatch, folder, [url, "http://127.0.0.1:9"])
            remote = ["validate", "--remote", "--gold", "1", "--workers", "1", "data.train.dataset_name=swe_embedded",
                      f"data.train.data_path={folder}", f"env.code.sandbox_urls=[{url}]"]
            assert await asyncio.to_thread(data_main, remote) == 0
            write(pytest.__version__)
            same = await asyncio.to_thread(warn_on_test_runner_mismatch, folder, [url])
        finally:
            await server.stop(0)
        down = await asyncio.to_thread(warn_on_test_runner_mismatch, folder, [url])  # nothing answers: no finding
        return other, same, down

    other, same, down = asyncio.run(scenario())
    assert len(other) == 1 and "pytest 8.3.5" in other[0] and f"pytest {pytest.__version__}" in other[0]
    assert "http://127.0.0.1:" in other[0] and str(folder) in other[0] and other[0] in caplog.text
    assert same == [] and down == []
    out = capsys.readouterr().out
    assert f"tests ran with Python {platform.python_version()}, pytest {pytest.__version__}" in out
    assert "warning:" in out and "pytest 8.3.5" in out


def test_tasks_are_swebench_rows_whose_statement_hides_the_fix(built):
    for row in rows(built[0]):
        assert row["FAIL_TO_PASS"] and row["test_patch"] == "" and row["repo_url"] == f"embedded://{REPO}"
        assert not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        assert all(t.startswith("test_inflection.py::") for t in row["FAIL_TO_PASS"])
        # Neither the buggy lines nor their fix may show (library frames are dropped from the tracebacks).
        changed = [line[1:].strip() for line in row["patch"].splitlines()
                   if line[:1] in "+-" and not line.startswith(("---", "+++"))]
        assert changed and not any(line in row["problem_statement"] for line in changed if len(line) > 12)


def test_gold_patch_resolves_and_empty_patch_does_not(built):
    folder = built[0]
    tasks = read_split(folder, "train") + read_split(folder, "validation")

    async def grade() -> list[tuple[str, str]]:
        async with Executor(SandboxConfig(repos_root=str(folder / "repos"), pool_size=2)) as ex:
            specs = [payload_to_spec(task_to_payload(t), patch, timeout=120) for t in tasks
                     for patch in (t.patch, "")]
            verdicts = await asyncio.gather(*(ex.run(s) for s in specs))
        return [(v.status, v.resolution) for v in verdicts]

    results = asyncio.run(grade())
    assert results[0::2] == [("completed", "FULL")] * len(tasks)
    assert all(status == "completed" and resolution != "FULL" for status, resolution in results[1::2])


def test_registry_loads_the_built_set_and_prompts_carry_the_retrieved_file(built):
    folder = built[0]
    train = load_dataset(DatasetConfig(dataset_name="swe_embedded", data_path=str(folder)))
    val = load_dataset(DatasetConfig(dataset_name="swe_embedded", data_path=str(folder), split="validation"))
    assert len(train) + len(val) == TASKS
    task = (list(train) + list(val))[0]
    env = make_environment("swe", repos_root=folder / "repos")
    prompt = env.build_prompt(task, WordTokenizer(), 100_000, "bm25")
    # Found from the statement's words, not from the gold patch (which the prompt never reads).
    assert prompt.context_files[0] == "inflection/__init__.py" and prompt.dropped_files == []
    assert "def camelize(" in prompt.text and task.problem_statement.strip() in prompt.text
    bare = env.build_prompt(task, WordTokenizer(), 100_000, "none")
    small = env.build_prompt(task, WordTokenizer(), len(bare.token_ids) + 5, "bm25")
    assert "inflection/__init__.py" in small.dropped_files and "def camelize(" not in small.text


def test_list_prints_counts_per_repository_and_kind(built, capsys):
    assert data_main(["list", "--data", str(built[0])]) == 0
    out = capsys.readouterr().out
    assert f"tasks: {TASKS}" in out and "per repository:" in out and REPO in out and "per bug kind:" in out
    assert data_main(["list", "--data", str(built[0] / "nope")]) == 1


class WordTokenizer:
    """Whitespace tokenizer with a chat template: enough to count a prompt's budget."""

    chat_template = "plain"

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        return "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages) + "<assistant>\n"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [hash(w) % 50_000 for w in text.split()]}


def test_trainer_prompts_read_the_code_of_a_set_outside_the_default_folder(built):
    # The launcher sets `sandbox.repos_root` for the sandbox only; the trainer's prompts must still find this set's
    # repositories (they used to fall back to the default set's and carry no code at all).
    from fleet.config.env import EnvConfig
    from trainer.tasks import EnvTaskSource, SourceDeps

    folder = built[0]
    source = EnvTaskSource(DatasetConfig(dataset_name="swe_embedded", data_path=str(folder), max_prompt_length=100_000,
                                         context="bm25_functions"), WordTokenizer(), SourceDeps(EnvConfig(), 0))
    assert source.env.repos_root == str(folder / "repos")
    prompt = source.env.build_prompt(source.dataset[0], WordTokenizer(), 100_000, "bm25_functions")
    assert prompt.context_files and all(label.startswith("inflection/__init__.py:") for label in prompt.context_files)


def restated(built_folder: Path, tmp_path: Path, recipe_text: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    folder = tmp_path / "set"
    shutil.copytree(built_folder, folder)
    (tmp_path / "recipe.yaml").write_text(recipe_text)
    assert data_main(["restate", "--data", str(folder), "--recipe", str(tmp_path / "recipe.yaml"),
                      "--workers", "2"]) == 0
    return folder


def test_restating_under_the_recipe_a_set_was_built_with_writes_its_statements_byte_for_byte(built, tmp_path):
    folder = restated(built[0], tmp_path, DEFAULT_RECIPE.read_text())
    assert rows(folder) == rows(built[0])
    assert read_manifest(folder)["restated"]["changed"] == 0


def test_restating_with_repository_frames_writes_what_a_build_with_them_writes(sdist_cache, tmp_path):
    """Bugs that raise inside the library (swapped call arguments, changed operators) get its frames; the rest of
    each row stays as built, and the rows are the ones a build under the new recipe makes."""
    framed_recipe = tmp_path / "framed.yaml"
    framed_recipe.write_text(DEFAULT_RECIPE.read_text() + "\nstatement_frames: repository\n")
    plain, framed = tmp_path / "plain", tmp_path / "framed"
    for out, recipe in ((plain, DEFAULT_RECIPE), (framed, framed_recipe)):
        assert data_main(["build", "--out", str(out), "--repos", REPO, "--max-per-repo", str(TASKS), "--seed",
                          str(SEED), "--kinds", "call_swap_args,op_change", "--workers", "2", "--cache-dir",
                          str(sdist_cache), "--recipe", str(recipe)]) == 0
    folder = restated(plain, tmp_path / "restate", framed_recipe.read_text())
    before, after = rows(plain), rows(folder)
    assert after == rows(framed)
    assert [{k: v for k, v in r.items() if k != "problem_statement"} for r in after] == \
        [{k: v for k, v in r.items() if k != "problem_statement"} for r in before]
    changed = [r for r, b in zip(after, before, strict=True) if r["problem_statement"] != b["problem_statement"]]
    assert changed and all("inflection/__init__.py:" in r["problem_statement"] for r in changed)
    manifest = read_manifest(folder)
    assert manifest["restated"]["statement_frames"] == "repository"
    assert manifest["restated"]["rows"] == TASKS and manifest["restated"]["changed"] == len(changed)
    assert manifest["recipe_fingerprint"] == read_manifest(framed)["recipe_fingerprint"]
    assert manifest["recipe_fingerprint"] != read_manifest(plain)["recipe_fingerprint"]


def test_a_set_grown_one_repository_at_a_time_keeps_the_others_and_still_grades(built, sdist_cache, tmp_path):
    """`data merge`: two repositories built apart make one set, then a wider build of one of them replaces its
    tasks while the other's stay byte for byte; the merged set carries the bare repositories its commits are in, so
    every gold patch still resolves FULL and every empty patch NO through the sandbox."""
    first, _, _ = built

    def build(repo: str, tasks: int, out: Path) -> Path:
        assert data_main(["build", "--out", str(out), "--repos", repo, "--max-per-repo", str(tasks), "--seed",
                          str(SEED), "--workers", "2", "--cache-dir", str(sdist_cache)]) == 0
        return out

    parse, wide = build("parse", 2, tmp_path / "parse"), build(REPO, TASKS + 2, tmp_path / "wide")
    two, grown = tmp_path / "two", tmp_path / "grown"
    assert data_main(["merge", str(first), str(parse), "--out", str(two)]) == 0
    assert data_main(["merge", str(two), str(wide), "--out", str(grown)]) == 0

    def of(folder: Path, repo: str) -> list[dict[str, Any]]:
        return sorted((r for r in rows(folder) if r["repo"] == repo), key=lambda r: r["instance_id"])

    assert of(grown, "parse") == of(parse, "parse") and len(of(grown, "parse")) == 2
    assert of(grown, REPO) == of(wide, REPO) and len(of(grown, REPO)) == TASKS + 2
    # The same seed: the narrower build's tasks are the wider one's first ones.
    assert {r["instance_id"] for r in of(first, REPO)} <= {r["instance_id"] for r in of(grown, REPO)}
    assert sorted(p.name for p in (grown / "repos").iterdir()) == ["inflection.git", "parse.git"]
    manifest = read_manifest(grown)
    assert manifest["tasks"] == TASKS + 4 and [m["repos"] for m in manifest["merged"]] == [["parse"], [REPO]]
    assert manifest["repos"][REPO]["accepted"] == TASKS + 2 and manifest["repos"]["parse"]["accepted"] == 2
    for split in sorted({r["split"] for r in rows(grown)}):
        assert data_main(["validate", "--gold", "0", "--workers", "2", "data.train.dataset_name=swe_embedded",
                          f"data.train.data_path={grown}", f"data.train.split={split}"]) == 0


def test_merging_builds_of_another_test_runner_or_over_a_folder_is_refused(built, tmp_path, capsys):
    """A task's FAIL_TO_PASS ids are its pytest's names: two builds on different pytest releases do not make one
    set. And `--out` is a new folder: an existing one (a typo for BASE) is never replaced."""
    first, second, _ = built
    other = tmp_path / "other"
    shutil.copytree(second, other)
    manifest = read_manifest(other)
    manifest["test_runner"] = {**manifest["test_runner"], "pytest": "8.3.5"}
    (other / "manifest.json").write_text(json.dumps(manifest))
    assert data_main(["merge", str(first), str(other), "--out", str(tmp_path / "merged")]) == 1
    err = capsys.readouterr().err
    assert "test_runner differs" in err and "8.3.5" in err and str(other) in err
    assert not (tmp_path / "merged").exists() and not (tmp_path / "merged.merging").exists()
    before = rows(first)
    assert data_main(["merge", str(second), str(second), "--out", str(first)]) == 1
    assert "exists" in capsys.readouterr().err and rows(first) == before
