"""Running one sandboxed command: streamed output capped while it is read, wall-clock kill of the process group.

Output is read in chunks and only the last `cap` bytes of each stream are kept, so a test printing 100 MB costs the
executor `cap` bytes of memory, not 100 MB. On timeout or cancellation the whole process group gets SIGKILL; bwrap is
its leader, and its pid namespace takes every process of the sandbox down with it (even ones that left the group with
setsid).

Why the pipes are polled (`_Drain`) rather than read on readiness: the runner writes one small record per test phase
and pytest one progress write per test (unbuffered), ~1,800 writes for a 455-test suite. A reader waiting on the pipe
is woken by every one of them, and on our 2-core VMs each wake-up (a cross-CPU interrupt) cost the test process ~40 us:
+50 ms per task, more than the whole sandbox. So the pipes are not in the event loop's epoll set at all: every
`_TICK_S` one timer reads whatever pooled in their (enlarged) buffers, at once again while a stream fills its buffer,
every millisecond once the process has exited (until EOF). Nothing is lost: what a killed process wrote stays in the
pipe until read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

_CHUNK = 256 << 10
# After the command exits or is killed, how long its pipes may stay open (only possible without bwrap).
_DRAIN_GRACE_S = 2.0
_TICK_S = 0.02
_EXITED_TICK_S = 0.001
_PIPE_BYTES = 1 << 20  # 20 ms of a fast writer; the kernel allocates pages only as they fill
_BURST = 128 << 10  # a read this large: the writer is streaming, read again at once
_F_SETPIPE_SZ = 1031


class TailBuffer:
    """The last `cap` bytes of a stream, and how many bytes went through."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes | memoryview) -> None:
        self.total += len(chunk)
        self._buf += chunk[-self.cap:]
        if len(self._buf) > self.cap:
            del self._buf[: len(self._buf) - self.cap]

    def text(self) -> str:
        return self._buf.decode(errors="replace")


class HeadBuffer:
    """The first `cap` bytes of a stream (a report is read from its start), and whether there was more."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self.data = bytearray()

    def feed(self, chunk: bytes | memoryview) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def overflow(self) -> bool:
        return self.total > self.cap


@dataclass
class RunResult:
    exit_code: int | None
    timed_out: bool
    started: bool
    """bwrap reported the sandboxed child as started (always True without bwrap)."""
    stdout: TailBuffer
    stderr: TailBuffer
    wall_s: float
    status: list[dict[str, object]] = field(default_factory=list)
    report: HeadBuffer | None = None
    """What the test process wrote on the report pipe (when one was given)."""


class _Drain:
    """Polls a run's pipes (non-blocking) into their sinks until each reaches EOF or `close()`; see the module
    docstring for why they are polled."""

    def __init__(self, pipes: list[tuple[int, TailBuffer | HeadBuffer]]) -> None:
        self.open = dict(pipes)
        for fd in self.open:
            os.set_blocking(fd, False)
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self._interval = _TICK_S
        self._buf = memoryview(bytearray(_CHUNK))
        self._timer: asyncio.Handle | None = self.loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        busy = False
        for fd, sink in list(self.open.items()):
            got, eof = _read_available(fd, sink, self._buf)
            busy = busy or got >= _BURST
            if eof:
                del self.open[fd]
                os.close(fd)
        if not self.open:
            self._timer = None
            self._finish()
        elif busy:  # the writer is streaming: keep up with it
            self._timer = self.loop.call_soon(self._tick)
        else:
            self._timer = self.loop.call_later(self._interval, self._tick)

    def exited(self) -> None:
        """The process is gone: read what it left now, and poll for EOF (which follows at once with bwrap)."""
        self._interval = _EXITED_TICK_S
        if self._timer is not None:
            self._timer.cancel()
            self._tick()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fd in self.open:
            os.close(fd)
        self.open.clear()
        self._finish()


def _read_available(fd: int, sink: TailBuffer | HeadBuffer, buf: memoryview) -> tuple[int, bool]:
    """(bytes read, EOF reached) from a non-blocking pipe, reading until it is empty. Into `buf`: `os.read` would
    allocate (and on most ticks free unused) a chunk-sized buffer per call, the larger part of a tick's cost."""
    got = 0
    try:
        while n := os.readv(fd, [buf]):
            sink.feed(buf[:n])
            got += n
    except BlockingIOError:
        return got, False
    except OSError:
        return got, True
    return got, True


def open_pipe() -> tuple[int, int]:
    """(read, write) of a pipe enlarged to `_PIPE_BYTES`, so that a trickling writer never waits for a tick."""
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError):  # a smaller pipe (an unprivileged user's quota) only means more wake-ups
        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    return read_fd, write_fd


