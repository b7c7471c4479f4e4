"""What `sandbox.tree_cache_size` spares the sandbox on real answers: every logged held-out answer of the SWE
speedrun's reports (all validation rounds, in order), graded by the in-process executor with and without the cache,
in one sitting.

    .venv/bin/python benchmarks/tree_cache_bench.py --data .speedrun \
        --report benchmarks/results/swe_speedrun/thirteenth_run/grpo_sync.json \
        --report benchmarks/results/swe_speedrun/thirteenth_run/grpo_async.json

Answers are decoded with the speedrun's tokenizer and sent as the fleet sends them (`fail_to_pass_first`). Identical
specs are sent once in both settings, as the rollout worker's verdict cache (`env.code.verdict_cache_size`) would
already answer them, so what the tree cache adds is counted alone. Each round grades the answers once per setting,
each setting leading a round in turn, the cached one on a fresh executor (an empty cache). For every answer the two
verdicts must agree on the resolution and on the reward under `fail_to_pass` and `binary`; the results say where they
do not. Held-out answers of several rounds are one greedy answer per task per round, not the 16 samples of a
training group: the rate here is a floor for training. Writes `benchmarks/results/tree_cache.json`.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))

from fail_to_pass_first_bench import grade_all  # noqa: E402
from report import load_report  # noqa: E402

from envs.swe.patch import extract_patch  # noqa: E402
from envs.swe.payload import payload_to_spec, task_to_payload  # noqa: E402
from envs.swe.taskset import read_split  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402
from fleet.contracts.sandbox import TaskSpec, Verdict  # noqa: E402
from rollout.scoring import VerdictCache  # noqa: E402
from sandbox_client.reward import reward_from_verdict  # noqa: E402
from services.sandbox.executor import Executor  # noqa: E402

log = logging.getLogger("tree_cache_bench")


def round_specs(reports: list[Path], data: Path, timeout: float) -> tuple[list[TaskSpec], int]:
    """The specs of every validation round's answers that hold a patch, round by round; and how many answers the
    rounds logged in all."""
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(data / "corpus" / "tokenizer")
    tasks = {t.instance_id: t for split in ("train", "validation") for t in read_split(data / "tasks", split)}
    specs, logged = [], 0
    for report in reports:
        for rnd in load_report(report)["validation_tasks"]:
            for task_id, ids in rnd["answers"].items():
                logged += 1
                extracted = extract_patch(str(tok.decode(ids, skip_special_tokens=True)))
                if extracted.ok:
                    specs.append(payload_to_spec(task_to_payload(tasks[task_id]), extracted.patch, timeout=timeout,
                                                 fail_to_pass_first=True))
    return specs, logged


async def main(args: argparse.Namespace) -> dict[str, Any]:
    specs, logged = round_specs(args.report, args.data, args.task_timeout)
    unique = list({VerdictCache.key(s): s for s in specs}.values())
    log.info("%d answers logged, %d hold a patch, %d distinct specs", logged, len(specs), len(unique))
    rounds: list[dict[str, Any]] = []
    last: dict[str, list[Verdict]] = {}
    stats: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="tree-cache-") as work:
        def config(size: int, r: int) -> SandboxConfig:
            return SandboxConfig(pool_size=args.pool, work_root=f"{work}/{size}-{r}", tree_cache_size=size,
                                 repos_root=str(args.data / "tasks" / "repos"), max_timeout_s=args.task_timeout)
        names = ["uncached", "cached"]
        for r in range(args.rounds):
            row: dict[str, Any] = {}
            for name in names[r % 2:] + names[:r % 2]:
                async with Executor(config(len(unique) if name == "cached" else 0, r)) as ex:
                    last[name], wall = await grade_all(ex, unique, args.pool)
                    if ex.trees is not None:
                        stats = ex.trees.stats()
                tested = [v for v in last[name] if "first_tests_s" in v.timings or "tests_s" in v.timings]
                row[name] = {"wall_s": wall, "test_runs": len(tested),
                             **({"tree_cache": stats} if name == "cached" else {})}
                log.info("round %d %s: %.1f s, %d verdicts ran tests", r, name, wall, len(tested))
            rounds.append(row)
    disagreements = []
    for i, spec in enumerate(unique):
        grades = {name: (v[i].status, v[i].resolution, reward_from_verdict(v[i], "fail_to_pass"),
                         reward_from_verdict(v[i])) for name, v in last.items()}
        if len(set(grades.values())) > 1:
            disagreements.append({"repo": spec.repo_url, "base_commit": spec.base_commit, **grades})
    key_s = [v.timings["tree_key_s"] for v in last["cached"] if "tree_key_s" in v.timings]
    walls = {k: statistics.median(row[k]["wall_s"] for row in rounds) for k in names}
    return {"reports": [str(p) for p in args.report], "pool": args.pool, "answers_logged": logged,
            "answers_with_patch": len(specs), "distinct_specs": len(unique),
            "tests_ran_uncached": rounds[-1]["uncached"]["test_runs"], "tree_cache": stats,
            "tree_key_s_median": statistics.median(key_s) if key_s else 0.0,
            "wall_s_median": walls, "speedup": walls["uncached"] / walls["cached"], "rounds": rounds,
            "disagreements": disagreements,
            "host": {"cpus": os.cpu_count(), "python": platform.python_version()}}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, action="append", required=True,
                   help="a speedrun grpo_<mode>.json with logged answers (repeat for several)")
    p.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="DATA/tasks and DATA/corpus/tokenizer")
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--task-timeout", type=float, default=20.0, help="the speedrun's env.code.task_timeout")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tree_cache.json")
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("services").setLevel(logging.WARNING)
    a = parse()
    out = asyncio.run(main(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
