"""SWE-smith rows, graded as SWE-smith's own harness (swesmith 0.0.9, `harness/eval.py`) grades them.

SWE-smith builds one image per repo@commit from its GitHub mirror (`swesmith/<owner>__<repo>.<c8>`): the image's
HEAD is the mirror's only `main` commit, the clean tree. Each bug lives on a mirror branch named after the instance
(bug commit, then a commit removing the F2P test files), pushed after the image was built. The harness `git fetch`es
that branch, checks out its `HEAD~1` (the bug, tests present), applies the prediction, restores the profile's test
files, and runs the profile's `test_cmd` between swebench's markers; the profile's `log_parser` reads the result.

Here the base is always the image's HEAD: the bug branch (and any `base_commit` a row carries, the bug or the
test-removal commit on it) is not in the image, and the sandbox has no network to fetch it, so naming it gives an
`infra_error` on every rollout. The row's `patch` is the bug: applied to HEAD and committed as the tree's only
commit (`setup_patch`) it rebuilds the bug commit; its reverse is the gold patch (the harness's gold run is
`git apply --reverse` of the bug). The profile comes from `data/swesmith_profiles.json`
(`scripts/regen_swesmith_profiles.py`): the image name as the profile writes it (`swebench` namespace, x86_64,
`__` as `_1776_`, commit[:8]; the row's `image_name` is not what the harness runs, and old rows name a local tag or
another namespace), the eval script in SWE-bench 5's shape with the profile's command, and the parser's name.

Accepted layouts: `harness/gather.py`'s (instance_id, patch, FAIL_TO_PASS, PASS_TO_PASS, image_name, repo = the
mirror; no problem statement yet) and the hub's (SWE-bench/SWE-smith*: the same with problem_statement; lists as
lists, or JSON strings). A repo with no profile, or whose parser or test selection is not ported, is refused with a
named reason (`loaders.Unsupported`), never scored zero; a profile-less row that brings its own `test_command` or
`eval_script` (and `image_name`) is graded with those, as a custom SWE-smith-style set.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

from envs.registry import Task
from envs.swe.loaders import Unsupported, parse_row
from fleet.contracts.swe_eval import GIT, WORKDIR

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
PROFILES_PATH = Path(__file__).parent / "data" / "swesmith_profiles.json"
# swebench.harness.constants' markers (swesmith.constants repeats them); literal so loading needs no swebench.
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
_GO_NAME = re.compile(r"^\w+$")


@cache
def profiles() -> dict[str, Any]:
    """The vendored profile table: `swesmith_version`, `org_gh`, `profiles` keyed by `<owner>__<repo>.<c8>`."""
    data: dict[str, Any] = json.loads(PROFILES_PATH.read_text(encoding="utf-8"))
    return data


def profile_key(row: dict[str, Any]) -> str:
    """The profile a row belongs to, as `registry.get_from_inst` finds it: `repo` (the mirror name or the bare
    `<owner>__<repo>.<c8>`), else the instance id up to its last dot."""
    repo = row.get("repo")
    key = repo if isinstance(repo, str) and repo else str(row.get("instance_id") or "").rsplit(".", 1)[0]
    return key.removeprefix(f"{profiles()['org_gh']}/")


def _where(row: dict[str, Any], row_no: int, key: str = "instance_id") -> str:
    iid = row.get(key)
    return f"row {row_no}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def reverse_patch(text: str) -> str:
    """The inverse of a unified (git) diff: what undoes it."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            swap = {"a/": "b/", "b/": "a/"}
            out += [f"--- {swap.get(new[:2], new[:2])}{new[2:]}" if new != "/dev/null" else "--- /dev/null",
                    f"+++ {swap.get(old[:2], old[:2])}{old[2:]}" if old != "/dev/null" else "+++ /dev/null"]
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
        elif line.startswith("new file mode"):
            out.append("deleted" + line[3:])
        elif line.startswith("deleted file mode"):
            out.append("new" + line[7:])
        elif line.startswith("diff --git ") or line.startswith("index "):
            out.append(line)
        elif line.startswith("+"):
            out.append("-" + line[1:])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def pytest_test_files(f2p: list[str], p2p: list[str]) -> tuple[list[str], list[str]]:
    """`PythonProfile.get_test_files`: the files of the F2P and P2P test ids."""
    def files(tests: list[str]) -> list[str]:
        return sorted({t.split("::", 1)[0] for t in tests})

    return files(f2p), files(p2p)


def test_command(profile: dict[str, Any], f2p: list[str], p2p: list[str]) -> str:
    """`RepoProfile.get_test_cmd(instance)` for an eval instance (one with FAIL_TO_PASS and a patch): the whole
    suite, or under `min_testing` the command followed by the F2P then P2P test files."""
    command = str(profile["test_cmd"])
    if profile["min_testing"] and profile["test_files"] == "pytest_ids":
        f2p_files, p2p_files = pytest_test_files(f2p, p2p)
        if f2p_files + p2p_files:
            command += f" {' '.join(f2p_files + p2p_files)}"
    return command


