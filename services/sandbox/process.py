"""Running one sandboxed command: streamed output capped while it is read, wall-clock kill of the process group.

Output is read in chunks and only the last `cap` bytes of each stream are kept, so a test printing 100 MB costs the
executor `cap` bytes of memory, not 100 MB. On timeout or cancellation the whole process group gets SIGKILL; bwrap is
its leader, and its pid namespace takes every process of the sandbox down with it (even ones that left the group with
setsid).

Why the pipes are read in ticks (`_PipeReader`) rather than on every readiness: the runner writes one small record per
test phase and pytest one progress write per test (unbuffered), ~1,800 writes for a 455-test suite. A reader blocked
on the pipe is woken by every one of them, and on our 2-core VMs each wake-up (a cross-CPU interrupt) cost the test
process ~40 us: +50 ms per task, more than the whole sandbox. So a pipe that has just been read is left alone for
`_TICK_S` while its data pools in the (enlarged) pipe buffer; a stream that fills its buffer is read continuously, and
at exit everything is read at once. Nothing is lost: what a killed process wrote stays in the pipe until read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from dataclasses import dataclass, field

_CHUNK = 1 << 20
# After the command exits or is killed, how long its pipes may stay open (only possible without bwrap).
_DRAIN_GRACE_S = 2.0
_TICK_S = 0.02
_PIPE_BYTES = 1 << 20  # 20 ms of a fast writer; the kernel allocates pages only as they fill
_BURST = 128 << 10  # a read this large: the writer is streaming, read again at once
_F_SETPIPE_SZ = 1031


class TailBuffer:
    """The last `cap` bytes of a stream, and how many bytes went through."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
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

    def feed(self, chunk: bytes) -> None:
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


class _PipeReader:
    """Reads one pipe to EOF into `sink`, woken at most once per `_TICK_S` while the writer trickles (see the module
    docstring); `exited()` reads what is there at once and from then on reads on every readiness."""

    def __init__(self, fd: int, sink: TailBuffer | HeadBuffer) -> None:
        self.fd, self.sink = fd, sink
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._immediate = False
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._ready)

    def _ready(self) -> None:
        self.loop.remove_reader(self.fd)
        self._timer = None
        got = 0
        try:
            while chunk := os.read(self.fd, _CHUNK):
                self.sink.feed(chunk)
                got += len(chunk)
            self._finish()  # EOF
            return
        except BlockingIOError:
            pass
        except OSError:
            self._finish()
            return
        if self._immediate or got >= _BURST:
            self.loop.add_reader(self.fd, self._ready)
        else:
            self._timer = self.loop.call_later(_TICK_S, self.loop.add_reader, self.fd, self._ready)

    def exited(self) -> None:
        self._immediate = True
        if self._timer is not None:
            self._timer.cancel()
            self._ready()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.loop.remove_reader(self.fd)
        self._finish()
        os.close(self.fd)


def open_pipe() -> tuple[int, int]:
    """(read, write) of a pipe enlarged to `_PIPE_BYTES`, so that a trickling writer never waits for a tick."""
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError):  # a smaller pipe (an unprivileged user's quota) only means more wake-ups
        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    return read_fd, write_fd


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


@dataclass
class ReportPipe:
    """A pipe the test process writes its report on, read while it runs, plus fds the child only reads (a key
    pipe). `run_limited` closes all of them."""

    read_fd: int
    write_fd: int
    cap: int
    inherit: tuple[int, ...] = ()


async def run_limited(argv: list[str], *, env: dict[str, str], cwd: str, limit_s: float, output_cap: int,
                      status_pipe: tuple[int, int] | None = None, report: ReportPipe | None = None) -> RunResult:
    """Run `argv` to completion or for `limit_s` seconds of wall-clock time.

    `status_pipe` is the (read, write) pipe of bwrap's --json-status-fd; this function closes both ends, and every fd
    of `report`.
    """
    try:
        result = await _run(argv, env, cwd, limit_s, output_cap, status_pipe[1] if status_pipe else None, report)
        if status_pipe:
            result.status = _read_status(status_pipe[0])
            result.started = any("child-pid" in doc for doc in result.status)
        return result
    finally:
        if status_pipe:
            os.close(status_pipe[0])


async def _run(argv: list[str], env: dict[str, str], cwd: str, limit_s: float, output_cap: int,
               status_fd: int | None, report: ReportPipe | None) -> RunResult:
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
    readers = [_PipeReader(out_read, out), _PipeReader(err_read, err)]
    if report and sink:
        readers.append(_PipeReader(report.read_fd, sink))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), limit_s)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
        for reader in readers:
            reader.exited()
        # With bwrap the pipes close when its pid namespace dies; without it, a daemon may keep them open.
        await asyncio.wait([r.done for r in readers], timeout=_DRAIN_GRACE_S)
    finally:
        if proc.returncode is None:  # killed but not yet reaped, or cancelled: never leave a sandbox behind
            _kill_group(proc)
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.shield(asyncio.wait_for(proc.wait(), _DRAIN_GRACE_S))
        for reader in readers:
            reader.close()
    return RunResult(proc.returncode, timed_out, True, out, err, time.monotonic() - t0, report=sink)
