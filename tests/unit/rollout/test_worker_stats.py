"""The worker's busy / idle clock (reported by GetStatus and the worker summary)."""

import pytest

from rollout import worker as worker_mod
from rollout.worker import WorkerStats


def test_busy_and_idle_split_the_time_after_the_first_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(worker_mod.time, "monotonic", lambda: now[0])
    s = WorkerStats(started_at=100.0)
    now[0] = 130.0  # joining: no weights yet, neither busy nor idle
    s.set_busy(False)  # first weights arrive, nothing leased yet
    now[0] = 132.0
    s.set_busy(True)  # leases taken
    now[0] = 142.0
    s.set_busy(False)  # last group submitted
    now[0] = 145.0
    summary = s.summary()
    assert (summary["busy_s"], summary["idle_s"]) == (10.0, 5.0)
