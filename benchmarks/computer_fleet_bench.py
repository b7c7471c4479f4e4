"""The computer-use path through the whole fleet: episodes/s and image bytes per step through the replay buffer.

    .venv/bin/python benchmarks/computer_fleet_bench.py             # 5 steps of grpo_computer_use_tiny.yaml
    .venv/bin/python benchmarks/computer_fleet_bench.py --steps 8

Runs `grpo-fleet up` (the tiny Qwen2-VL on vLLM CPU, Chromium in the local sandbox executor, async with in-flight
pushes) and reads the trainer's step metrics: episodes trained per second of steady state (from the end of step 0,
which includes the engine's start, to the end of the last step), screenshots and their PNG bytes per step (carried
inline in the trajectories, so exactly what crossed the replay buffer as images), image tokens per step, and the
pushes' pause. Writes `benchmarks/results/computer_fleet.json`. Screenshot latency per action is
`benchmarks/computer_bench.py`'s (the ENV side's benchmark).
"""

from __future__ import annotations

import argparse
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
from trainer.metrics import read_jsonl  # noqa: E402

CONFIG = "examples/configs/grpo_computer_use_tiny.yaml"


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "logs" / "metrics.jsonl")


def measure(steps: int, run_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "launch.cli", "up", "--config", CONFIG, f"run.dir={run_dir}",
           f"grpo.max_num_steps={steps}", "logger.tensorboard_enabled=false", "checkpointing.save_period=1000"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit((proc.stdout + proc.stderr)[-4000:])
    wall = time.time() - t0
    rows = _rows(run_dir)
    trained = [r for r in rows if "agent/episodes" in r]
    ends = {int(r["step"]): float(r["time"]) for r in trained}
    first, last = min(ends), max(ends)
    steady = [r for r in trained if int(r["step"]) > first]
    pushes = [r for r in rows if r.get("weights/workers_ok", 0) >= 1]
    per_step_bytes = [r["vision/image_bytes"] for r in trained]
    images = sum(r["vision/images"] for r in trained)
    return {
        "steps": len(trained), "wall_s": round(wall, 1), "first_step_end_s": round(ends[first] - t0, 1),
        "episodes_per_s": round(sum(r["agent/episodes"] for r in steady) / (ends[last] - ends[first]), 3),
        "image_bytes_per_step_mean": round(statistics.mean(per_step_bytes)),
        "image_bytes_per_step_max": round(max(per_step_bytes)),
        "images_per_step_mean": round(images / len(trained), 2),
        "bytes_per_image_mean": round(sum(per_step_bytes) / max(1, images)),
        "image_tokens_per_step_mean": round(statistics.mean(r["vision/image_tokens"] for r in trained), 1),
        "generated_tokens_per_episode": round(statistics.mean(r["agent/generated_tokens_mean"] for r in trained), 1),
        "turns_per_episode": round(statistics.mean(r["agent/turns_mean"] for r in trained), 2),
        "tool_error_rate": round(statistics.mean(r["agent/tool_error_rate"] for r in trained), 3),
        "push_pause_s_max": round(max((r["weights/max_pause_s"] for r in pushes), default=0.0), 3),
        "push_bytes": max((r["weights/bytes"] for r in pushes), default=0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "computer_fleet.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cu-fleet-") as tmp:
        figures = measure(args.steps, Path(tmp) / "run")
    result = {"config": CONFIG, "host": platform.node(), "cpus": os.cpu_count(),
              "load_avg_1m": round(os.getloadavg()[0], 1), **figures}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
