"""SWE-bench 5's eval contract for a task that names an image, on any `ImageRuntime`.

In order, each step a command inside the task's environment (so the image's own git, shell and Python do the work,
as in the SWE-bench harness):
  1. history: `/testbed` at `base_commit`, and nothing after it reachable (refs, reflogs, stash: agents were found
     reading the fix through `git log`); a tree that still shows a later commit after scrubbing is an infra error.
  2. the agent patch, through swebench's own apply chain (`GIT_APPLY_CMDS`, the tree reset between attempts, then
     the reverse check); nothing applies -> `not_applied`. Then the integrity check of `integrity.py`.
  3. the eval script: the row's `eval_script` through `make_test_spec(row)` (which records the test command's exit
     code after the end marker), or one in the same shape made from the row's test patch and test files; run with
     stderr merged into stdout (the markers are `set -x` lines, on stderr).
  4. grading with swebench's functions: `get_logs_eval` (PARSER_REGISTRY[log_parser] on the marked slice; a log
     that claims success over a failing exit code is not graded), `get_eval_tests_report`, `get_resolution_status`;
     a task with `expected_status` (R2E-Gym) is instead FULL iff the parsed map matches it exactly, R2E's rule.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from functools import cache
from pathlib import PurePosixPath
from typing import Any

from fleet.contracts.sandbox import TaskSpec, TaskStatus, Verdict
from fleet.contracts.swe_eval import GIT as _GIT
from fleet.contracts.swe_eval import WORKDIR, derived_eval_script
from services.sandbox.gitcmd import parse_numstat, rename_sources
from services.sandbox.images.parsers import r2e
from services.sandbox.images.runtime import IO_DIR, ImageEnv
from services.sandbox.integrity import CONFIG_FILES, check_patch, unsafe_path
from services.sandbox.treecache import TreeCache, tree_key
from services.sandbox.workspace import InfraError, swebench_apply_chain

EVAL_LOG_CAP = 16 << 20
"""Eval output kept for grading: the parsers need the whole marked slice, not a tail."""
_STEP_LIMIT_S = 300.0


@cache
def _swebench() -> Any:
    from swebench.harness import grading, utils
    from swebench.harness.constants import END_TEST_OUTPUT, FAIL_TO_PASS, PASS_TO_PASS, START_TEST_OUTPUT, EvalType

    from services.sandbox.images import parsers

    parsers.install()
    return {"grading": grading, "make_test_spec": utils.make_test_spec,
            "F2P": FAIL_TO_PASS, "P2P": PASS_TO_PASS, "start": START_TEST_OUTPUT, "end": END_TEST_OUTPUT,
            "EvalType": EvalType}


def load() -> None:
    _swebench()


def scrub_script(base_commit: str) -> str:
    """Bring /testbed to `base_commit` and drop every ref, reflog and stash that reaches past it."""
    base = shlex.quote(base_commit)
    return f"""set -u
cd {WORKDIR} || {{ echo "GRPO_ERROR no {WORKDIR} in the image"; exit 3; }}
g="{_GIT}"
base=$($g rev-parse --verify --quiet {base}^{{commit}}) || {{ echo "GRPO_ERROR base_commit not in {WORKDIR}"; exit 3; }}
[ "$($g rev-parse HEAD)" = "$base" ] || $g checkout --quiet --force --detach "$base" || exit 4
n=$($g rev-list --all --reflog --not "$base" --count)
if [ "$n" != 0 ]; then
  head_ref=$($g symbolic-ref --quiet HEAD || true)
  $g for-each-ref --format='%(refname)' | while read -r ref; do
    [ "$ref" = "$head_ref" ] || $g update-ref -d "$ref"
  done
  [ -z "$head_ref" ] || $g update-ref "$head_ref" "$base"
  $g reflog expire --expire=now --all && $g gc --quiet --prune=now
fi
echo "GRPO_FUTURE_BEFORE $n"
echo "GRPO_FUTURE_AFTER $($g rev-list --all --reflog --not "$base" --count)"
"""


def setup_script() -> str:
    """Apply the task's setup patch (a SWE-smith bug) and make the result the tree's only commit: neither
    `git diff` nor the history shows the clean tree it was made from."""
    return f"""cd {WORKDIR}
g="{_GIT}"
$g apply --whitespace=nowarn {IO_DIR}/setup.diff || {{ echo "GRPO_ERROR setup_patch does not apply"; exit 5; }}
$g checkout --quiet --orphan grpo-task && $g add --all --force . || exit 6
$g -c user.name=task -c user.email=task@localhost commit --quiet --no-verify -m task || exit 6
$g for-each-ref --format='%(refname)' | while read -r ref; do
  [ "$ref" = refs/heads/grpo-task ] || $g update-ref -d "$ref"
