"""Does the sandbox start cold in each process? The same rows' gold and empty patches graded in several passes by ONE
in-process executor (tree cache off, so every pass runs every test), each pass's wall time and phase medians.

The speedrun's first validation round of every call took ~40 s longer than the next one (docs/swe-learning.md,
"The fourteenth session"); if the executor paid a per-process warm-up (repositories, the test interpreter, its
imports), the first pass here would be the slow one. The page cache is the host's, shared by every process: run it
twice to see a warm host.

    .venv/bin/python benchmarks/sandbox_passes.py --data .speedrun --rows 40 --passes 3 --workers 2

Writes `benchmarks/results/sandbox_passes.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.registry import load_dataset  # noqa: E402
from envs.swe.paths import repos_dir  # noqa: E402
from fleet.config import load_config  # noqa: E402
from launch.data.gold import check_rows, pick_rows, run_times  # noqa: E402
from services.sandbox.executor import Executor  # noqa: E402


async def passes(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(None, ["data.train.dataset_name=swe_embedded", f"data.train.data_path={args.data / 'tasks'}",
                             f"data.train.split={args.split}", "sandbox.tree_cache_size=0"])
    dataset = load_dataset(cfg.data.train, env_cfg=cfg.env, seed=0)
    assert dataset.root is not None, "an embedded task set has a root"
    sandbox = cfg.sandbox.model_copy(update={"repos_root": str(repos_dir(dataset.root)), "pool_size": args.workers})
    tasks = pick_rows(list(dataset), args.rows)
    out: list[dict[str, Any]] = []
    async with Executor(sandbox) as ex:
        for i in range(args.passes):
            t0 = time.monotonic()
            rows = await check_rows(tasks, ex.run, concurrency=args.workers, timeout_s=cfg.env.code.task_timeout)
            wall = time.monotonic() - t0
            medians = {k: v["median"] for k, v in run_times(rows)["phases"].items()}
            out.append({"pass": i, "wall_s": round(wall, 2), "rows_ok": sum(r.ok for r in rows),
                        "phase_medians_s": medians})
            print(f"pass {i}: {len(rows)} rows (gold and empty) in {wall:.1f} s, {out[-1]['rows_ok']} ok, "
                  f"tests median {medians.get('tests_s', 0):.3f} s", flush=True)
    return {"host": {"cpus": os.cpu_count(), "machine": platform.machine()}, "split": args.split,
            "rows": len(tasks), "workers": args.workers, "passes": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT / ".speedrun", help="holds tasks/ (a built task set)")
    p.add_argument("--split", default="validation")
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sandbox_passes.json")
    args = p.parse_args()
    result = asyncio.run(passes(args))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
