"""Where one sandbox verdict's test time goes, repository by repository: the interpreter's start, importing pytest with
its builtin plugins (what the trusted runner does before the tree is on `sys.path`), and pytest's own session, for a
run of the FAIL_TO_PASS tests alone (`env.code.fail_to_pass_first`'s first run, the run most answers end on) and for
the task's whole test files; beside them the real executor's test phases for the gold patch.

    .venv/bin/python benchmarks/test_run_cost.py --tasks .speedrun/tasks --reps 5

One validation task per repository, its base commit checked out once; each command runs `--reps` times in a row on
the isolated runner folder the executor builds (`TrustedRunner`, the base interpreter with `-S`), timings inside the
process (`time.perf_counter`) and around it. The figures are what a runner that imported pytest once and forked per
run (before any of the tree is imported) would save: the import is the same for every run. Writes
`benchmarks/results/test_run_cost.json`.

The probes run each task's own tests at its base commit outside bubblewrap (no model's patch is applied): point it
at a task set you trust. The executor's part runs in the sandbox as the fleet's does (root and bwrap).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.registry import Task  # noqa: E402
from envs.swe.payload import payload_to_spec, task_to_payload  # noqa: E402
from envs.swe.taskset import read_split  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402
from launch.data.gold import phase_times  # noqa: E402
from services.sandbox.executor import Executor  # noqa: E402
from services.sandbox.trusted import TrustedRunner, pytest_command  # noqa: E402

# The runner's boot order (services/sandbox/runner/boot.py), timed: pytest and its builtin plugins from the runner
# folder, then the tree first on sys.path, then the session.
PROBE = """
import sys, time
t0 = time.perf_counter()
site, tree, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, site)
import importlib, pytest
from _pytest.config import default_plugins
for name in default_plugins:
    importlib.import_module("_pytest." + name)
t1 = time.perf_counter()
sys.path[:] = [tree, *[p for p in sys.path if p != site], site]
pytest.main(args)
t2 = time.perf_counter()
sys.stderr.write("TIMES %.6f %.6f\\n" % (t1 - t0, t2 - t1))
"""


def one_per_repo(tasks: Path) -> list[Task]:
    seen: dict[str, Task] = {}
    for t in read_split(tasks, "validation") + read_split(tasks, "train"):
        seen.setdefault(t.repo, t)
    return [seen[r] for r in sorted(seen)]


def probe(runner: TrustedRunner, tree: Path, args: list[str], env: dict[str, str]) -> dict[str, float]:
    t = time.perf_counter()
    proc = subprocess.run([runner.python, "-s", "-P", "-S", "-c", PROBE, str(runner.site), str(tree), *args],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    line = next((x for x in proc.stderr.splitlines() if x.startswith("TIMES ")), None)
    if line is None:
        raise RuntimeError(f"the probe did not finish in {tree}: {proc.stderr[-500:]}")
    imp, session = (float(x) for x in line.split()[1:])
    return {"wall_s": wall, "import_s": imp, "session_s": session, "start_s": wall - imp - session}


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median over `rows` (`phase_times`, as `data validate` reports a run's phases)."""
    return {k: round(v["median"], 4) for k, v in phase_times(rows)["phases"].items()}


async def executor_phases(tasks: list[Task], repos: Path, reps: int) -> dict[str, dict[str, float]]:
    """The real executor's test phases for each task's gold patch, FAIL_TO_PASS first (so both runs happen)."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="run-cost-") as work:
        cfg = SandboxConfig(pool_size=1, work_root=work, repos_root=str(repos))
        async with Executor(cfg) as ex:
            for task in tasks:
                spec = payload_to_spec(task_to_payload(task), task.patch, timeout=60, fail_to_pass_first=True)
                timings = []
                for _ in range(reps):
                    v = await ex.run(spec)
                    if v.resolution != "FULL":
                        raise RuntimeError(f"{task.instance_id}: the gold patch graded {v.resolution} ({v.error})")
                    timings.append({k: v.timings[k] for k in ("first_tests_s", "tests_s", "total_s")})
                out[task.repo] = medians(timings)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=Path, default=ROOT / ".speedrun" / "tasks", help="a built task set")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--python", default=sys.executable, help="the tests' interpreter (sandbox.python)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "test_run_cost.json")
    args = p.parse_args()
    if not (args.tasks / "validation.jsonl").is_file() or not (args.tasks / "repos").is_dir():
        raise SystemExit(f"--tasks {args.tasks}: no task set there (build one with `grpo-fleet data build --out`)")
    tasks = one_per_repo(args.tasks)
    runner = asyncio.run(TrustedRunner.build(args.python, (), isolated=True,
                                             packages=SandboxConfig().runner_packages))
    per_repo: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="run-cost-trees-") as trees:
            for task in tasks:
                tree = Path(trees) / task.repo
                subprocess.run(["git", "clone", "-q", str(args.tasks / "repos" / f"{task.repo}.git"), str(tree)],
                               check=True, capture_output=True)
                subprocess.run(["git", "checkout", "-q", task.base_commit], cwd=tree, check=True, capture_output=True)
                cmd = pytest_command(task.test_command or "")
                if cmd is None:
                    raise SystemExit(f"{task.instance_id}: test_command is not of the task-set form")
                env = {**cmd.env, "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.environ.get("PATH", "")}
                files = [a for a in cmd.args if not a.startswith("-") and a.endswith(".py")]
                options = [a for a in cmd.args if a not in files]
                f2p = [probe(runner, tree, [*options, *task.fail_to_pass], env) for _ in range(args.reps)]
                full = [probe(runner, tree, cmd.args, env) for _ in range(args.reps)]
                per_repo[task.repo] = {"task": task.instance_id, "fail_to_pass": len(task.fail_to_pass),
                                       "f2p_only": medians(f2p), "whole_files": medians(full)}
                print(task.repo, json.dumps(per_repo[task.repo]), flush=True)
    finally:
        runner.remove()
    phases = asyncio.run(executor_phases(tasks, args.tasks / "repos", args.reps))
    for repo, ph in phases.items():
        per_repo[repo]["executor_gold"] = ph
    f2p_walls = [r["f2p_only"]["wall_s"] for r in per_repo.values()]
    imports = [r["f2p_only"]["import_s"] + r["f2p_only"]["start_s"] for r in per_repo.values()]
    result = {
        "tasks": str(args.tasks), "reps": args.reps, "repos": len(per_repo),
        "f2p_only_wall_s_median": round(statistics.median(f2p_walls), 4),
        "start_and_import_s_median": round(statistics.median(imports), 4),
        # What a runner importing pytest once would save of a first run, repository by repository, then the median.
        "start_and_import_share_median": round(statistics.median(i / w for i, w in zip(imports, f2p_walls,
                                                                                            strict=True)), 3),
        "executor_first_tests_s_median": round(statistics.median(r["executor_gold"]["first_tests_s"]
                                                                 for r in per_repo.values()), 4),
        "per_repo": per_repo,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "per_repo"}, indent=1))


if __name__ == "__main__":
    main()
