"""A session inside a task's instance image (`spec.image`), on the executor's image runtime (bwrap-image or docker).

The session holds one environment of the runtime open for its whole life (`runtime.environment(ref)`: the image's
rootfs under a fresh writable layer, or a container), prepared as a graded task's is: `/testbed` at `base_commit`
with every later commit scrubbed (`contract.prepare_history`), then the task's `setup_patch` made the only commit.
Commands, file reads and writes, and the final diff all run *inside* that environment, as the image's own tools
(`sh`, `cat`, `git`) -- with the runtime's isolation and limits (no network, prlimit and a cgroup, or the
container's) -- so nothing the agent plants (a symlink, a git hook or config, a fake `git`) can reach the host.

The diff is computed by the session's own git, which the agent controls, and that is fine: whatever text comes
out is only a *patch*, graded by `Executor.run` in a fresh environment of the image exactly like a submitted one
(history scrubbed, the integrity check, the task's test patch and eval script). A forged diff is a patch the agent
could have submitted anyway. Removing the session leaves the environment (the layer is removed, the container too);
what a killed executor left is swept by the runtime when the next one starts (its layers, its owner-labelled
containers).
"""

from __future__ import annotations

import contextlib
import shlex
import uuid

from fleet.contracts.sandbox import TaskSpec
from fleet.contracts.swe_eval import WORKDIR
from services.sandbox.executor import Executor
from services.sandbox.images import contract
from services.sandbox.images.pull import PullError
from services.sandbox.images.runtime import IO_DIR, ImageEnv
from services.sandbox.images.service import ImageTasks
from services.sandbox.process import RunResult
from services.sandbox.sessions.diff import SessionDiff, graded_paths, pathspecs
from services.sandbox.sessions.files import PathRefused, tree_parts
from services.sandbox.workspace import InfraError

_GIT = "git -c safe.directory=* -c core.hooksPath=/dev/null -c core.fsmonitor=false"
_STEP_S = 120.0
# Commands of the agent run without writing bytecode, as on the host path; caches never belong in the diff.
_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
_EXCLUDE = "':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/.pytest_cache/**'"
_READ = ('f=$1; [ -L "$f" ] && exit 4; [ -e "$f" ] || exit 2; [ -f "$f" ] || exit 3; '
         'wc -c < "$f" && head -c "$2" "$f"')
_WRITE = ('f=$1; [ -L "$f" ] && exit 4; [ -d "$f" ] && exit 3; d=$(dirname -- "$f"); '
          'mkdir -p -- "$d" && cat -- "$2" > "$f"')


class ImageSessionError(Exception):
    """The image environment could not be made or prepared: infrastructure (the pull, the runtime, the image)."""


async def start_image_session(executor: Executor, spec: TaskSpec) -> ImageSession:
    """A started session environment for `spec`; ImageSessionError when the executor has no image runtime (as
    for a graded image task: infrastructure, the caller goes elsewhere) or the image cannot be prepared."""
    if executor.images is None:
        why = executor.image_error or "sandbox.runtime is bwrap (host interpreter only)"
        raise ImageSessionError(f"image {spec.image}: {why}")
    session = ImageSession(executor.images, spec)
    await session.start()
    return session