async def kill_and_reap(proc: asyncio.subprocess.Process, grace_s: float = _DRAIN_GRACE_S) -> None:
    """SIGKILL `proc` (started with asyncio pipes) and wait until it is reaped, reading and dropping what its pipes
    still hold. On Python 3.11 `Process.wait()` returns only once every pipe has closed, and a pipe whose reader
    stopped reading with its buffer full (the transport paused) does not read its end: a `wait()` after the kill of
    a process whose output was cut short can wait for ever (a session's finish did, in CI). Nobody may be reading
    `proc`'s streams (cancel and await such readers first). Gives up after `grace_s` if a child of `proc` still
    holds a pipe; the exit is recorded (`proc.returncode`) all the same."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()

    async def drop(stream: asyncio.StreamReader) -> None:
        while await stream.read(1 << 16):
            pass

    streams = [s for s in (proc.stdout, proc.stderr) if s is not None]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(drop(s) for s in streams), proc.wait()), grace_s)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_status(fd: int) -> list[dict[str, object]]:
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    docs: list[dict[str, object]] = []
    decoder = json.JSONDecoder()
    text, pos = data.decode(errors="replace"), 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


class Guard(Protocol):
    """Something that watches a started run and may end it (`watchdog.WatchedRun`; a cgroup needs nothing here)."""

    def attach(self, pid: int, kill: Callable[[], None]) -> None: ...

    def detach(self) -> None: ...


@dataclass
class ReportPipe:
    """A pipe the test process writes its report on, read while it runs, plus fds the child only reads (a key
    pipe). `run_limited` closes all of them."""

    read_fd: int
    write_fd: int
    cap: int
    inherit: tuple[int, ...] = ()


async def run_limited(argv: list[str], *, env: dict[str, str], cwd: str, limit_s: float, output_cap: int,
                      status_pipe: tuple[int, int] | None = None, report: ReportPipe | None = None,
                      guard: Guard | None = None) -> RunResult:
    """Run `argv` to completion or for `limit_s` seconds of wall-clock time.

    `status_pipe` is the (read, write) pipe of bwrap's --json-status-fd; this function closes both ends, and every fd
    of `report`. `guard` is attached to the started process and may kill its group.
    """
    try:
        result = await _run(argv, env, cwd, limit_s, output_cap, status_pipe[1] if status_pipe else None, report,
                            guard)
        if status_pipe:
            result.status = _read_status(status_pipe[0])
            result.started = any("child-pid" in doc for doc in result.status)
        return result
    finally:
        if status_pipe:
            os.close(status_pipe[0])


async def _run(argv: list[str], env: dict[str, str], cwd: str, limit_s: float, output_cap: int,
               status_fd: int | None, report: ReportPipe | None, guard: Guard | None) -> RunResult:
    out, err = TailBuffer(output_cap), TailBuffer(output_cap)
    sink = HeadBuffer(report.cap) if report else None
    (out_read, out_write), (err_read, err_write) = open_pipe(), open_pipe()
    child_fds = (*(() if status_fd is None else (status_fd,)), *((report.write_fd, *report.inherit) if report else ()))
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_write, stderr=err_write, env=env, cwd=cwd,
            start_new_session=True, pass_fds=child_fds)
    except BaseException:
        for fd in (out_read, *((report.read_fd,) if report else ())):
            os.close(fd)
        os.close(err_read)
        raise
    finally:
        for fd in (out_write, err_write, *child_fds):
            os.close(fd)  # ours only: the write ends must close when bwrap exits, or the reads never end
    drain = _Drain([(out_read, out), (err_read, err), *([(report.read_fd, sink)] if report and sink else [])])
    timed_out = False
    if guard is not None:
        guard.attach(proc.pid, lambda: _kill_group(proc))
    try:
        try:
            await asyncio.wait_for(proc.wait(), limit_s)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
        drain.exited()
        # With bwrap the pipes close when its pid namespace dies; without it, a daemon may keep them open.
        await asyncio.wait([drain.done], timeout=_DRAIN_GRACE_S)
    finally:
        if proc.returncode is None:  # killed but not yet reaped, or cancelled: never leave a sandbox behind
            _kill_group(proc)
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.shield(asyncio.wait_for(proc.wait(), _DRAIN_GRACE_S))
        drain.close()
        if guard is not None:
            guard.detach()
    return RunResult(proc.returncode, timed_out, True, out, err, time.monotonic() - t0, report=sink)
