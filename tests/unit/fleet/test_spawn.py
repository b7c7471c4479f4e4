"""`fleet.spawn.guarded`: children started while gRPC is busy all reach their command, die with their parent and
run on their cores."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from procs import alive

from fleet.spawn import guarded
from launch.supervisor import Supervisor
from launch.topology import ProcessSpec


def test_processes_the_launcher_spawns_while_probing_grpc_all_start(tmp_path: Path) -> None:
    # The race the launcher runs: health probes in flight while it starts processes. With a `preexec_fn` (a plain
    # fork running gRPC's fork handlers) about one child in eight died before exec here.
    core = min(os.sched_getaffinity(0))
    specs = [ProcessSpec(f"p{i}", "sandbox", [sys.executable, "-S", "-c", "import os; print(*os.sched_getaffinity(0))"],
                         restartable=False, cpus=[core]) for i in range(120)]
    sup = Supervisor(specs, tmp_path, cwd=tmp_path, echo=False)

    async def run() -> list[int]:
        server = aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)

        probes = [asyncio.create_task(probe()) for _ in range(4)]
        codes = []
        for spec in specs:
            codes.append(await (await sup._spawn(spec)).wait())
        stop.set()
        await asyncio.gather(*probes, *sup._pumps)
        await server.stop(None)
        return codes

    codes = asyncio.run(run())
    assert codes == [0] * len(specs), f"{sum(c != 0 for c in codes)} children died: {sorted(set(codes))}"
    assert {(tmp_path / f"{s.name}.log").read_text().strip() for s in specs} == {str(core)}


def test_a_guarded_child_gets_sigterm_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        from fleet.spawn import guarded
        argv, hook = guarded(["sleep", "60"])
        child = subprocess.Popen(argv, preexec_fn=hook)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=Path(__file__).parents[3])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.is_file() and pid_file.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the parent never started its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        # Popen returns once `setpriv` runs; it sets the death signal only then, and a parent killed before that
        # leaves an orphan (setpriv does not check getppid() after its prctl). The guard holds from `sleep` on.
        while _command(child) != "sleep":
            assert time.monotonic() < deadline and alive(child), f"child {child} never reached its command"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while alive(child):
            assert time.monotonic() < deadline, f"child {child} outlived its SIGKILLed parent"
            time.sleep(0.05)
    finally:
        proc.kill()


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("tool", ["setpriv", "taskset"])
def test_without_util_linux_the_settings_fall_back_to_a_hook_only_while_grpc_is_not_loaded(
        tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == tool else real(name))
    monkeypatch.delitem(sys.modules, "grpc", raising=False)
    argv, hook = guarded(["true"], cpus=[0])
    assert hook is not None and tool not in " ".join(argv)
    monkeypatch.setitem(sys.modules, "grpc", sys)
    argv, hook = guarded(["true"], cpus=[0])
    assert hook is None and argv[-1] == "true"