done
$g reflog expire --expire=now --all && $g gc --quiet --prune=now && echo GRPO_SETUP_DONE
"""


def apply_script(workdir: str = WORKDIR, patch: str = f"{IO_DIR}/patch.diff") -> str:
    """swebench's apply chain over the agent patch, the tree reset between attempts.

    The reset is `git checkout -- .` plus deleting the untracked files a failed attempt left (`patch` writes some
    hunks, `.rej` and `.orig` files), not `git clean`: the untracked files the image ships (R2E-Gym's
    `/testbed/run_tests.sh`, a `.venv` that no .gitignore names) are the harness's and must survive a failed attempt.
    """
    before = "${TMPDIR:-/tmp}/grpo-untracked-before"
    untracked = f"{_GIT} ls-files --others --exclude-standard -z | sort -z"
    lines = [f"cd {shlex.quote(workdir)} || exit 1", f"{untracked} > {before} || exit 1"]
    for i, argv in enumerate(swebench_apply_chain()):
        if i:
            lines.append(f"{_GIT} checkout -- . ; {untracked} | comm -z -13 {before} - | xargs -0 -r rm -f --")
        command = f"{_GIT} {shlex.join(argv[1:])}" if argv[0] == "git" else shlex.join(argv)
        lines.append(f"{command} {shlex.quote(patch)} && {{ echo GRPO_APPLIED; exit 0; }}")
    lines.append(f"{_GIT} apply --check --reverse {shlex.quote(patch)} && {{ echo GRPO_APPLIED; exit 0; }}")
    lines.append("exit 1")
    return "\n".join(lines) + "\n"


def shipped_untracked_script() -> str:
    """The untracked entries the image ships in /testbed (a wholly untracked folder as one `dir/` entry)."""
    return f"cd {WORKDIR} && {_GIT} ls-files --others --directory -z"


def touches_shipped(paths: list[str], shipped: list[str]) -> str | None:
    """The first patch path that is, or lies under, an untracked entry of the image: the harness's files (R2E-Gym's
    run_tests.sh, the venv), which the patch is applied over before the tests run."""
    for path in paths:
        for entry in shipped:
            if path == entry.rstrip("/") or (entry.endswith("/") and path.startswith(entry)):
                return path
    return None


def tree_id_script(forced: list[str], workdir: str = WORKDIR) -> str:
    """The tree the tests will run on, as git's tree id: every file .gitignore does not hide, and the patch's own
    files even where it does (a patch may write code where .gitignore looks away). Staged in a copy of the index:
    the eval script's git commands read the repository's own, which stays as it was."""
    adds = "".join(f'{{ [ -e {q} ] || [ -L {q} ]; }} && {{ $g add --force -- {q} || exit 1; }}\n'
                   for q in map(shlex.quote, forced))
    return f"""cd {shlex.quote(workdir)} || exit 1
g="{_GIT}"
export GIT_INDEX_FILE="${{TMPDIR:-/tmp}}/grpo-tree-index"
cp .git/index "$GIT_INDEX_FILE" || exit 1
$g add --all . || exit 1
{adds}echo "GRPO_TREE $($g write-tree)"
"""


async def tree_id(env: ImageEnv, forced: list[str]) -> str | None:
    """`tree_id_script`'s answer; None when git could not say (the run then goes uncached)."""
    env.put("tree.sh", tree_id_script(forced))
    result = await env.exec(["/bin/sh", f"{IO_DIR}/tree.sh"], limit_s=_STEP_LIMIT_S)
    found = [line.split()[1] for line in result.stdout.text().splitlines()
             if line.startswith("GRPO_TREE ") and len(line.split()) == 2]
    return found[0] if result.exit_code == 0 and found else None


def test_spec(spec: TaskSpec, test_paths: list[str]) -> Any:
    """swebench's TestSpec of the task (its eval script records the test exit code)."""
    row = {"instance_id": spec.image or "task", "image": spec.image, "repo": spec.repo_url,
           "version": "", "FAIL_TO_PASS": list(spec.fail_to_pass), "PASS_TO_PASS": list(spec.pass_to_pass),
           "log_parser": spec.log_parser or "parse_log_pytest", "eval_type": spec.eval_type or "pass_and_fail",
           "eval_script": spec.eval_script or derived_eval_script(spec, test_paths)}
    return _swebench()["make_test_spec"](row)


async def _paths(env: ImageEnv, name: str, text: str) -> list[str] | None:
    env.put(name, text if text.endswith("\n") else text + "\n")
    result = await env.exec(["/bin/sh", "-c", f"{_GIT} apply --numstat -z {IO_DIR}/{name}"], limit_s=_STEP_LIMIT_S)
    if result.exit_code != 0:
        return None
    return sorted({*parse_numstat(result.stdout.text()), *rename_sources(text)})


