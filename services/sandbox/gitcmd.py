"""git as the executor runs it: no host configuration or hooks, a time limit, output read up to a cap, and the
parsing of what git prints about patches (paths of `--numstat`, renames, C-quoted names)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.sandbox.process import kill_and_reap

GIT_TIMEOUT_S = 120.0
# No user/system config: hooks, aliases or fsmonitor settings of the host must not run or change behaviour here.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
}
_GIT_OPTS = ("-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false")


@dataclass
class GitResult:
    code: int
    out: str
    err: str


async def git(*args: str, cwd: Path | None = None, stdin: bytes | None = None,
              prefix: Sequence[str] = ()) -> GitResult:
    return await run_tool("git", *_GIT_OPTS, *args, cwd=cwd, stdin=stdin, prefix=prefix)


async def run_tool(*argv: str, cwd: Path | None = None, stdin: bytes | None = None,
                   prefix: Sequence[str] = ()) -> GitResult:
    """`argv` (git, or GNU patch in the apply chain) in git's clean environment, under `prefix` (rlimits), with
    git's time limit."""
    proc = await asyncio.create_subprocess_exec(
        *prefix, *argv, cwd=cwd, env=_GIT_ENV, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), GIT_TIMEOUT_S)
    except BaseException:
        if proc.returncode is None:
            await kill_and_reap(proc)
        raise
    return GitResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


async def git_capped(*args: str, cwd: Path, cap: int) -> GitResult | None:
    """`git` whose output is read only up to `cap` bytes: None, and git killed, if it had more (a diff of a tree
    the agent filled is never held whole in the executor's memory)."""
    proc = await asyncio.create_subprocess_exec(
        "git", *_GIT_OPTS, *args, cwd=cwd, env=_GIT_ENV, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    err_task = asyncio.ensure_future(proc.stderr.read(64 << 10))
    out = bytearray()

    async def read() -> bool:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(1 << 20):
            out.extend(chunk)
            if len(out) > cap:
                return False
        return True

    try:
        whole = await asyncio.wait_for(read(), GIT_TIMEOUT_S)
        if not whole:
            return None
        await asyncio.wait_for(proc.wait(), GIT_TIMEOUT_S)
        err = await err_task
    finally:
        err_task.cancel()  # kill_and_reap reads stderr to its end itself
        await asyncio.gather(err_task, return_exceptions=True)
        await kill_and_reap(proc)  # at once for a process that exited and was read to the end
    return GitResult(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def parse_numstat(out: str) -> list[str]:
    """Paths from `git apply --numstat -z` (for a rename or copy, only its destination)."""
    return [fields[2] for token in out.split("\0") if len(fields := token.split("\t", 2)) == 3 and fields[2]]


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def unquote_git_path(text: str) -> str:
    """Undo git's C-style quoting of a path (`"tab\\there"`, octal bytes for non-ASCII)."""
    if not (len(text) >= 2 and text[0] == text[-1] == '"'):
        return text
    out, body, i = bytearray(), text[1:-1], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 4 <= len(body):
                out.append(int(body[i + 1:i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_C_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode(errors="surrogateescape")


def rename_sources(text: str) -> list[str]:
    """Source paths of renames and copies in a git patch: `--numstat` reports only their destination."""
    prefixes = ("rename from ", "copy from ")
    return [unquote_git_path(line[len(p):]) for line in text.splitlines() for p in prefixes if line.startswith(p)]
