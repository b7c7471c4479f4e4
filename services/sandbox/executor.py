"""The executor: TaskSpec in, Verdict out. Usable in-process (the task-set builder) and behind HTTP (`server.py`).

One task: resolve the repository (`repos.py`), materialise a fresh tree at `base_commit` (`workspace.py`), apply the
agent patch (`not_applied` if git cannot), refuse it if it touches tests (`integrity.py`), restore every test file
and runner input to pristine and force-apply the test patch (`patching.py`), run the tests through the trusted runner
(`trusted.py`, `runner/`) in bubblewrap under limits and a per-task cgroup (`bwrap.py`, `process.py`, `cgroups.py`),
read its signed report and grade it with swebench (`verdicts.py`, `grading.py`). A bounded pool (`pool_size` slots)
runs tasks concurrently; each slot has its own uid.
Anything that is not the patch's doing -- missing repository, git or disk failure, a sandbox that did not start, a
bug here -- becomes an `infra_error` verdict, never a failed patch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec, Verdict, check_spec, describe_runner
from services.sandbox import grading, verdicts
from services.sandbox.bwrap import SandboxPolicy, UidRange, probe_interpreter
from services.sandbox.cgroups import CgroupRoot, TaskCgroup
from services.sandbox.fstree import remove_tree, sweep_dead_roots
from services.sandbox.images.service import ImageTasks
from services.sandbox.patching import apply_patches
from services.sandbox.process import ReportPipe, RunResult, open_pipe, run_limited
from services.sandbox.repos import RepoNotFound, resolve_repo
from services.sandbox.runlog import RUN_LOG
from services.sandbox.runner.protocol import KEY_BYTES
from services.sandbox.treecache import TreeCache, tree_key
from services.sandbox.trusted import TrustedRunner
from services.sandbox.watchdog import Watchdog, WatchedRun, task_limits
from services.sandbox.workspace import InfraError, TreeLimits, Workspace, swebench_apply_chain

log = logging.getLogger(__name__)

WORK_ROOT_PREFIX = "grpo-sandbox-"  # + pid + '-' + random, under the temp folder, when sandbox.work_root is unset


class Executor:
    """Runs TaskSpecs, at most `pool_size` at a time. `async with Executor(cfg) as ex: verdict = await ex.run(spec)`."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.pool_size = cfg.pool_size or os.cpu_count() or 1
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(self.pool_size):
            self._slots.put_nowait(slot)
        self._start_lock = asyncio.Lock()
        self._policy: SandboxPolicy | None = None
        self._work_root: Path | None = None
        self._own_work_root = False
        self._uids: UidRange | None = None
        self._runner: TrustedRunner | None = None
        self._cgroups: CgroupRoot | Watchdog | None = None
        self._tree_limits: TreeLimits | None = None
        self.start_error: str | None = None
        self.images: ImageTasks | None = None
        """Tasks that name an image (`services/sandbox/images`); None with `sandbox.runtime: bwrap`."""
        self.image_error: str | None = None
        self.running = self.queued = self.completed = self.infra_errors = 0
        self.trees = TreeCache(cfg.tree_cache_size) if cfg.tree_cache_size else None
        """Verdicts by the tree their tests ran on (`sandbox.tree_cache_size`); None when off."""

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Check the tools, probe the interpreter, prove a sandbox starts. Raises if this host cannot run tasks."""
        async with self._start_lock:
            if self._policy is not None:
                return
            try:
                self._policy = await self._setup()
                await self._start_images()
                if self.trees is not None and self.cfg.tree_cache_path:
                    await asyncio.to_thread(self.trees.attach_file, self.cfg, self.test_runner)
                self.start_error = None
            except Exception as exc:
                self.start_error = str(exc)
                raise

    async def _setup(self) -> SandboxPolicy:
        # GNU patch: the last command of SWE-bench's apply chain (workspace.swebench_apply_chain).
        names = ["git", "patch", "prlimit"] + (["bwrap", "setpriv"] if self.cfg.use_bwrap else [])
        tools = {name: shutil.which(name) for name in names}
        missing = [name for name, path in tools.items() if path is None]
        if missing:
            raise RuntimeError(f"missing tools: {', '.join(missing)} (packages: git, patch, util-linux, bubblewrap)")
        interpreter = await probe_interpreter(self.cfg.python)
        self._work_root = work_root = self._make_work_root()
        found = {name: path for name, path in tools.items() if path is not None}
        if os.geteuid() == 0 and self.cfg.use_bwrap and self._uids is None:
            self._uids = UidRange(self.cfg.uid_base, self.pool_size)
        uid_base = self._uids.base if self._uids else None
        await self._setup_integrity(interpreter.python, interpreter.prefixes, found["prlimit"])
        policy = SandboxPolicy(self.cfg, interpreter, self._work_root, self.pool_size, found, uid_base,
                               runner=self._runner)
        await asyncio.to_thread(grading.load_grader)
        await asyncio.to_thread(swebench_apply_chain)  # swebench's harness module: ~1 s to import, not on the loop
        await self._preflight(policy)
        if not policy.as_root and self.cfg.use_bwrap:
            log.warning("executor is not root: tasks share its uid, so RLIMIT_NPROC is per user, not per task")
        log.info("executor ready: pool %d, sandbox %s, slot uids from %s, python %s (%s), work root %s",
                 self.pool_size, "bwrap" if self.cfg.use_bwrap else "NONE (trusted debugging)", uid_base,
                 interpreter.python, describe_runner(self.test_runner), work_root)
        return policy

    async def _setup_integrity(self, python: str, prefixes: tuple[str, ...], prlimit: str) -> None:
        """The trusted runner folder, per-task cgroups and size-limited trees (see docs/services/sandbox.md)."""
        cfg = self.cfg
        if self._runner is None:
            self._runner = await TrustedRunner.build(python, prefixes, isolated=cfg.isolated_site,
                                                     packages=cfg.runner_packages)
        if cfg.use_bwrap and self._cgroups is None:
            self._cgroups = task_limits(cfg.cgroups)
        if os.geteuid() == 0 and cfg.use_bwrap:
            # git apply under the test limits: a small binary patch must not inflate past the tree or the memory.
            apply = (prlimit, f"--as={cfg.memory_mb << 20}", f"--fsize={cfg.max_file_mb << 20}",
                     f"--cpu={cfg.cpu_s}", "--")
            self._tree_limits = TreeLimits(cfg.tree_mb, cfg.tree_files, apply)

    def _make_work_root(self) -> Path:
        if self.cfg.work_root:
            work_root = Path(self.cfg.work_root)
            work_root.mkdir(parents=True, exist_ok=True)
        else:
            # Named by pid so that the next executor on this host removes what a killed one left (trees, mounts).
            for stale in sweep_dead_roots(Path(tempfile.gettempdir()), WORK_ROOT_PREFIX):
                log.info("removed %s, left by an executor that is gone", stale)
            work_root = Path(tempfile.mkdtemp(prefix=f"{WORK_ROOT_PREFIX}{os.getpid()}-"))
            self._own_work_root = True
        # Search but no listing: a sandbox's uid must traverse to its own tree (bwrap recreates these folders with
        # the same modes inside its tmpfs), and nobody may enumerate the other tasks' trees.
        os.chmod(work_root, 0o711)
        return work_root.resolve()

    async def _preflight(self, policy: SandboxPolicy) -> None:
        assert self._work_root is not None
        ws = Workspace(self._work_root / f"preflight-{uuid.uuid4().hex}")
        try:
            ws.root.mkdir(mode=0o711)
            ws.tree.mkdir()
            ws.seal(policy.uid_for_slot(0))
            python = policy.runner.python if policy.runner else policy.interpreter.python
            result = await self._sandboxed(policy, ws.tree, [python, "-c", "print('ok')"],
                                           slot=0, hide=[], env={}, limit_s=60)
        finally:
            await asyncio.to_thread(ws.remove)
        if not result.started or result.exit_code != 0 or "ok" not in result.stdout.text():
            raise RuntimeError(f"the sandbox does not start on this host (exit {result.exit_code}): "
                               f"{result.stderr.text()[-500:].strip()}")

    async def _start_images(self) -> None:
        if self.cfg.runtime == "bwrap" or self.images is not None:
            return
        try:
            images = ImageTasks(self.cfg)
            await images.start()
        except Exception as exc:  # host tasks still run; image tasks answer infra_error with this reason
            self.image_error = f"image runtime {self.cfg.runtime} unavailable: {exc}"
            log.warning("%s", self.image_error)
            return
        self.images, self.image_error = images, None

    async def close(self) -> None:
        if self.images is not None:
            await self.images.close()
            self.images = None
        if self._own_work_root and self._work_root is not None:
            await asyncio.to_thread(remove_tree, self._work_root)
        if self._uids is not None:
            self._uids.release()
            self._uids = None
        if self._runner is not None:
            await asyncio.to_thread(self._runner.remove)
            self._runner = None
        if self._cgroups is not None:
            self._cgroups.remove()
            self._cgroups = None
        self._policy = None

    @property
    def test_runner(self) -> dict[str, str]:
        """The versions the tests run with ({"python", "pytest"}; empty before start): see TrustedRunner.versions."""
        return dict(self._runner.versions) if self._runner is not None else {}

    def health(self) -> dict[str, object]:
        policy = self._policy
        return {
            "status": "ok" if self.start_error is None else "unhealthy",
            "error": self.start_error,
            "pool_size": self.pool_size,
            "running": self.running,
            "queued": self.queued,
            "completed": self.completed,
            "infra_errors": self.infra_errors,
            "sandbox": "bwrap" if self.cfg.use_bwrap else "none",
            "task_limits": self._cgroups.kind if self._cgroups is not None else None,
            "slot_uids": [policy.uid_for_slot(0), policy.uid_for_slot(self.pool_size - 1)]
            if policy and policy.uid_for_slot(0) is not None else None,
            "runtime": self.cfg.runtime, "image_error": self.image_error, "test_runner": self.test_runner,
            "tree_cache": self.trees.stats() if self.trees is not None else None,
            **(self.images.health() if self.images is not None else {}),
        }

    async def run(self, spec: TaskSpec, *, on_start: Callable[[], None] | None = None) -> Verdict:
        """The verdict of one task (waits for a pool slot). Raises SpecError only for an invalid spec."""
        check_spec(spec)
        try:
            await self.start()
        except Exception as exc:
            self.infra_errors += 1
            return Verdict(status="infra_error", error=f"sandbox could not start: {exc}")
        if spec.image is not None and self.images is not None:
            self.images.prefetch(spec.image)  # the pull overlaps the wait for a slot
        t0 = time.monotonic()
        self.queued += 1
        try:
            slot = await self._slots.get()
        finally:
            self.queued -= 1
        self.running += 1
        try:
            if on_start is not None:
                on_start()
            verdict = await self._run_in_slot(spec, slot, {"queued_s": time.monotonic() - t0})
        finally:
            self.running -= 1
            self._slots.put_nowait(slot)
        self.completed += 1
        self.infra_errors += verdict.is_infra_failure
        return verdict

    async def _run_in_slot(self, spec: TaskSpec, slot: int, timings: dict[str, float]) -> Verdict:
        assert self._work_root is not None
        t0 = time.monotonic()
        ws = Workspace(self._work_root / uuid.uuid4().hex, self._tree_limits)
        try:
            verdict = await self._execute(spec, slot, ws, timings)
        except (InfraError, RepoNotFound) as exc:
            verdict = Verdict(status="infra_error", error=str(exc))
        except OSError as exc:  # disk full, permissions, fd exhaustion: the host, not the patch
            verdict = Verdict(status="infra_error", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("executor bug on %s@%s", spec.repo_url, spec.base_commit)
            verdict = Verdict(status="infra_error", error=f"executor error: {type(exc).__name__}: {exc}")
        finally:
            await asyncio.to_thread(ws.remove)
        timings["total_s"] = time.monotonic() - t0
        verdict.timings = {k: round(v, 4) for k, v in timings.items()}
        log.info(RUN_LOG, spec.repo_url, spec.base_commit, verdict.status, verdict.resolution, timings["total_s"],
                 " ".join(f"{k}={v:.3f}" for k, v in timings.items()))
        return verdict

    async def _execute(self, spec: TaskSpec, slot: int, ws: Workspace, timings: dict[str, float]) -> Verdict:
        if spec.image is not None:
            if self.images is None:
                why = self.image_error or "sandbox.runtime is bwrap (host interpreter only)"
                return Verdict(status="infra_error", error=f"image {spec.image}: {why}")
            return await self.images.run(spec, timings, self.trees)
        repo = resolve_repo(spec.repo_url, self.cfg)
        early = await self._materialise(ws, repo, spec, timings)
        if early is not None:
            return early
        if self.trees is None:
            return await self._test(ws, spec, slot, repo, timings)
        t = time.monotonic()
        key = tree_key(spec, await ws.tree_id())
        timings["tree_key_s"] = time.monotonic() - t
        return await self.trees.get_or_run(key, lambda: self._test(ws, spec, slot, repo, timings))

    async def _test(self, ws: Workspace, spec: TaskSpec, slot: int, repo: Path, timings: dict[str, float]) -> Verdict:
        """The tests of `spec` on `ws`'s tree (both patches in), graded: the FAIL_TO_PASS tests alone first where the
        spec asks for it, then the full run in a fresh tree unless that first run settled the verdict."""
        if not (spec.fail_to_pass_first and spec.fail_to_pass and TrustedRunner.runs_tests_itself(spec)):
            return await self._run_tests(ws, spec, slot, repo, timings)
        first = await self._run_tests(ws, spec, slot, repo, timings, only=spec.fail_to_pass)
        timings["first_tests_s"] = timings.pop("tests_s")
        if verdicts.no_failing_test_passed(first, spec):
            first.error = "; ".join(filter(None, [first.error, verdicts.FIRST_RUN_NOTE]))
            return first
        # A FAIL_TO_PASS test passed, or the first run is not conclusive: the full run grades, in a tree that the
        # first run's tests never wrote to.
        assert self._work_root is not None
        fresh = Workspace(self._work_root / uuid.uuid4().hex, self._tree_limits)
        try:
            early = await self._materialise(fresh, repo, spec, {})
            return early or await self._run_tests(fresh, spec, slot, repo, timings)
        finally:
            await asyncio.to_thread(fresh.remove)

    async def _materialise(self, ws: Workspace, repo: Path, spec: TaskSpec,
                           timings: dict[str, float]) -> Verdict | None:
        """`spec`'s tree in `ws`: the checkout, then the patches (a verdict when they end the task there)."""
        t = time.monotonic()
        await ws.checkout(repo, spec.base_commit)
        timings["checkout_s"] = time.monotonic() - t
        t = time.monotonic()
        early = await apply_patches(ws, spec, self._runner.config_names if self._runner else frozenset())
        timings["apply_s"] = time.monotonic() - t
        return early

    async def _sandboxed(self, policy: SandboxPolicy, tree: Path, command: list[str], *, slot: int,
                         hide: list[Path], env: dict[str, str], limit_s: float, report: ReportPipe | None = None,
                         cgroup: TaskCgroup | WatchedRun | None = None, output_cap: int | None = None) -> RunResult:
        """Run `command` in `tree` inside bubblewrap as `slot`'s uid, under the task limits and `cgroup`."""
        status_pipe = os.pipe() if self.cfg.use_bwrap else None
        fd = status_pipe[1] if status_pipe else -1
        cpu_s = max(1, min(self.cfg.cpu_s, math.ceil(limit_s)))
        argv = policy.argv(tree, command, slot=slot, hide=hide, status_fd=fd, cpu_s=cpu_s)
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        return await run_limited(argv, env=policy.env(env), cwd=str(tree), limit_s=limit_s,
                                 output_cap=output_cap if output_cap is not None else self.cfg.max_output_kb << 10,
                                 status_pipe=status_pipe, report=report,
                                 guard=cgroup)

    @property
    def tree_limits(self) -> TreeLimits | None:
        """The size-limited filesystem a task's tree gets (None: trees on the work root's disk); sessions use it too."""
        return self._tree_limits

    @property
    def work_root(self) -> Path | None:
        """Where task trees are made (None until started)."""
        return self._work_root

    async def run_in_tree(self, tree: Path, command: list[str], *, uid: int | None, limit_s: float,
                          output_cap: int, hide: list[Path]) -> RunResult:
        """Run `command` in `tree` inside the sandbox and limits a task's tests get, as `uid` (an interactive
        session's own; None: the executor's, when it is not root). The caller made `tree` and handed it to `uid`."""
        await self.start()
        policy = self._policy
        assert policy is not None
        # The policy derives a run's uid from its slot: a session's uid is `uid_base + slot` for some slot number.
        slot = uid - policy.uid_base if uid is not None and policy.uid_for_slot(0) is not None else 0
        hidden = [*hide, *([Path(self.cfg.repos_root)] if self.cfg.repos_root else [])]
        cgroup = self._cgroups.task(self.cfg.task_memory_mb << 20, self.cfg.max_processes) if self._cgroups else None
        try:
            return await self._sandboxed(policy, tree, command, slot=slot, hide=hidden, env={}, limit_s=limit_s,
                                         cgroup=cgroup, output_cap=output_cap)
        finally:
            if cgroup is not None:
                await cgroup.remove()

    async def _run_tests(self, ws: Workspace, spec: TaskSpec, slot: int, repo: Path,
                         timings: dict[str, float], only: list[str] | None = None) -> Verdict:
        """The verdict of `spec`'s tests in `ws` (`only`: these tests alone, graded as the only expected ones)."""
        policy = self._policy
        assert policy is not None
        await asyncio.to_thread(ws.seal, policy.uid_for_slot(slot))
        # The key reaches the runner through a pipe it reads before any code of the tree runs; the report comes
        # back on another, read while the tests run: nothing in the tree is ever read back as a result.
        key = os.urandom(KEY_BYTES)
        key_read, key_write = os.pipe()
        os.write(key_write, key)
        os.close(key_write)
        report_read, report_write = open_pipe()
        pipe = ReportPipe(report_read, report_write, self.cfg.max_report_mb << 20, inherit=(key_read,))
        runner = self._runner
        assert runner is not None
        command, env = runner.test_command(spec, ws.tree, key_read, report_write,
                                           disable_autoload=self.cfg.disable_plugin_autoload, only=only,
                                           tracebacks=self.cfg.first_run_tracebacks)
        hide = [repo, *([Path(self.cfg.repos_root)] if self.cfg.repos_root else [])]
        cgroup = self._cgroups.task(self.cfg.task_memory_mb << 20, self.cfg.max_processes) if self._cgroups else None
        t = time.monotonic()
        try:
            result = await self._sandboxed(policy, ws.tree, command, slot=slot, hide=hide, env=env,
                                           limit_s=spec.timeout, report=pipe, cgroup=cgroup)
            stats = cgroup.stats() if cgroup else None
        finally:
            if cgroup is not None:
                await cgroup.remove()
        timings["tests_s"] = time.monotonic() - t
        if not result.started:
            raise InfraError(f"sandbox did not start (exit {result.exit_code}): {result.stderr.text()[-500:]}")
        t = time.monotonic()
        limits = verdicts.Limits(self.cfg.cpu_s, self.cfg.memory_mb, self.cfg.task_memory_mb if cgroup else None,
                                 self.cfg.max_test_cases)
        shell = spec.test_command is not None and command[0] == "/bin/sh"
        graded = spec if only is None else dataclasses.replace(spec, fail_to_pass=only, pass_to_pass=[])
        verdict = verdicts.grade_run(graded, result, key, limits, stats, shell=shell)
        timings["grade_s"] = time.monotonic() - t
        return verdict