async def _read(env: ImageEnv, argv: list[str]) -> str | None:
    result = await env.exec(argv, limit_s=_STEP_LIMIT_S)
    return result.stdout.text() if result.exit_code == 0 else None


async def _integrity(env: ImageEnv, paths: list[str], test_paths: list[str], task_paths: list[str]) -> str | None:
    configs = [p for p in paths if PurePosixPath(p).name in CONFIG_FILES]
    before = {p: await _read(env, ["/bin/sh", "-c", f"{_GIT} show HEAD:{shlex.quote(p)}"]) for p in configs}
    after = {p: await _read(env, ["cat", "--", p]) for p in configs}
    return check_patch(paths, test_paths, before.get, after.get, task_paths)


async def stage_eval_files(env: ImageEnv, files: dict[str, str]) -> None:
    """Write the task's eval files (base64) into /testbed: what the eval script would download, staged offline."""
    lines = [f"cd {WORKDIR}"]
    for i, (path, content) in enumerate(sorted(files.items())):
        env.put(f"eval-file-{i}.b64", content)
        target = shlex.quote(path)
        parent = shlex.quote(str(PurePosixPath(path).parent))
        lines.append(f"mkdir -p {parent} && base64 -d {IO_DIR}/eval-file-{i}.b64 > {target} || exit 1")
    result = await env.exec(["/bin/sh", "-c", "\n".join(lines)], limit_s=_STEP_LIMIT_S)
    if result.exit_code != 0:
        raise InfraError(f"image {env.ref}: staging the task's eval files failed (exit {result.exit_code}): "
                         f"{result.stderr.text()[-300:]}")


async def prepare_history(env: ImageEnv, base_commit: str) -> int:
    """Step 1; returns how many later commits the image showed (0 for a well-built image)."""
    result = await env.exec(["/bin/sh", "-c", scrub_script(base_commit)], limit_s=_STEP_LIMIT_S)
    out = result.stdout.text()
    if result.exit_code != 0 or "GRPO_FUTURE_AFTER" not in out:
        why = next((line for line in out.splitlines() if line.startswith("GRPO_ERROR")), out[-300:])
        raise InfraError(f"image {env.ref}: preparing /testbed at {base_commit[:12]} failed (exit "
                         f"{result.exit_code}): {why} {result.stderr.text()[-300:]}")
    counts = dict(line.split()[:2] for line in out.splitlines() if line.startswith("GRPO_FUTURE_"))
    if counts.get("GRPO_FUTURE_AFTER") != "0":
        raise InfraError(f"image {env.ref}: commits after base_commit still reachable after scrubbing")
    return int(counts.get("GRPO_FUTURE_BEFORE", "0"))


async def apply_setup(env: ImageEnv, patch: str) -> None:
    env.put("setup.diff", patch if patch.endswith("\n") else patch + "\n")
    result = await env.exec(["/bin/sh", "-c", setup_script()], limit_s=_STEP_LIMIT_S)
    if "GRPO_SETUP_DONE" not in result.stdout.text():
        raise InfraError(f"image {env.ref}: the task's setup_patch does not apply (exit {result.exit_code}): "
                         f"{(result.stdout.text() + result.stderr.text())[-400:]}")


