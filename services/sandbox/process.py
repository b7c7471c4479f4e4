"""Running one sandboxed command: streamed output capped while it is read, wall-clock kill of the process group.

Output is read in 64 KiB chunks and only the last `cap` bytes of each stream are kept, so a test printing 100 MB
costs the executor `cap` bytes of memory, not 100 MB. On timeout or cancellation the whole process group gets
SIGKILL; bwrap is its leader, and its pid namespace takes every process of the sandbox down with it (even ones that
left the group with setsid).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field

_CHUNK = 64 << 10
# After the command exits or is killed, how long its pipes may stay open (only possible without bwrap).
_DRAIN_GRACE_S = 2.0


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


async def _drain(stream: asyncio.StreamReader | None, sink: TailBuffer | HeadBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        sink.feed(chunk)


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


async def _open_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    return reader, transport


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
    child_fds = (*(() if status_fd is None else (status_fd,)), *((report.write_fd, *report.inherit) if report else ()))
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True, pass_fds=child_fds)
    except BaseException:
        if report:
            os.close(report.read_fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)  # ours only: the write ends must close when bwrap exits, or the reads never end
    readers = [asyncio.create_task(_drain(proc.stdout, out)), asyncio.create_task(_drain(proc.stderr, err))]
    transport = None
    if report and sink:
        stream, transport = await _open_reader(report.read_fd)
        readers.append(asyncio.create_task(_drain(stream, sink)))
    timed_out = False
    try:
        try:
            # In Python 3.11 wait() also waits for the pipes to close: with bwrap they close when its pid namespace
            # dies; without it, a daemon that kept them open makes this run count as a timeout.
            await asyncio.wait_for(proc.wait(), limit_s)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
        await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
    finally:
        if proc.returncode is None:  # killed but not yet reaped, or cancelled: never leave a sandbox behind
            _kill_group(proc)
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.shield(asyncio.wait_for(proc.wait(), _DRAIN_GRACE_S))
        for reader in readers:
            reader.cancel()
        if transport is not None:
            transport.close()
    return RunResult(proc.returncode, timed_out, True, out, err, time.monotonic() - t0, report=sink)