def _restore_lines(profile: dict[str, Any], f2p: list[str], p2p: list[str]) -> list[str]:
    """The harness's `git checkout -- <F2P + P2P test files>` after the prediction: edits to them do not count."""
    if profile["test_files"] == "pytest_ids":
        f2p_files, p2p_files = pytest_test_files(f2p, p2p)
        files = f2p_files + p2p_files
        return [f"{GIT} checkout -- {' '.join(shlex.quote(f) for f in files)}"] if files else []
    if profile["test_files"] == "go_funcs":
        # `GoProfile.get_test_files` maps each test name to the `_test.go` files defining `func <name>` in the
        # repository; the files are not in the row, so the tree at HEAD (the bug commit) is searched at run time.
        names = sorted({t for t in [*f2p, *p2p] if _GO_NAME.match(t)})
        if not names:
            return []
        pattern = shlex.quote(f"^[[:space:]]*func[[:space:]]+({'|'.join(names)})([^[:alnum:]_]|$)")
        return [f"files=$({GIT} grep -l -E {pattern} HEAD -- '*_test.go' | sed 's/^HEAD://')",
                f'[ -z "$files" ] || {GIT} checkout -- $files']
    return []


def eval_script(profile: dict[str, Any], f2p: list[str], p2p: list[str]) -> str:
    """The harness's `eval.sh` (SWE-bench 5's shape), after the test-file restore it does before writing it."""
    lines = ["#!/bin/bash", "set -uxo pipefail", f"cd {WORKDIR}", *_restore_lines(profile, f2p, p2p),
             f": '{START}'", test_command(profile, f2p, p2p), f": '{END}'"]
    return "\n".join(lines) + "\n"


def _row_for_parse(row: dict[str, Any]) -> dict[str, Any]:
    full = {k: v for k, v in row.items() if k not in ("image_name", "base_commit")}
    full["base_commit"] = "HEAD"
    if not full.get("repo"):
        full["repo"] = profile_key(row) or "?"
    if full.get("problem_statement") is None:
        # gather.py writes no statement (issue_gen adds it later): the task is then "make the failing tests pass".
        full["problem_statement"] = ""
    if full.get("created_at") is not None and not isinstance(full["created_at"], str):
        full["created_at"] = str(full["created_at"])  # parquet timestamps
    if row.get("base_commit"):
        full["row_base_commit"] = row["base_commit"]
    return full


def _custom(row: dict[str, Any], where: str, key: str) -> tuple[dict[str, Any] | None, list[str]]:
    """Image metadata of a profile-less row that names its own test command or eval script."""
    version = profiles()["swesmith_version"]
    if not any(isinstance(row.get(k), str) and row[k] for k in ("test_command", "eval_script")):
        return None, [Unsupported(where, "swe_smith", f"no swesmith {version} profile for repo {key or '?'} "
                                                      "(and the row names no test_command or eval_script)")]
    image = row.get("image_name")
    if not (isinstance(image, str) and image):
        return None, [f"{where}: field image_name: missing (repo {key} has no swesmith {version} profile to "
                      "derive it from)"]
    return {"image": image}, []


def _profiled(profile: dict[str, Any], key: str, where: str, row: dict[str, Any],
              f2p: list[str], p2p: list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    if "refused" in profile:
        return None, [Unsupported(where, f"swe_smith {profile['language']}", f"{key}: {profile['refused']}")]
    iid = str(row.get("instance_id"))
    if iid.rsplit(".", 1)[0] != key:  # get_test_cmd's assertion
        return None, [f"{where}: field instance_id: not an instance of {key} (the repo field's profile)"]
    return {"image": profile["image_name"], "eval_script": eval_script(profile, f2p, p2p),
            "log_parser": profile["log_parser"], "swesmith_timeout_s": profile["timeout"]}, []


def parse_swe_smith(row: Any, row_no: int) -> tuple[Task | None, list[str]]:
    if not isinstance(row, dict):
        return None, [f"row {row_no}: expected an object, got {type(row).__name__}"]
    where = _where(row, row_no)
    task, errors = parse_row(_row_for_parse(row), row_no)
    if task is None or errors:
        return None, errors
    key = profile_key(row)
    profile = profiles()["profiles"].get(key)
    f2p, p2p = list(task.fail_to_pass), list(task.pass_to_pass)
    if profile is None:
        extra, errors = _custom(row, where, key)
    else:
        extra, errors = _profiled(profile, key, where, row, f2p, p2p)
    if extra is None:
        return None, errors
    bug = task.patch
    command = task.test_command if profile is None else test_command(profile, f2p, p2p)
    meta = {**task.metadata, **extra, "setup_patch": bug}
    return Task(**{**task.__dict__, "patch": reverse_patch(bug), "test_command": command, "metadata": meta}), []