async def run_task(env: ImageEnv, spec: TaskSpec, timings: dict[str, float], trees: TreeCache | None = None) -> Verdict:
    """Steps 1-4 on a prepared environment; with `trees`, a tree graded before answers from the cache (the host
    path's step 10, docs/services/sandbox.md)."""
    t = time.monotonic()
    scrubbed = await prepare_history(env, spec.base_commit)
    if spec.setup_patch:
        await apply_setup(env, spec.setup_patch)
    timings["history_s"] = time.monotonic() - t
    t = time.monotonic()
    test_paths: list[str] = []
    if spec.test_patch.strip():
        found = await _paths(env, "test.diff", spec.test_patch)
        if found is None or any(unsafe_path(p) for p in found):
            raise InfraError(f"image {env.ref}: the task's test_patch is malformed or leaves the tree")
        test_paths = found
    paths: list[str] | None = []
    if spec.patch.strip():
        paths = await _paths(env, "patch.diff", spec.patch)
        if spec.integrity_check:
            shipped = await _read(env, ["/bin/sh", "-c", shipped_untracked_script()])
            touched = touches_shipped(paths or [], [p for p in (shipped or "").split("\0") if p])
            if touched is not None:
                return Verdict(status="refused", error=f"integrity check: patch modifies {touched}, which the image "
                                                       "ships outside the repository (the test harness's files)")
        applied = await env.exec(["/bin/sh", "-c", apply_script()], limit_s=_STEP_LIMIT_S)
        if applied.exit_code != 0 or "GRPO_APPLIED" not in applied.stdout.text():
            return Verdict(status="not_applied", error=f"patch does not apply: {applied.stdout.text()[-1500:]}")
        if spec.integrity_check:
            reason = await _integrity(env, paths or [], test_paths, spec.task_paths)
            if reason is not None:
                return Verdict(status="refused", patch_applied=True, error=f"integrity check: {reason}")
    if spec.eval_files:
        await stage_eval_files(env, spec.eval_files)
    timings["apply_s"] = time.monotonic() - t
    if trees is None:
        return await _evaluate(env, spec, test_paths, timings, scrubbed)
    t = time.monotonic()
    tree = await tree_id(env, paths or [])
    timings["tree_key_s"] = time.monotonic() - t
    if tree is None:
        return await _evaluate(env, spec, test_paths, timings, scrubbed)
    # Kept across restarts (`sandbox.tree_cache_path`) only for an image pinned by digest: a tag may move.
    return await trees.get_or_run(tree_key(spec, tree), lambda: _evaluate(env, spec, test_paths, timings, scrubbed),
                                  durable="@sha256:" in (spec.image or ""))


async def _evaluate(env: ImageEnv, spec: TaskSpec, test_paths: list[str], timings: dict[str, float],
                    scrubbed: int) -> Verdict:
    """Steps 3-4: the eval script on the tree as it stands, graded."""
    ts = test_spec(spec, test_paths)
    env.put("eval.sh", ts.eval_script)
    t = time.monotonic()
    result = await env.exec(["/bin/bash", "-c", f"exec /bin/bash {IO_DIR}/eval.sh 2>&1"], limit_s=spec.timeout,
                            output_cap=EVAL_LOG_CAP)
    timings["tests_s"] = time.monotonic() - t
    if not result.started:
        raise InfraError(f"image {env.ref}: sandbox did not start (exit {result.exit_code}): "
                         f"{result.stderr.text()[-500:]}")
    verdict = grade(spec, ts, result.stdout.text(), timed_out=result.timed_out)
    verdict.stderr_tail = result.stderr.text()[-4000:]
    if scrubbed:
        verdict.error = "; ".join(filter(None, [verdict.error, f"scrubbed {scrubbed} commit(s) after base_commit"]))
    return verdict


def grade(spec: TaskSpec, ts: Any, log: str, *, timed_out: bool = False) -> Verdict:
    """swebench's verdict on an eval log."""
    sb = _swebench()
    grading = sb["grading"]
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        status_map, ok = grading.get_logs_eval(ts, f.name)
    exit_code = grading.parse_test_exit_code(log)
    gold = {sb["F2P"]: list(spec.fail_to_pass), sb["P2P"]: list(spec.pass_to_pass)}
    report = grading.get_eval_tests_report(status_map, gold, eval_type=sb["EvalType"](ts.eval_type))
    resolution = grading.get_resolution_status(report).removeprefix("RESOLVED_")
    notes = [] if ok else ["eval log not gradable (no markers, an error marker, or an exit code that contradicts "
                           "the log)"]
    status: TaskStatus = "completed"
    if timed_out:
        status, resolution = "timeout", "NO"
        notes.insert(0, f"tests ran past the {spec.timeout:g} s limit and were killed")
    if not ok:
        resolution = "NO"
    kept = {k: v for k, v in report.items() if k in (sb["F2P"], sb["P2P"])}
    if spec.expected_status is not None:
        match, same, differ = r2e.exact_match(status_map, spec.expected_status)
        # R2E's rule replaces swebench's lists: every test's status as expected (FAILED ones included), no more tests.
        resolution = "FULL" if match and ok and not timed_out else "NO"
        kept = {"expected_status": {"success": same, "failure": differ}}
        if ok and not match:
            notes.append(f"{len(differ)} of {len(spec.expected_status)} expected test status(es) differ"
                         + ("" if differ else " (tests beyond the expected ones ran)"))
    values = list(status_map.values())
    return Verdict(
        status=status, patch_applied=True, test_patch_applied=True, tests_passed=sum(v in ("PASSED", "XFAIL")
                                                                                       for v in values),
        tests_failed=sum(v in ("FAILED", "ERROR") for v in values), exit_code=exit_code, test_status=status_map,
        resolution=resolution if resolution in ("FULL", "PARTIAL", "NO") else "NO",
        stdout_tail=log[-(256 << 10):], error="; ".join(notes), gradable=ok or timed_out,
        report=kept, stdout_bytes=len(log))
