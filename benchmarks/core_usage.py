"""How busy each core was, from /proc/stat (issue 35: the idle share of each core per training step).

A `CoreSampler` thread reads every core's jiffies once per `period`; `idle_share` turns two readings into each core's
idle fraction over the time between them (idle + iowait over all jiffies, steal included in the total: a core the
hypervisor took away was not ours to use either). `step_report` does it per training step, a step being the interval
between two consecutive `reward/mean` records of a run's metrics.jsonl (the fleet's and the TRL peer's), and
summarises the median and mean over the steps. Readings are matched to the nearest sample, so with period 0.5 s a
3 s step is resolved to about a sixth of itself.

    python benchmarks/core_usage.py RUN_DIR SAMPLES.jsonl   # a run already made, against a sampler's file
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

Reading = tuple[float, list[tuple[int, int]]]  # (time.time(), per core (idle jiffies, all jiffies))


def read_proc_stat() -> list[tuple[int, int]]:
    cores = []
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                vals = [int(v) for v in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
                cores.append((vals[3] + vals[4], sum(vals)))
    return cores


class CoreSampler(threading.Thread):
    def __init__(self, period: float = 0.5, path: Path | None = None) -> None:
        super().__init__(daemon=True)
        self.period, self.path = period, path
        self.samples: list[Reading] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        out = self.path.open("a") if self.path else None
        try:
            while not self._stop_event.is_set():
                reading = (time.time(), read_proc_stat())
                self.samples.append(reading)
                if out:
                    out.write(json.dumps(reading) + "\n")
                    out.flush()
                self._stop_event.wait(self.period)
        finally:
            if out:
                out.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def load_samples(path: Path) -> list[Reading]:
    return [(float(t), [tuple(c) for c in cores])
            for t, cores in (json.loads(line) for line in path.read_text().splitlines() if line.strip())]


def _nearest(samples: list[Reading], t: float) -> Reading:
    times = [s[0] for s in samples]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return samples[0]
    if i == len(samples):
        return samples[-1]
    return samples[i] if samples[i][0] - t < t - samples[i - 1][0] else samples[i - 1]


def idle_share(samples: list[Reading], t0: float, t1: float) -> list[float] | None:
    """Each core's idle fraction between t0 and t1 (None when the samples do not cover the interval)."""
    if not samples or t0 < samples[0][0] - 1 or t1 > samples[-1][0] + 1:
        return None
    a, b = _nearest(samples, t0), _nearest(samples, t1)
    if b[0] <= a[0]:
        return None
    out = []
    for (idle0, all0), (idle1, all1) in zip(a[1], b[1], strict=True):
        total = all1 - all0
        out.append((idle1 - idle0) / total if total > 0 else 0.0)
    return out


def step_report(samples: list[Reading], metrics_path: Path) -> dict[str, Any]:
    """Per-core idle share of the whole training window and of each step (median, mean, per step), and the median
    step's busy cores."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    ends = sorted(float(r["time"]) for r in rows if "reward/mean" in r)
    if len(ends) < 2:
        return {}
    # Steps the readings cover: a resumed run's metrics also hold the earlier calls' steps.
    covered = [(a, b, s) for a, b in zip(ends, ends[1:], strict=False)
               if (s := idle_share(samples, a, b)) is not None]
    if not covered:
        return {}
    per_step = [s for _, _, s in covered]
    whole = idle_share(samples, covered[0][0], covered[-1][1])
    if whole is None:
        return {}
    cores = len(per_step[0])
    return {"window_idle": [round(x, 3) for x in whole],
            "step_idle_median": [round(statistics.median(s[c] for s in per_step), 3) for c in range(cores)],
            "step_idle_mean": [round(statistics.fmean(s[c] for s in per_step), 3) for c in range(cores)],
            # Cores at work in a step, all together: whether a step left cores for more work at once.
            "step_busy_cores_median": round(statistics.median(sum(1 - x for x in s) for s in per_step), 2),
            "steps_measured": len(per_step)}


if __name__ == "__main__":
    run_dir, sample_file = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(step_report(load_samples(sample_file), run_dir / "logs/metrics.jsonl"), indent=1))
