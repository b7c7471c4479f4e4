"""A small asyncio client of the Chrome DevTools Protocol over `--remote-debugging-pipe`.

Chromium reads commands on its fd 3 and writes answers and events on its fd 4, each message one JSON document ended
by a NUL byte. No TCP port is opened, so the renderer's network namespace can stay empty. Page-level commands carry
the `sessionId` of the flattened target session they are for (`Target.attachToTarget(flatten=true)`).

Every failure of the channel itself -- the pipe closed (the process exited), a write that fails, a command with no
answer within its time limit, an `Inspector.targetCrashed` event -- is `RendererGone`: the renderer, not the agent,
failed. A command the browser answers with an error is `CdpError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_MAX_MESSAGE = 64 << 20  # a screenshot is tens of KiB; anything near this is a broken renderer


class RendererGone(Exception):
    """The renderer process exited, closed its pipe, crashed or stopped answering: an infrastructure failure."""


class CdpError(Exception):
    """A command the browser answered with an error."""


class CdpPipe:
    """The two pipe ends of one browser. `await start()`, then `await call(method, params, session=...)`."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []
        self._writer: asyncio.WriteTransport | None = None
        self._read_transport: asyncio.BaseTransport | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.gone: str | None = None
        """Why the channel is dead (None while it works)."""
        self.on_gone: Callable[[str], None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_MAX_MESSAGE)
        self._read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                               os.fdopen(self._read_fd, "rb", 0))
        self._writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(self._write_fd, "wb", 0))
        self._reader_task = asyncio.create_task(self._read_loop(reader), name="cdp-reader")

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        why = "the renderer closed its DevTools pipe (process exited)"
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\0")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError:
                    why = f"a DevTools message larger than {_MAX_MESSAGE} bytes"
                    break
                self._dispatch(json.loads(raw[:-1]))
        except (OSError, ValueError) as exc:
            why = f"the DevTools pipe failed: {type(exc).__name__}: {exc}"
        self.fail(why)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            future = self._pending.pop(int(msg["id"]), None)
            if future is not None and not future.done():
                future.set_result(msg)
            return
        method, session = msg.get("method", ""), msg.get("sessionId")
        if method in ("Inspector.targetCrashed", "Target.targetCrashed"):
            self.fail(f"the page crashed ({method})")
            return
        for entry in list(self._waiters):
            name, want, future = entry
            if name == method and (want is None or want == session) and not future.done():
                future.set_result(msg.get("params", {}))
                self._waiters.remove(entry)

    def fail(self, why: str) -> None:
        """Mark the channel dead: every pending command and event wait raises RendererGone(why)."""
        if self.gone is not None:
            return
        self.gone = why
        for future in [*self._pending.values(), *(f for _, _, f in self._waiters)]:
            if not future.done():
                future.set_exception(RendererGone(why))
        self._pending.clear()
        self._waiters.clear()
        if self.on_gone is not None:
            self.on_gone(why)

    def expect(self, method: str, *, session: str | None = None) -> asyncio.Future[dict[str, Any]]:
        """A future for the next `method` event (register it before the command that causes the event)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self.gone is not None:
            future.set_exception(RendererGone(self.gone))
        else:
            self._waiters.append((method, session, future))
        return future

    async def call(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
                   limit_s: float = 10.0) -> dict[str, Any]:
        """The `result` of one command; RendererGone if the channel dies or no answer comes within `limit_s`."""
        if self.gone is not None or self._writer is None:
            raise RendererGone(self.gone or "the DevTools pipe is not open")
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        try:
            self._writer.write(json.dumps(msg).encode() + b"\0")
        except (OSError, RuntimeError) as exc:
            self.fail(f"writing to the DevTools pipe failed: {exc}")
        try:
            answer = await asyncio.wait_for(future, limit_s)
        except TimeoutError:
            self.fail(f"{method} got no answer within {limit_s:g} s (renderer hung)")
            raise RendererGone(self.gone or "renderer hung") from None
        finally:
            self._pending.pop(msg["id"], None)
        if "error" in answer:
            err = answer["error"]
            raise CdpError(f"{method}: {err.get('message', err)} ({err.get('data', '')})".rstrip(" ()"))
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def close(self) -> None:
        self.fail("closed")
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader_task is not None:
            self._reader_task.cancel()
            # gather, not a suppressed await: a cancellation of the caller itself must still go through.
            await asyncio.gather(self._reader_task, return_exceptions=True)
            self._reader_task = None
        if self._read_transport is not None:
            self._read_transport.close()
            self._read_transport = None
