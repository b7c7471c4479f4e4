"""Where the test suite's wall-clock goes (issue 38): `make test`'s pytest command run once with every test's start,
end and xdist worker recorded (tests/conftest.py, GRPO_FLEET_TEST_TIMELINE) and each core's busy share sampled from
/proc/stat, then summarised: the wall-clock, the busy share over the run and in its last minutes, each worker's
busy span and idle tail, the lanes (tests/conftest.py's `lane_of`) by their summed time, and the tests still running
when the first worker ran out of work. Writes benchmarks/results/suite_timeline.json and docs/img/suite_timeline.png.

    python benchmarks/suite_timeline.py [--workers auto] [-- extra pytest arguments, e.g. tests/unit]
    python benchmarks/suite_timeline.py --reuse     # summarise the last run's files again

Run it on a quiet machine: the suite is CPU-bound on two cores, so anything else running lengthens it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from conftest import lane_of  # noqa: E402

from benchmarks.core_usage import CoreSampler, idle_share, load_samples  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORK = Path("/tmp/grpo-fleet-suite-timeline")


def run_suite(workers: str, extra: list[str]) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    for name in ("timeline.jsonl", "cores.jsonl"):
        (WORK / name).unlink(missing_ok=True)
    env = {**os.environ, "GRPO_FLEET_TEST_TIMELINE": str(WORK / "timeline.jsonl"), "PYTHONDONTWRITEBYTECODE": ""}
    cmd = [sys.executable, "-m", "pytest", "-n", workers, "--dist", "loadscope", "--no-loadscope-reorder", "-q",
           "-p", "no:cacheprovider", *(extra or ["tests"])]
    sampler = CoreSampler(period=1.0, path=WORK / "cores.jsonl")
    sampler.start()
    t0 = time.time()
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    finally:
        sampler.stop()
    (WORK / "run.json").write_text(json.dumps({"cmd": cmd, "rc": rc, "start": t0, "end": time.time()}))


def summarise() -> dict[str, Any]:
    run = json.loads((WORK / "run.json").read_text())
    tests = [json.loads(line) for line in (WORK / "timeline.jsonl").read_text().splitlines() if line.strip()]
    samples = load_samples(WORK / "cores.jsonl")
    t0, t1 = run["start"], run["end"]

    def busy(a: float, b: float) -> float | None:
        idle = idle_share(samples, a, b)
        return round(1 - sum(idle) / len(idle), 3) if idle else None

    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in tests:
        by_worker[t["worker"]].append(t)
    workers = {w: {"first_start_s": round(min(t["start"] for t in ts) - t0, 1),
                   "last_end_s": round(max(t["end"] for t in ts) - t0, 1),
                   "tests": len(ts), "test_time_s": round(sum(t["end"] - t["start"] for t in ts), 1)}
               for w, ts in sorted(by_worker.items())}
    first_done = min(max(t["end"] for t in ts) for ts in by_worker.values())
    last_done = max(max(t["end"] for t in ts) for ts in by_worker.values())
    lanes: dict[str, float] = defaultdict(float)
    for t in tests:
        lanes[lane_of(t["test"])] += t["end"] - t["start"]
    tail = sorted((t for t in tests if t["end"] > first_done), key=lambda t: t["start"])
    return {
        "cmd": " ".join(run["cmd"][1:]), "rc": run["rc"], "wall_s": round(t1 - t0, 1), "tests": len(tests),
        "test_time_s": round(sum(t["end"] - t["start"] for t in tests), 1),
        "busy_share": busy(t0, t1),
        "tail": {"from_s": round(first_done - t0, 1), "to_s": round(last_done - t0, 1),
                 "busy_share": busy(first_done, last_done),
                 "tests": [{"test": t["test"], "worker": t["worker"], "start_s": round(t["start"] - t0, 1),
                            "s": round(t["end"] - t["start"], 1)} for t in tail]},
        "workers": workers,
        "lanes_s": dict(sorted(((k, round(v, 1)) for k, v in lanes.items()), key=lambda kv: -kv[1])[:25]),
        "slowest": [{"test": t["test"], "worker": t["worker"], "start_s": round(t["start"] - t0, 1),
                     "s": round(t["end"] - t["start"], 1)}
                    for t in sorted(tests, key=lambda t: t["start"] - t["end"])[:25]],
        "timeline": [[t["worker"], round(t["start"] - t0, 2), round(t["end"] - t0, 2), t["test"]] for t in tests],
        "busy_per_10s": [busy(a, a + 10) for a in range(int(t0), int(t1), 10)],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted(result["workers"])
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    colours = {"serial": "tab:red", "docker": "tab:blue"}
    for t_worker, start, end, test in result["timeline"]:
        lane = lane_of(test)
        ax.barh(workers.index(t_worker), end - start, left=start, height=0.6,
                color=colours.get(lane, "tab:green" if test.startswith("tests/integration") else "tab:gray"),
                edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(workers)), workers)
    ax.set_title(f"pytest {' '.join(result['cmd'].split()[2:])[:100]}: {result['wall_s']:.0f} s, {result['tests']} "
                 "tests\nred: e2e lane, blue: docker lane, green: integration, grey: unit", fontsize=10)
    busy = result["busy_per_10s"]
    bx.step([10 * i for i in range(len(busy))], [b if b is not None else 0 for b in busy], where="post")
    bx.set_ylim(0, 1.05)
    bx.set_ylabel("busy share")
    bx.set_xlabel("seconds from the start of pytest")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="auto", help="pytest-xdist's -n")
    p.add_argument("--reuse", action="store_true", help="summarise the last run's files, run nothing")
    p.add_argument("--out", default="suite_timeline", help="results/<out>.json and docs/img/<out>.png")
    p.add_argument("pytest_args", nargs="*", help="after --: what to run (default: tests)")
    args = p.parse_args()
    if not args.reuse:
        run_suite(args.workers, args.pytest_args)
    result = summarise()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, ROOT / "docs" / "img" / f"{args.out}.png")
    brief = {k: v for k, v in result.items() if k not in ("timeline", "busy_per_10s", "slowest")}
    brief["tail"] = {**result["tail"], "tests": result["tail"]["tests"][:15]}
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
