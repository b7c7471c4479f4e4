"""Runs the fleet's processes: prefixed logs (console + one file per process), readiness probes, restarts of
stateless services and of the embedded Redis (from its AOF), and an orderly stop (trainer first, so it can
checkpoint; then the services it used; Redis last)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from fleet.spawn import guarded
from launch.topology import ProcessSpec

log = logging.getLogger(__name__)

# An error line of the fleet's log format (fleet/logs.py): "HH:MM:SS [prefix] E logger: message".
_ERROR_LINE = re.compile(r"^\d\d:\d\d:\d\d (?:\[[^\]]*\] )?[EC] (.*)$")


class FleetFailed(RuntimeError):
    pass


async def exited(proc: asyncio.subprocess.Process) -> int:
    """The exit status of `proc`, as soon as the process itself exits. Not `proc.wait()`: asyncio finishes that only
    once the child's pipes close too, and processes it started (vLLM's `EngineCore`, a test's background job) hold
    them long after it died -- the supervisor then never saw a SIGKILLed rollout worker go. A pidfd is readable from
    the moment the process exits; without one (old kernels), the status asyncio's child watcher reaped is polled."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        gone: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not gone.done():
                gone.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await gone
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    while True:  # asyncio's child watcher reaps it a moment after the pidfd says so (or, without one, at all)
        if proc.returncode is not None:
            return proc.returncode
        await asyncio.sleep(0.02)


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process's session: each child leads its own (`start_new_session`), so whatever it
    started and left behind (engine cores, shells, test jobs) is in its group, and must not outlive it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], log_dir: Path, *, cwd: Path, max_restarts: int = 3,
                 ready_timeout_s: float = 180.0, echo: bool = True) -> None:
        self.specs = specs
        self.log_dir = log_dir
        self.cwd = cwd
        self.max_restarts = max_restarts
        self.ready_timeout_s = ready_timeout_s
        self.echo = echo
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in specs}
        self.started_at: dict[str, float] = {}
        self.exits: dict[str, list[tuple[float, int | None]]] = {s.name: [] for s in specs}
        self._pumps: list[asyncio.Task[None]] = []
        self._pump_of: dict[str, asyncio.Task[None]] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    async def _spawn(self, spec: ProcessSpec) -> asyncio.subprocess.Process:
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        # Children are in their own session (Ctrl-C must reach only the launcher, which stops them in order), so
        # their life is tied to the launcher's instead: a SIGKILLed launcher leaves no orphans behind.
        argv, hook = guarded(spec.argv, cpus=spec.cpus)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True, preexec_fn=hook,
        )
        self.procs[spec.name] = proc
        self.started_at[spec.name] = time.time()
        self._write_pids()
        self._pumps.append(asyncio.create_task(self._pump(spec.name, proc)))
        self._pump_of[spec.name] = self._pumps[-1]
        log.info("started %s (pid %d), log: %s", spec.name, proc.pid, self.log_path(spec.name))
        return proc

    def _write_pids(self) -> None:
        """RUN/logs/processes/pids.json: name -> pid of every process, for operators (and tests that kill one)."""
        pids = {name: p.pid for name, p in self.procs.items() if p.returncode is None}
        tmp = self.log_dir / ".pids.json.tmp"
        tmp.write_text(json.dumps(pids, indent=1))
        tmp.replace(self.log_dir / "pids.json")

    async def _pump(self, name: str, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        prefix = f"[{name}] "
        with self.log_path(name).open("ab") as out:
            while line := await proc.stdout.readline():
                out.write(line)
                out.flush()
                if self.echo:
                    sys.stdout.write(prefix + line.decode(errors="replace"))
                    sys.stdout.flush()

    async def _wait_ready(self, spec: ProcessSpec) -> None:
        if spec.ready is None:
            return
        deadline = time.monotonic() + self.ready_timeout_s
        proc = self.procs[spec.name]
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise FleetFailed(f"{spec.name} exited with {proc.returncode} before it was ready; "
                                  f"see {self.log_path(spec.name)}")
            if await probe(spec.ready):
                log.info("%s is ready", spec.name)
                return
            await asyncio.sleep(0.3)
        raise FleetFailed(f"{spec.name} not ready after {self.ready_timeout_s:.0f}s; see {self.log_path(spec.name)}")

    async def start_all(self) -> None:
        for spec in self.specs:
            await self._spawn(spec)
            await self._wait_ready(spec)

    async def watch(self, stop: asyncio.Event) -> int:
        """Until the trainer ends or `stop` is set. Returns the run's exit code."""
        by_name = {s.name: s for s in self.specs}
        while not stop.is_set():
            waits = {asyncio.create_task(exited(p)): n for n, p in self.procs.items()}
            stopper = asyncio.create_task(stop.wait())
            done, pending = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                if task is stopper:
                    continue
                name = waits[task]
                rc = self.procs[name].returncode
                spec = by_name[name]
                self.exits[name].append((time.time(), rc))
                # What it started dies with it (and so lets go of its pipe); its last lines still reach the log
                # before the log is read or reopened, but a pump that lags does not hold the restart back.
                kill_group(self.procs[name].pid)
                await asyncio.wait([self._pump_of[name]], timeout=5)
                if not spec.restartable:
                    if rc == 0:
                        log.info("%s finished", name)
                        return 0
                    print(f"\ngrpo-fleet: {name} failed with exit code {rc}; its log: {self.log_path(name)}"
                          f"{self._last_error(name)}\n  the launcher saw: {self.seen()}", file=sys.stderr)
                    return rc or 1
                if self.restarts[name] >= self.max_restarts:
                    print(f"\ngrpo-fleet: {name} died {self.restarts[name] + 1} times (last exit code {rc}); "
                          f"giving up; its log: {self.log_path(name)}{self._last_error(name)}", file=sys.stderr)
                    return 1
                self.restarts[name] += 1
                log.warning("%s exited with %s; restarting (%d/%d)", name, rc, self.restarts[name], self.max_restarts)
                await asyncio.sleep(min(5.0, 0.5 * 2 ** self.restarts[name]))
                await self._spawn(spec)
        return 0

    def seen(self) -> str:
        """What the launcher saw of every process, in one line (e.g. `rollout-0 up 312 s, restarted 1x (exit -9 at
        10:02:11)`): beside a failed trainer's last error, it tells a dead fleet from a wedged one."""
        parts = []
        for spec in self.specs:
            proc = self.procs.get(spec.name)
            if proc is None:
                parts.append(f"{spec.name} never started")
                continue
            state = (f"up {time.time() - self.started_at[spec.name]:.0f} s" if proc.returncode is None
                     else f"exited {proc.returncode}")
            exits = self.exits[spec.name][:-1] if proc.returncode is not None else self.exits[spec.name]
            if exits:
                at, last_rc = time.strftime("%H:%M:%S", time.localtime(exits[-1][0])), exits[-1][1]
                state += f", restarted {len(exits)}x (exit {last_rc} at {at})"
            parts.append(f"{spec.name} {state}")
        return "; ".join(parts)

    def _last_error(self, name: str) -> str:
        """The last error line of a process's log (as "\n  its last error: ...", or ""), so that the launcher's last
        words say why it failed (e.g. which dependency stayed down past services.outage_tolerance_s)."""
        try:
            with self.log_path(name).open("rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
                tail = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(tail):
            if m := _ERROR_LINE.match(line):
                return f"\n  its last error: {m.group(1)[:600]}"
        return ""

    async def stop_all(self, grace_s: float = 60.0) -> None:
        """Trainer first (SIGTERM -> it checkpoints and exits), then rollout workers, sandbox, replay buffer, and the
        embedded Redis last (SIGTERM: it flushes its AOF)."""
        order = [s.name for s in reversed(self.specs)]
        for name in order:
            proc = self.procs.get(name)
            if proc is None or proc.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(exited(proc), timeout=grace_s if name == "trainer" else 20.0)
            except TimeoutError:
                log.warning("%s did not stop in time; killing it", name)
                kill_group(proc.pid)
                await exited(proc)
            kill_group(proc.pid)  # anything it started and left behind
        await asyncio.gather(*self._pumps, return_exceptions=True)


async def probe(target: str) -> bool:
    """True when a service answers: an http(s) URL -> 200 from it; "host:port" -> gRPC health SERVING; the
    unix:// URL of an embedded Redis -> PONG (not while it replays its AOF)."""
    if target.startswith("unix://"):
        from services.replay_buffer.embedded import answers

        return await asyncio.to_thread(answers, target)
    if target.startswith("http"):
        import aiohttp

        try:
            async with aiohttp.ClientSession() as session, session.get(
                target, timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
    from grpc import aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with aio.insecure_channel(target) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
