"""The supervisor sees a child's exit from the process itself, not from its pipes: a SIGKILLed service whose own
children hold its stdout (vLLM's EngineCore under a rollout worker) is restarted within seconds, and what it left
behind dies with it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from procs import alive

from launch.supervisor import Supervisor
from launch.topology import ProcessSpec

# A service that starts a helper holding its stdout, as vLLM's engine processes do, then serves forever.
SERVICE = ("import subprocess, sys, time\n"
           "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
           "print('HELPER', helper.pid, flush=True)\n"
           "time.sleep(600)\n")



def _helper_pids(log: Path) -> list[int]:
    text = log.read_text() if log.exists() else ""
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("HELPER")]


async def _helper_pid(log: Path, nth: int) -> int:
    for _ in range(200):
        pids = _helper_pids(log)
        if len(pids) >= nth:
            return pids[nth - 1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no HELPER line {nth} in {log}")


async def test_a_killed_service_is_restarted_within_seconds_and_its_orphans_are_killed(tmp_path: Path) -> None:
    sup = Supervisor([ProcessSpec("worker", "rollout", [sys.executable, "-c", SERVICE])], tmp_path / "logs",
                     cwd=tmp_path, echo=False)
    await sup.start_all()
    stop = asyncio.Event()
    watch = asyncio.create_task(sup.watch(stop))
    try:
        first_pid, helper = sup.procs["worker"].pid, await _helper_pid(sup.log_path("worker"), 1)
        os.kill(first_pid, signal.SIGKILL)  # the main pid only: the helper still holds the pipe
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _helper_pid(sup.log_path("worker"), 2)
        assert loop.time() - t0 < 5.0, "the restart waited for the pipe, not the process"
        assert sup.procs["worker"].pid != first_pid and sup.restarts["worker"] == 1
        assert not alive(helper), "the killed service's helper outlived it"
    finally:
        stop.set()
        await watch
        await sup.stop_all(grace_s=5)
    assert all(not alive(p.pid) for p in sup.procs.values())


async def test_a_failed_trainer_is_reported_with_what_the_launcher_saw_of_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = "import time; time.sleep(4); raise SystemExit(3)"
    sup = Supervisor([ProcessSpec("worker", "rollout", [sys.executable, "-c", SERVICE]),
                      ProcessSpec("trainer", "trainer", [sys.executable, "-c", trainer], restartable=False)],
                     tmp_path / "logs", cwd=tmp_path, echo=False)
    await sup.start_all()
    watch = asyncio.create_task(sup.watch(asyncio.Event()))
    try:
        await _helper_pid(sup.log_path("worker"), 1)
        os.kill(sup.procs["worker"].pid, signal.SIGKILL)
        assert await asyncio.wait_for(watch, 30) == 3
    finally:
        await sup.stop_all(grace_s=5)
    err = capsys.readouterr().err
    assert "trainer failed with exit code 3" in err, err
    assert re.search(r"the launcher saw: worker up \d+ s, restarted 1x \(exit -9 at [\d:]{8}\); trainer exited 3",
                     err), err
