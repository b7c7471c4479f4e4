"""Helpers of the end-to-end tests: the `grpo-fleet up` command line and the metrics it leaves behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fleet_cmd(run_dir: Path, tasks: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "launch.cli", "up", "--config", "examples/configs/grpo_swe_tiny.yaml",
            f"run.dir={run_dir}", f"data.train.data_path={tasks}", "checkpointing.save_period=1",
            "grpo.num_prompts_per_step=2", "policy.train_global_batch_size=8", "policy.generation.max_new_tokens=48",
            "logger.tensorboard_enabled=false", *overrides]


def metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of RUN/logs/metrics.jsonl written whole so far: tests read it while the trainer appends, and a row
    without its newline yet is half written (a chaos run's watcher once died on one: `Unterminated string`)."""
    path = run_dir / "logs" / "metrics.jsonl"
    if not path.exists():
        return []
    *whole, _ = path.read_text().split("\n")  # the piece after the last newline: empty, or still being written
    return [json.loads(line) for line in whole if line.strip()]


def pids(run_dir: Path) -> dict[str, int]:
    """name -> pid of every process the launcher runs now (its RUN/logs/processes/pids.json)."""
    path = run_dir / "logs" / "processes" / "pids.json"
    try:
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):  # not written yet, or being replaced
        return {}


def step_times(run_dir: Path) -> dict[int, float]:
    """Optimizer step -> wall time (time.time()) at which its metrics row, the end of the step, was written."""
    return {int(r["step"]): float(r["time"]) for r in metrics(run_dir) if any(k.startswith("loss/") for k in r)}


def trained_groups(run_dir: Path) -> list[dict[str, object]]:
    """Every `{step, epoch, groups}` record the trainer wrote, in order (logs/trained_groups.jsonl)."""
    path = run_dir / "logs" / "trained_groups.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def buffer_accounting(run_dir: Path) -> dict[str, int]:
    """Open the run's embedded Redis (AOF) after the fleet stopped; assert the buffer's accounting invariant holds and
    return the number of groups in each state."""
    import asyncio

    from redis.asyncio import Redis

    from services.replay_buffer.embedded import start_embedded_redis
    from services.replay_buffer.store import ReplayStore, StoreSettings

    async def read() -> dict[str, int]:
        url, handle = start_embedded_redis(run_dir / "redis")
        client = Redis.from_url(url)
        try:
            acc = await ReplayStore(client, StoreSettings()).accounting()
            assert acc.violations == [], acc.violations
            return dict(acc.by_state)
        finally:
            await client.aclose()
            handle.stop()

    return asyncio.run(read())
