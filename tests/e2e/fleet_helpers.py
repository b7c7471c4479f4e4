"""Helpers of the end-to-end tests: the `grpo-fleet up` command line and the metrics it leaves behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fleet_cmd(run_dir: Path, tasks: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "fleet.cli", "up", "--config", "examples/configs/grpo_swe_tiny.yaml",
            f"run.dir={run_dir}", f"data.train.data_path={tasks}", "checkpointing.save_period=1",
            "grpo.num_prompts_per_step=2", "policy.train_global_batch_size=8", "policy.generation.max_new_tokens=48",
            "logger.tensorboard_enabled=false", *overrides]


def metrics(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
