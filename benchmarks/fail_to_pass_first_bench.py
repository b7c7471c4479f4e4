"""What `env.code.fail_to_pass_first` saves the sandbox on real answers: a model's logged held-out answers of the SWE
speedrun, graded by the in-process executor with and without the flag, in one sitting.

    .venv/bin/python benchmarks/fail_to_pass_first_bench.py \
        --report benchmarks/results/swe_speedrun/fourth_run/grpo_sync.json --data .speedrun --rounds 2

The answers are those of the report's first validation round (the SFT base's greedy answers, token ids decoded with
the speedrun's tokenizer); every answer that holds a diff is sent, and those whose patch applies run tests. Each round
grades every answer twice, once per setting, the order alternating between rounds so that load hits both alike;
`--pool` runs at a time, as the fleet's executor would. For every answer the two verdicts must agree on the
resolution and on the reward under `fail_to_pass` and `binary`; the results say where they do not. Writes
`benchmarks/results/fail_to_pass_first.json`.

`--tracebacks` adds a third setting, graded in the same rounds: the first run formatting its failing tests'
tracebacks as the task's command asks (`sandbox.first_run_tracebacks=true`, the behaviour before `--tb=no`), by a
second executor; its verdicts must agree too. Writes `benchmarks/results/first_run_tracebacks.json` by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.swe.patch import extract_patch  # noqa: E402
from envs.swe.payload import payload_to_spec, task_to_payload  # noqa: E402
from envs.swe.taskset import read_split  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402
from fleet.contracts.sandbox import TaskSpec, Verdict  # noqa: E402
from sandbox_client.reward import reward_from_verdict  # noqa: E402
from services.sandbox.executor import Executor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
from report import load_report  # noqa: E402

log = logging.getLogger("fail_to_pass_first_bench")


def answers(report: Path, data: Path, limit: int | None) -> list[tuple[str, dict[str, Any], str]]:
    """(task id, payload, patch) of the first round's answers that hold a patch, in the report's order."""
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(data / "corpus" / "tokenizer")
    tasks = {t.instance_id: t for split in ("train", "validation") for t in read_split(data / "tasks", split)}
    logged = load_report(report)["validation_tasks"][0]["answers"]
    out = []
    for task_id, ids in logged.items():
        extracted = extract_patch(str(tok.decode(ids, skip_special_tokens=True)))
        if extracted.ok:
            out.append((task_id, task_to_payload(tasks[task_id]), extracted.patch))
    return out[:limit]


async def grade_all(ex: Executor, specs: list[TaskSpec], pool: int) -> tuple[list[Verdict], float]:
    gate = asyncio.Semaphore(pool)

    async def one(spec: TaskSpec) -> Verdict:
        async with gate:
            return await ex.run(spec)

    t0 = time.perf_counter()
    verdicts = await asyncio.gather(*(one(s) for s in specs))
    return list(verdicts), time.perf_counter() - t0


def summary(verdicts: list[Verdict]) -> dict[str, Any]:
    tested = [v for v in verdicts if v.patch_applied]
    return {"answers": len(verdicts), "tests_ran": len(tested),
            "by_resolution": {r: sum(v.resolution == r for v in tested) for r in ("FULL", "PARTIAL", "NO")},
            "settled_by_first_run": sum("first_tests_s" in v.timings and "tests_s" not in v.timings
                                        for v in verdicts),
            "test_cases_run": sum(v.tests_passed + v.tests_failed for v in verdicts),
            "task_s_median": statistics.median(v.timings.get("total_s", 0.0) for v in tested) if tested else 0.0,
            # The fleet's step waits for its slowest verdict: the tail matters more than the median.
            "task_s_slowest": sorted((round(v.timings.get("total_s", 0.0), 2) for v in tested), reverse=True)[:5],
            "task_s_sum": sum(v.timings.get("total_s", 0.0) for v in tested),
            # Where a verdict's time goes: the tests' run(s) against the checkout, the patch and the grading.
            "phase_s_median": {k: statistics.median(v.timings.get(k, 0.0) for v in tested) if tested else 0.0
                               for k in ("checkout_s", "apply_s", "first_tests_s", "tests_s", "grade_s")}}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    found = answers(args.report, args.data, args.limit)
    log.info("%d answers hold a patch", len(found))
    specs = {flag: [payload_to_spec(p, patch, timeout=args.task_timeout, fail_to_pass_first=flag)
                    for _, p, patch in found] for flag in (False, True)}
    # setting -> (first_run_tracebacks of its executor, fail_to_pass_first of its specs)
    settings = {"full": (False, False), "first": (False, True)}
    if args.tracebacks:
        settings["first_tracebacks"] = (True, True)
    with tempfile.TemporaryDirectory(prefix="f2p-first-") as work:
        def config(tracebacks: bool) -> SandboxConfig:
            return SandboxConfig(pool_size=args.pool, work_root=f"{work}/{int(tracebacks)}",
                                 repos_root=str(args.data / "tasks" / "repos"), max_timeout_s=args.task_timeout,
                                 first_run_tracebacks=tracebacks)
        rounds: list[dict[str, Any]] = []
        last: dict[str, list[Verdict]] = {}
        async with Executor(config(False)) as ex, Executor(config(True)) as ex_tb:
            executors = {False: ex, True: ex_tb}
            for e in executors.values():  # warm: the runner folders, the page cache
                await grade_all(e, specs[True][:args.pool], args.pool)
            names = list(settings)
            for r in range(args.rounds):
                row: dict[str, Any] = {}
                for name in names[r % len(names):] + names[:r % len(names)]:  # each setting leads a round in turn
                    tracebacks, first = settings[name]
                    last[name], wall = await grade_all(executors[tracebacks], specs[first], args.pool)
                    row[name] = {"wall_s": wall, **summary(last[name])}
                    log.info("round %d %s: %.1f s", r, name, wall)
                rounds.append(row)
    disagreements = []
    for i, (task_id, _, _) in enumerate(found):
        grades = {name: (v[i].status, v[i].resolution, reward_from_verdict(v[i], "fail_to_pass"),
                         reward_from_verdict(v[i])) for name, v in last.items()}
        if len(set(grades.values())) > 1:
            disagreements.append({"task": task_id, **grades})
    walls = {k: [row[k]["wall_s"] for row in rounds] for k in settings}
    medians = {k: statistics.median(v) for k, v in walls.items()}
    result = {"report": str(args.report), "pool": args.pool, "rounds": rounds, "disagreements": disagreements,
              "wall_s_median": medians, "speedup": medians["full"] / medians["first"],
              "host": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    if args.tracebacks:
        result["tracebacks_speedup"] = medians["first_tracebacks"] / medians["first"]
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, required=True, help="a speedrun grpo_<mode>.json with logged answers")
    p.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="DATA/tasks and DATA/corpus/tokenizer")
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="grade only the first N answers that hold a patch")
    p.add_argument("--task-timeout", type=float, default=120.0)
    p.add_argument("--tracebacks", action="store_true",
                   help="also grade with the first run formatting tracebacks (sandbox.first_run_tracebacks)")
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/fail_to_pass_first.json, "
                   "or first_run_tracebacks.json with --tracebacks")
    args = p.parse_args(argv)
    if args.out is None:
        name = "first_run_tracebacks.json" if args.tracebacks else "fail_to_pass_first.json"
        args.out = ROOT / "benchmarks" / "results" / name
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("services.sandbox.executor").setLevel(logging.WARNING)
    arguments = parse()
    result = asyncio.run(main(arguments))
    arguments.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("wall_s_median", "speedup", "tracebacks_speedup") if k in result}),
          len(result["disagreements"]), "disagreements")
