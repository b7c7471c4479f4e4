"""benchmarks/core_usage.py: each core's idle share, over a run and per training step, from /proc/stat readings."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import core_usage  # noqa: E402


def test_a_reading_has_every_online_core_with_idle_within_its_total() -> None:
    cores = core_usage.read_proc_stat()
    assert len(cores) >= len(os.sched_getaffinity(0))
    assert all(0 <= idle <= total for idle, total in cores)


def test_idle_share_is_idle_jiffies_over_all_jiffies_between_the_nearest_readings() -> None:
    # Core 0 busy the whole second, core 1 idle for 75 of its 100 jiffies; a reading at 0.4 s sits between.
    samples = [(100.0, [(10, 100), (10, 100)]), (100.4, [(10, 140), (40, 140)]), (101.0, [(10, 200), (85, 200)])]
    assert core_usage.idle_share(samples, 100.0, 101.0) == [0.0, 0.75]
    assert core_usage.idle_share(samples, 100.05, 100.45) == [0.0, 0.75]  # snapped to the readings at 100.0, 100.4
    assert core_usage.idle_share(samples, 90.0, 101.0) is None  # before the first reading: not covered


def test_step_report_splits_the_window_at_each_steps_metrics_record(tmp_path: Path) -> None:
    # Step 1 (100 -> 102): core 1 idle throughout; step 2 (102 -> 104): both busy. Validation rows are not steps.
    # Core 0 is busy all along.
    samples = [(100.0 + t, [(0, 100 * t), (min(t, 2) * 100, 100 * t)]) for t in range(5)]
    rows = [{"step": 0, "time": 100.0, "reward/mean": 0.1}, {"step": 0, "time": 101.0, "val/accuracy": 0.2},
            {"step": 1, "time": 102.0, "reward/mean": 0.2}, {"step": 2, "time": 104.0, "reward/mean": 0.3}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = core_usage.step_report(samples, path)  # type: ignore[arg-type]
    assert report["steps_measured"] == 2
    assert report["window_idle"] == [0.0, 0.5]
    assert report["step_idle_mean"] == [0.0, 0.5]
    assert report["step_busy_cores_median"] == 1.5  # one core busy in step 1, both in step 2


def test_the_sampler_thread_writes_readings_it_can_load_back(tmp_path: Path) -> None:
    sampler = core_usage.CoreSampler(period=0.05, path=tmp_path / "cores.jsonl")
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    loaded = core_usage.load_samples(tmp_path / "cores.jsonl")
    assert len(loaded) >= 3
    assert [t for t, _ in loaded] == sorted(t for t, _ in loaded)
    assert [cores for _, cores in loaded] == [cores for _, cores in sampler.samples]


def test_a_fleet_report_reads_the_hosts_busy_cores_over_the_steps_of_its_own_call(tmp_path: Path) -> None:
    from gpu_fleet_swe import host_cores

    sampler = core_usage.CoreSampler(period=0.05)
    sampler.start()
    time.sleep(0.1)
    t0 = time.time()
    time.sleep(0.4)
    sampler.stop()
    # An earlier call's step (before the first reading), then two steps of this call.
    rows = [{"step": 1, "time": t0 - 3600, "reward/mean": 0.0}, {"step": 2, "time": t0, "reward/mean": 0.1},
            {"step": 3, "time": t0 + 0.2, "reward/mean": 0.2}, {"step": 4, "time": t0 + 0.4, "reward/mean": 0.3}]
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = host_cores(tmp_path, sampler.samples)
    assert report["steps_measured"] == 2
    assert 0.0 <= report["step_busy_cores_median"] <= len(sampler.samples[0][1])
    assert host_cores(tmp_path, []) == {}
