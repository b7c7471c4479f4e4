"""What a service starts dies with it when only the service's own pid is SIGKILLed: a multiprocessing child (how vLLM
starts its EngineCore), a process that left the group (`setsid`, as `bwrap --new-session` does) and a grandchild
behind a shell -- and, when the service leads its process group, even a child started a moment before the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from procs import alive

ROOT = Path(__file__).resolve().parents[3]

SERVICE = """
import multiprocessing, os, subprocess, sys, time
from fleet.lifeline import hold_descendants

def engine():
    time.sleep(600)

if __name__ == "__main__":
    hold_descendants()
    core = multiprocessing.get_context("spawn").Process(target=engine)
    core.start()
    setsid = subprocess.Popen(["sleep", "601"], start_new_session=True)
    shell = subprocess.Popen(["sh", "-c", "sleep 602 & wait"])
    time.sleep(float(sys.argv[1]))  # long enough for the guard to have noted them
    late = subprocess.Popen(["sleep", "603"])
    print("PIDS", core.pid, setsid.pid, shell.pid, late.pid, flush=True)
    time.sleep(600)
"""


def _children(pid: int) -> set[int]:
    """Every descendant of `pid` now (by parent links)."""
    table = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                table[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in table.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def _run_service(tmp_path: Path, *, own_group: bool, settle_s: float) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    proc = subprocess.Popen([sys.executable, str(script), str(settle_s)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=own_group,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
    return proc, [int(p) for p in line.split()[1:]]


def _wait_gone(pids: set[int], timeout_s: float = 5.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_sigkill_of_a_group_leading_service_kills_everything_it_started(tmp_path: Path) -> None:
    proc, (core, setsid, shell, late) = _run_service(tmp_path, own_group=True, settle_s=2.5)
    everything = _children(proc.pid) | {core, setsid, shell, late}
    assert len(everything) >= 6, everything  # the four, the shell's sleep, the guard (and spawn's tracker)
    os.kill(proc.pid, signal.SIGKILL)  # the main pid only
    proc.wait(5)
    assert not _wait_gone(everything), "processes outlived their SIGKILLed service"
    assert "lifeline: process" in proc.stderr.read()  # type: ignore[union-attr]


def test_a_service_that_does_not_lead_its_group_still_takes_what_it_started(tmp_path: Path) -> None:
    # In the test's own process group: the guard must not signal the group (it holds pytest too), only what the
    # service started before its last scan.
    proc, (core, setsid, shell, _late) = _run_service(tmp_path, own_group=False, settle_s=2.5)
    time.sleep(1.5)  # the guard has noted the late child too by now
    noted = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)
    assert not _wait_gone(noted | {core, setsid, shell}), "processes outlived their SIGKILLed service"


def test_a_service_that_exits_on_its_own_leaves_nothing_behind(tmp_path: Path) -> None:
    proc, pids = _run_service(tmp_path, own_group=True, settle_s=1.5)
    time.sleep(1.2)
    everything = _children(proc.pid) | set(pids)
    proc.terminate()  # SIGTERM: the service exits at once, without stopping its children
    proc.wait(5)
    assert not _wait_gone(everything)
