"""Interactive sandbox sessions: a tree of a task's repository at `base_commit` that an agent runs commands in and
edits, graded on `finish` exactly like a submitted patch (test files left out: diff.py). A task with an
`image` gets its instance image's environment instead, with the same bounds and grading (image.py).

- **Start**: the repository is checked out as for a task (alternates, ~20 ms), but its git metadata lives beside the
  tree (`root/git`), never inside it: the sandboxed commands see the files of `base_commit` and nothing else (no
  other commit, no fix). The tree belongs to the session's own uid (a range claimed next to the executor's slots),
  so sessions cannot touch each other's files and each has its own `RLIMIT_NPROC`.
- **Exec**: `sh -c COMMAND` in the tree, inside the same bwrap sandbox and limits as a task's tests
  (`Executor.run_in_tree`), one command at a time per session, with a wall-clock limit; the output is capped.
  Every command carries an idempotency key: a retried request gets the first run's result (or waits for it), a
  command is never run twice. Each command is a fresh process: the tree persists, the shell's state does not.
- **Finish**: the tree's diff against `base_commit` is graded by `Executor.run` in a fresh tree, with the integrity
  check and the task's test patch: nothing done to the session's tests or runner can count.
- **Bounds and ownership**: at most `max_sessions`; a session goes when its owner stops renewing (`lease_s`), when
  it is idle (`idle_timeout_s`) or old (`max_lifetime_s`), and when the executor stops -- the registry every
  session kind shares (`registry.py`). A new executor process removes the trees of a dead one (a flock
  marks the live ones), so nothing outlives its executor.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.config.infra import SandboxSessionConfig
from fleet.contracts.sandbox import TaskSpec, Verdict, check_spec
from services.sandbox.bwrap import UidRange
from services.sandbox.executor import Executor
from services.sandbox.fstree import remove_tree
from services.sandbox.gitcmd import git, git_capped
from services.sandbox.repos import RepoNotFound, resolve_repo
from services.sandbox.sessions.diff import SessionDiff, graded_paths, pathspecs
from services.sandbox.sessions.files import read_tree_file, remove_dead_session_dirs, write_tree_file
from services.sandbox.sessions.image import ImageSession, ImageSessionError, start_image_session
from services.sandbox.sessions.registry import (
    SessionError,
    SessionInfraError,
    SessionNotFound,
    SessionRecord,
    SessionRegistry,
)
from services.sandbox.workspace import InfraError, Workspace

log = logging.getLogger(__name__)
_KEYS_KEPT = 64


@dataclass
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Session(SessionRecord):
    spec: TaskSpec
    root: Path
    uid: int | None
    commit: str = ""
    execs: OrderedDict[str, asyncio.Future[ExecResult]] = field(default_factory=OrderedDict)
    image: ImageSession | None = None  # the task's instance image (image.py); None: a tree here
    finishing: asyncio.Future[dict[str, Any]] | None = None  # the one grading of its finish, once asked

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def git_dir(self) -> Path:
        return self.root / "git"

    def info(self) -> dict[str, Any]:
        return {"session_id": self.id, "owner": self.owner, "commit": self.commit,
                "age_s": round(time.monotonic() - self.created, 3), "idle_s": round(time.monotonic() - self.active, 3)}


class SessionManager(SessionRegistry[Session]):
    """The code sessions of one executor. `await start()`, then `open` / `exec` / files / `finish` / `delete`."""

    def __init__(self, executor: Executor, cfg: SandboxSessionConfig) -> None:
        super().__init__(cfg)
        self.executor, self.cfg = executor, cfg
        self._starting = 0
        self._uids: UidRange | None = None
        self._dir: Path | None = None
        self._lock_fd = -1

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.executor.start()
        root = self.executor.work_root
        assert root is not None
        remove_dead_session_dirs(root)
        self._dir = root / f"sessions-{uuid.uuid4().hex}"
        self._dir.mkdir(mode=0o711)
        self._lock_fd = os.open(self._dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ex_cfg = self.executor.cfg
        if os.geteuid() == 0 and ex_cfg.use_bwrap:
            # The executor's slots hold the first free range from uid_base; this claims the next one.
            self._uids = UidRange(ex_cfg.uid_base, self.cfg.max_sessions)
        self.start_reaper()

    async def close(self) -> None:
        await self.close_all()
        if self._dir is not None:
            await asyncio.to_thread(remove_tree, self._dir)
            self._dir = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self._uids is not None:
            self._uids.release()
            self._uids = None

    def health(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions), "max_sessions": self.cfg.max_sessions,
                "sessions_reaped": dict(self.reaped)}

    # -- open / delete -------------------------------------------------------------------------------------------
    async def open(self, owner: str, spec: TaskSpec, request_id: str = "") -> Session:
        """A new session for `spec`'s task (its patch is ignored). A retried request (same owner and request_id)
        gets the session the first one made."""
        check_spec(spec)
        if not owner:
            raise SessionError("owner: is required (the caller's id; its lease keeps the session alive)",
                               field="owner")
        if (first := self.retried(owner, request_id)) is not None:
            return first
        assert self._dir is not None
        index = self.claim_slot(opening=self._starting)
        uid = self._uids.base + index if self._uids is not None else None
        session = Session(uuid.uuid4().hex, owner, spec, self._dir / uuid.uuid4().hex, uid, slot=index,
                          request_id=request_id)
        self._starting += 1
        try:
            await self._materialise(session)
        except BaseException:
            self.free_slot(index)
            await asyncio.to_thread(remove_tree, session.root)
            raise
        finally:
            self._starting -= 1
        self.add(session)
        return session
    async def _materialise(self, session: Session) -> None:
        if session.spec.image is not None:  # in the task's instance image, on the executor's image runtime
            try:
                session.image = await start_image_session(self.executor, session.spec)
            except ImageSessionError as exc:
                raise SessionInfraError(f"session could not be made: {exc}", infra=True) from exc
            session.commit = session.image.commit
            return
        try:
            repo = resolve_repo(session.spec.repo_url, self.executor.cfg)
            # On a tmpfs of tree_mb, as a task's tree (with the git metadata beside it): many files cannot fill the
            # host's disk, and `remove_tree` detaches it when the session goes.
            ws = Workspace(session.root, self.executor.tree_limits)
            session.commit = await ws.checkout(repo, session.spec.base_commit)
            # The git metadata moves out of the tree: the sandboxed commands see base_commit's files only.
            os.rename(ws.tree / ".git", session.git_dir)
            await asyncio.to_thread(ws.seal, session.uid)
        except (InfraError, RepoNotFound, OSError) as exc:
            raise SessionInfraError(f"session could not be made: {exc}", infra=True) from exc

    async def _release(self, session: Session) -> None:
        for task in list(session.work):
            task.cancel()  # a running command's sandbox is killed
        await asyncio.gather(*session.work, return_exceptions=True)
        if session.image is not None:
            await session.image.close()  # the layer (or container) goes with the session
        await asyncio.to_thread(remove_tree, session.root)

    def _track(self, session: Session, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        session.work.add(task)
        task.add_done_callback(session.work.discard)
        return task

    # -- commands ------------------------------------------------------------------------------------------------
    async def exec(self, sid: str, command: str, *, limit_s: float | None = None, key: str = "") -> ExecResult:
        """Run `command` once per `key` (a retry with the same key gets the first run's result)."""
        session = self.get(sid)
        limit = self.cfg.exec_timeout_s if limit_s is None else limit_s
        if not 0 < limit <= self.cfg.max_exec_timeout_s:
            raise SessionError(f"timeout: must be in (0, {self.cfg.max_exec_timeout_s:g}] seconds "
                               "(sandbox.sessions.max_exec_timeout_s)", field="timeout")
        key = key or uuid.uuid4().hex
        future = session.execs.get(key)
        if future is None:
            future = self._track(session, self._run_exec(session, command, limit))
            session.execs[key] = future
            while len(session.execs) > _KEYS_KEPT:
                session.execs.popitem(last=False)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if sid not in self.sessions:
                raise SessionNotFound(f"session {sid} was removed while the command ran") from None
            raise

    async def _run_exec(self, session: Session, command: str, limit: float) -> ExecResult:
        async with session.lock:
            cap = self.cfg.max_output_kb << 10
            hide = [Path(self.executor.work_root or session.root)]
            result = await (session.image.exec(command, limit_s=limit, output_cap=cap) if session.image else
                            self.executor.run_in_tree(session.tree, ["/bin/sh", "-c", command], uid=session.uid,
                                                      limit_s=limit, output_cap=cap, hide=hide))
        if not result.started:
            raise SessionInfraError(f"the sandbox did not start (exit {result.exit_code}): "
                                    f"{result.stderr.text()[-300:]}", infra=True)
        out, err = result.stdout, result.stderr
        return ExecResult(result.exit_code, out.text(), err.text(), out.total, err.total, out.total > cap,
                          err.total > cap, result.timed_out, round(result.wall_s, 4))

    # -- files ---------------------------------------------------------------------------------------------------
    async def read_file(self, sid: str, path: str) -> tuple[bytes, int]:
        session = self.get(sid)
        if session.image is not None:
            return await session.image.read_file(path, self.cfg.max_file_kb << 10)
        return await asyncio.to_thread(read_tree_file, session.tree, path, self.cfg.max_file_kb << 10)

    async def write_file(self, sid: str, path: str, data: bytes) -> None:
        session = self.get(sid)
        if len(data) > self.cfg.max_file_kb << 10:
            raise SessionError(f"content: {len(data)} bytes is more than sandbox.sessions.max_file_kb="
                               f"{self.cfg.max_file_kb}", field="content")
        async with session.lock:  # not while a command runs: it would see half a file
            await (session.image.write_file(path, data) if session.image else
                   asyncio.to_thread(write_tree_file, session.tree, path, data, session.uid))

    # -- finish --------------------------------------------------------------------------------------------------
    async def finish(self, sid: str, *, grade_unchanged: bool = True) -> dict[str, Any]:
        """Grade the session's diff in a fresh tree (`Executor.run`) and remove the session. Idempotent: a retry
        gets the same answer. `grade_unchanged=False`: a session that changed nothing is not run (its verdict is
        `format_error`, as for an answer without a patch)."""
        if (done := self.finished(sid)) is not None:
            return done
        session = self.get(sid)
        if session.finishing is None:
            # One grading per session: a second finish while the first grades waits for its answer (the first's
            # clean-up would otherwise cancel the second's run and close its connection unanswered).
            session.finishing = asyncio.ensure_future(self._finish(session, grade_unchanged))
        return await asyncio.shield(session.finishing)

    async def _finish(self, session: Session, grade_unchanged: bool) -> dict[str, Any]:
        sid = session.id
        t0 = time.monotonic()
        async with session.lock:
            try:
                d = await self._diff(session)
            except TimeoutError:  # git over a tree the agent filled with millions of files
                d = SessionDiff(problem="reading the session's changes took too long")
        log.info("session %s: changes read in %.1f s (%d bytes of diff%s)", sid, time.monotonic() - t0,
                 len(d.patch), f"; {d.problem}" if d.problem else "")
        if d.problem is not None:
            verdict = Verdict(status="not_applied", error=d.problem)
        elif not d.patch.strip() and not grade_unchanged:
            verdict = Verdict(status="format_error", error="format error (the session changed no file)")
        else:
            spec = TaskSpec(**{**session.spec.to_json(), "patch": d.patch})
            verdict = await self._track(session, self.executor.run(spec))
        verdict.error = d.note(verdict.error)  # the test files left out (diff.py: why not refused)
        result = {"session_id": sid, "patch": d.patch, "dropped_test_files": d.dropped, **verdict.to_json()}
        await self.delete(sid, "finished", result)
        return result

    async def _diff(self, session: Session) -> SessionDiff:
        """The diff against base_commit without test files, or why it cannot be graded (the agent's doing)."""
        if session.image is not None:  # computed in the image, by its git: the text is only a patch to grade
            return await session.image.diff(self.cfg.max_diff_kb << 10)
        gd, tree, cwd = str(session.git_dir), str(session.tree), session.tree
        added = await git("--git-dir", gd, "--work-tree", tree, "add", "--all", "--force", ".", cwd=cwd)
        names = await git("--git-dir", gd, "diff", "--cached", "--name-only", "-z", "--no-renames", session.commit,
                          cwd=cwd) if added.code == 0 else added
        if names.code != 0 and "No space left" in names.err:  # git's objects did not fit beside what it wrote
            return SessionDiff(problem=f"the session's tree is full (sandbox.tree_mb={self.executor.cfg.tree_mb})")
        if names.code != 0:
            return SessionDiff(problem=f"the session's changes could not be read: {names.err.strip()[-300:]}")
        kept, dropped = graded_paths(names.out.split("\0"), session.spec.test_patch, session.spec.task_paths)
        if not kept:
            return SessionDiff(dropped=dropped)
        kb = self.cfg.max_diff_kb
        diff = await git_capped("--git-dir", gd, "diff", "--cached", "--binary", "--no-renames", session.commit,
                                "--", *pathspecs(kept), cwd=cwd, cap=kb << 10)
        if diff is None:
            return SessionDiff(problem=f"the session's diff is larger than sandbox.sessions.max_diff_kb={kb}")
        if diff.code != 0:
            return SessionDiff(problem=f"the session's diff failed: {diff.err.strip()[-300:]}")
        return SessionDiff(diff.out, dropped=dropped)
