"""A rollout worker with the vLLM engine, run by hand (no launcher: nothing else would clean up after it), leaves no
process behind: SIGKILL of its main pid alone takes its `VLLM::EngineCore` with it, and a dead EngineCore makes the
worker exit non-zero (so that whatever supervises it restarts it) instead of idling registered. Leftovers are found
by session (the test starts the worker as a session leader), never by command line: vLLM renames its processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
ENGINE_START_S = 300  # a vLLM start on a loaded 2-core CI box


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _session(sid: int) -> dict[int, str]:
    """pid -> cmdline of every live process of session `sid`."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out[int(name)] = cmdline
    return out


def _start_worker(tmp_path: Path) -> subprocess.Popen[bytes]:
    dead = _dead_port()  # no buffer, no Redis, no sandbox: the worker waits for them (an outage) and keeps serving
    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [sys.executable, "-m", "launch.cli", "serve", "rollout", "--config", "examples/configs/grpo_swe_tiny.yaml",
         f"run.dir={tmp_path / 'run'}", f"services.replay_buffer.port={dead}", "services.rollout.port=0",
         f"redis.url=redis://127.0.0.1:{dead}/0", f"env.code.sandbox_urls=[http://127.0.0.1:{dead}]"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


def _engine_core(proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + ENGINE_START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        cores = [pid for pid, cmd in _session(proc.pid).items() if cmd.startswith("VLLM::EngineCore")]
        if cores and "listening on" in log.read_text(errors="replace"):  # the engine is up and the worker serves
            return cores[0]
        time.sleep(0.5)
    raise AssertionError("no VLLM::EngineCore within the start budget:\n" + log.read_text(errors="replace")[-4000:])


def _gone(sid: int, timeout_s: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _cleanup(proc: subprocess.Popen[bytes]) -> None:
    """Only what this test started: the worker's session (a failing test must not leave an engine running)."""
    for pid in _session(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(10)


def test_sigkill_of_the_workers_main_pid_alone_takes_its_vllm_engine_with_it(tmp_path: Path) -> None:
    proc = _start_worker(tmp_path)
    try:
        core = _engine_core(proc, tmp_path / "worker.log")
        assert len(_session(proc.pid)) >= 3, _session(proc.pid)  # worker, lifeline, EngineCore (and its helpers)
        os.kill(proc.pid, signal.SIGKILL)  # the main pid only, as `kill -9 PID` does
        t0 = time.monotonic()
        proc.wait(10)
        left = _gone(proc.pid, timeout_s=10)
        print(f"\nworker SIGKILLed: its session was empty after {time.monotonic() - t0:.2f} s")
        assert not left, f"outlived the SIGKILLed worker: {left}"
        assert core not in _session(proc.pid)
    finally:
        _cleanup(proc)


def test_a_worker_whose_engine_core_died_exits_non_zero_and_leaves_nothing(tmp_path: Path) -> None:
    proc = _start_worker(tmp_path)
    try:
        core = _engine_core(proc, tmp_path / "worker.log")
        os.kill(core, signal.SIGKILL)
        t0 = time.monotonic()
        rc = proc.wait(60)
        print(f"\nEngineCore SIGKILLed: the worker exited {rc} after {time.monotonic() - t0:.2f} s")
        text = (tmp_path / "worker.log").read_text(errors="replace")
        assert rc != 0, text[-4000:]
        assert "engine core is dead" in text, text[-4000:]
        assert not _gone(proc.pid, timeout_s=10)
    finally:
        _cleanup(proc)