class ImageSession:
    """One session's environment. `await start()`, then exec / read / write / diff, `await close()`."""

    def __init__(self, images: ImageTasks, spec: TaskSpec) -> None:
        assert spec.image is not None
        self.images, self.spec = images, spec
        self.env: ImageEnv | None = None
        self.commit = ""
        self._stack = contextlib.AsyncExitStack()
        # A docker exec cannot be killed alone (the runtime kills the container on a timeout): the command gets
        # coreutils' `timeout` inside, and the runtime's own limit is only a backstop.
        self._inner_timeout = images.runtime.name == "docker"

    async def start(self) -> None:
        try:
            ref = self.images.ref(self.spec.image or "")
            self.env = await self._stack.enter_async_context(self.images.runtime.environment(ref))
            await contract.prepare_history(self.env, self.spec.base_commit)
            if self.spec.setup_patch:
                await contract.apply_setup(self.env, self.spec.setup_patch)
            head = await self._sh(f"cd {WORKDIR} && {_GIT} rev-parse HEAD")
            if head.exit_code != 0:
                raise InfraError(f"image {ref}: no commit at {WORKDIR}: {head.stderr.text()[-300:]}")
            self.commit = head.stdout.text().strip()
        except (PullError, InfraError, ValueError, OSError) as exc:
            await self.close()
            raise ImageSessionError(str(exc)) from exc
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self.env = None
        await self._stack.aclose()

    def _live(self) -> ImageEnv:
        if self.env is None:
            raise InfraError("the session's image environment is closed")
        return self.env

    async def _sh(self, script: str, *args: str, limit_s: float = _STEP_S, cap: int | None = None) -> RunResult:
        return await self._live().exec(["/bin/sh", "-c", script, "sh", *args], limit_s=limit_s, output_cap=cap,
                                       env=_ENV)

    async def exec(self, command: str, *, limit_s: float, output_cap: int) -> RunResult:
        if not self._inner_timeout:
            return await self._live().exec(["/bin/sh", "-c", command], limit_s=limit_s, output_cap=output_cap,
                                           env=_ENV)
        argv = ["timeout", "-s", "KILL", f"{limit_s:g}", "/bin/sh", "-c", command]
        result = await self._live().exec(argv, limit_s=limit_s + 10, output_cap=output_cap, env=_ENV)
        if result.exit_code == 137 and result.wall_s >= limit_s:
            result.timed_out, result.exit_code = True, None
        return result

    async def read_file(self, rel: str, limit: int) -> tuple[bytes, int]:
        path = "/".join(tree_parts(rel))
        result = await self._sh(f"cd {WORKDIR} && {_READ}", path, str(limit), cap=limit + 64)
        code = result.exit_code
        if code == 2:
            raise FileNotFoundError(rel)
        if code in (3, 4):
            raise PathRefused(f"path: {rel!r} is {'a symlink' if code == 4 else 'not a regular file'}")
        out = result.stdout.text()
        if code != 0 or "\n" not in out:
            raise InfraError(f"reading {rel!r} in the session failed (exit {code}): {result.stderr.text()[-300:]}")
        size, _, content = out.partition("\n")
        return content.encode(), int(size.strip() or 0)

    async def write_file(self, rel: str, data: bytes) -> None:
        path = "/".join(tree_parts(rel))
        name = f"w-{uuid.uuid4().hex}"
        env = self._live()
        env.put(name, data.decode(errors="replace"))
        result = await self._sh(f"cd {WORKDIR} && {_WRITE}", path, f"{IO_DIR}/{name}")
        if result.exit_code in (3, 4):
            raise PathRefused(f"path: {rel!r} is a symlink or a folder")
        if result.exit_code != 0:
            raise PathRefused(f"path: {rel!r} cannot be written: {result.stderr.text().strip()[-300:]}")

    async def diff(self, max_bytes: int) -> SessionDiff:
        """The diff against the session's starting commit without its test files (diff.py), or why it
        cannot be graded."""
        add = f"cd {WORKDIR} && {_GIT} add --all --force -- . {_EXCLUDE} && "
        names = await self._sh(add + f"{_GIT} diff --cached --name-only -z --no-renames {shlex.quote(self.commit)}")
        if names.timed_out or names.exit_code != 0:
            why = "took too long" if names.timed_out else f"failed: {names.stderr.text().strip()[-300:]}"
            return SessionDiff(problem=f"reading the session's changes {why}")
        kept, dropped = graded_paths(names.stdout.text().split("\0"), self.spec.test_patch,
                                     self.spec.task_paths)
        if not kept:
            return SessionDiff(dropped=dropped)
        paths = " ".join(shlex.quote(p) for p in pathspecs(kept))
        result = await self._sh(f"cd {WORKDIR} && {_GIT} diff --cached --binary --no-renames "
                                f"{shlex.quote(self.commit)} -- {paths}", cap=max_bytes + 1)
        if result.timed_out or result.exit_code != 0:
            return SessionDiff(problem=f"the session's diff failed: {result.stderr.text().strip()[-300:]}")
        if result.stdout.total > max_bytes:
            return SessionDiff(problem=f"the session's diff is larger than sandbox.sessions.max_diff_kb="
                               f"{max_bytes >> 10}")
        return SessionDiff(result.stdout.text(), dropped=dropped)
