"""The bubblewrap command line of one test run, and the limits around it.

Layers, outermost first:
  prlimit      RLIMIT_AS / CPU / NPROC / FSIZE / CORE, inherited by everything below (no preexec_fn: it is unsafe in
               a threaded process, and prlimit is one exec).
  bwrap        new pid/net/ipc/uts/cgroup namespaces (no network: only a down loopback), `/` read-only, private /tmp,
               host folders hidden behind empty tmpfs (`hidden_paths`, the source repository, the executor's work
               root), the task's tree bound read-write, new session, dies with its parent.
  setpriv      (executor running as root) drop to the pool slot's own uid/gid, no groups, no capabilities, no new
               privileges. Root is needed to set up the mounts, but the kernel never enforces RLIMIT_NPROC for root,
               so a fork bomb would only stop at the host's pid_max; as uid `uid_base + slot` it stops at
               `max_processes`. This is also why bwrap does not get a user namespace here: one made by root maps only
               root, and the switch to another uid would then be impossible.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from fleet.config.infra import SandboxConfig
from services.sandbox.trusted import TrustedRunner

SANDBOX_HOME = "/tmp/home"
_UID_STEP = 1000
_HIDDEN_TMPFS_BYTES = 1 << 20


@dataclass(frozen=True)
class Interpreter:
    """The Python the tests run with, and the host folders it needs inside the sandbox."""

    python: str
    bin_dir: str
    prefixes: tuple[str, ...]


async def probe_interpreter(python: str | None) -> Interpreter:
    exe = python or sys.executable
    code = ("import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, "
            "os.path.dirname(os.path.realpath(sys.executable))]))")
    proc = await asyncio.create_subprocess_exec(exe, "-I", "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox.python={exe!r} does not run: {err.decode(errors='replace')[-300:]}")
    return _interpreter(exe, json.loads(out))


def _interpreter(exe: str, folders: list[str]) -> Interpreter:
    prefixes = tuple(dict.fromkeys(os.path.realpath(p) for p in folders))
    # PATH gets the folder `exe` is in, not its symlink target: a venv's bin/ makes its site-packages active.
    return Interpreter(python=exe, bin_dir=os.path.dirname(os.path.abspath(exe)), prefixes=prefixes)


class UidRange:
    """An exclusive claim on the uids `base .. base+size-1` among the executors of this host (one flock per uid on
    a file in /tmp): two executors sharing a slot uid would share its RLIMIT_NPROC, so one task's fork bomb could
    fail another's tests. The first free range from `sandbox.uid_base` on, in steps of `_UID_STEP`, is taken."""

    def __init__(self, first: int, size: int, lock_dir: str = "/tmp") -> None:
        if size > _UID_STEP:
            raise ValueError(f"sandbox.pool_size must be at most {_UID_STEP} (one uid per slot)")
        self.base = -1
        self._fds: list[int] = []
        for candidate in range(first, first + 64 * _UID_STEP, _UID_STEP):
            if self._claim(candidate, size, lock_dir):
                self.base = candidate
                return
        raise RuntimeError(f"no free sandbox uid range from sandbox.uid_base={first} (64 executors on this host?)")

    def _claim(self, base: int, size: int, lock_dir: str) -> bool:
        for uid in range(base, base + size):
            fd = os.open(os.path.join(lock_dir, f".grpo-sandbox-uid-{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                return False
            self._fds.append(fd)
        return True

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)  # closing drops the flock
        self._fds = []


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


class SandboxPolicy:
    """Builds the argv and environment of a sandboxed run from `SandboxConfig`."""

    def __init__(self, cfg: SandboxConfig, interpreter: Interpreter, work_root: Path, pool_size: int,
                 tools: dict[str, str] | None = None, uid_base: int | None = None,
                 runner: TrustedRunner | None = None) -> None:
        self.cfg = cfg
        self.runner = runner
        self.uid_base = cfg.uid_base if uid_base is None else uid_base
        self.interpreter = interpreter
        # Absolute paths found on the executor's PATH: the sandbox's own PATH is a clean, fixed one.
        self.tools = {name: (tools or {}).get(name, name) for name in ("prlimit", "bwrap", "setpriv")}
        self.work_root = work_root.resolve()
        self.pool_size = pool_size
        self.as_root = os.geteuid() == 0
        self._visible_paths: list[tuple[str, str | None]] | None = None

    def uid_for_slot(self, slot: int) -> int | None:
        """The uid a pool slot's tests run as (None: the executor's own, when it is not root)."""
        return self.uid_base + slot if self.as_root and self.cfg.use_bwrap else None

    def _prlimit(self, cpu_s: int) -> list[str]:
        cfg = self.cfg
        nproc = cfg.max_processes
        if not (self.as_root and cfg.use_bwrap):
            # Without a uid of its own, RLIMIT_NPROC counts every process of the executor's user.
            nproc = cfg.max_processes * self.pool_size + 256
        return [self.tools["prlimit"], f"--as={cfg.memory_mb << 20}", f"--cpu={cpu_s}:{cpu_s + 5}", f"--nproc={nproc}",
                f"--fsize={cfg.max_file_mb << 20}", "--core=0", "--"]

    def _hidden(self, extra: list[Path]) -> list[str]:
        paths = [*self.cfg.hidden_paths, *(str(p) for p in extra)]
        if not _under(str(self.work_root), "/tmp"):
            paths.append(str(self.work_root))
        keep = []
        for raw in paths:
            path = os.path.realpath(raw)
            if path != "/" and not _under(path, "/tmp") and os.path.isdir(path):
                keep.append(path)
        # A folder inside another hidden one is hidden already.
        return sorted(p for p in set(keep) if not any(_under(p, q) and p != q for q in keep))

    def _visible(self) -> list[tuple[str, str | None]]:
        """(path, symlink target or None) of each `visible_paths` entry that exists: the only host folders, with the
        interpreter's and the runner's, that the sandbox sees (a merged-/usr `/bin` stays a link). Looked up once per
        policy: the host's system folders do not change under a running executor."""
        if self._visible_paths is None:
            self._visible_paths = self._find_visible()
        return self._visible_paths

    def _find_visible(self) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        for path in dict.fromkeys(os.path.normpath(p) for p in self.cfg.visible_paths):
            if os.path.islink(path):
                out.append((path, os.readlink(path)))
            elif os.path.isdir(path):
                out.append((os.path.realpath(path), None))
        return out

    @staticmethod
    def _parents(path: str, covered: tuple[str, ...], bound: tuple[str, ...] = ()) -> list[str]:
        """`--dir` for `path`'s parents that bwrap creates (inside a tmpfs, or in its own root outside every bound
        folder): otherwise 0700 root, not traversable."""
        args: list[str] = []
        for parent in reversed(Path(path).parents):
            p = str(parent)
            if p == "/":
                continue
            if any(_under(p, c) and p != c for c in covered) or not any(_under(p, b) for b in bound):
                args += ["--perms", "0755", "--dir", p]
        return args

    def _mounts(self, tree: Path, hide: list[Path]) -> list[str]:
        visible = self._visible()
        bound = tuple(p for p, target in visible if target is None)
        args: list[str] = []
        for path, target in visible:
            args += ["--symlink", target, path] if target else ["--ro-bind", path, path]
        args += ["--dev", "/dev", "--proc", "/proc",
                 "--perms", "1777", "--size", str(self.cfg.tmpfs_mb << 20), "--tmpfs", "/tmp"]
        # Only what a bound folder made visible needs covering.
        hidden = [h for h in self._hidden(hide) if any(_under(h, b) for b in bound)]
        covered = (*hidden, "/tmp")
        for path in hidden:
            args += ["--size", str(_HIDDEN_TMPFS_BYTES), "--tmpfs", path]
        prefixes = self.runner.prefixes if self.runner else self.interpreter.prefixes
        binds = [*bound, "/tmp"]
        for prefix in prefixes:
            inside_another = any(_under(prefix, p) and prefix != p for p in prefixes)
            seen = any(_under(prefix, b) for b in bound) and not any(_under(prefix, c) for c in covered)
            if not inside_another and not seen:
                args += [*self._parents(prefix, covered, tuple(binds)), "--ro-bind", prefix, prefix]
                binds.append(prefix)
        sites = [s for s in (self.runner.hidden_site if self.runner else []) if any(_under(s, b) for b in binds)]
        for path in sites:
            args += ["--size", str(_HIDDEN_TMPFS_BYTES), "--tmpfs", path]
        if self.runner is not None:
            root = str(self.runner.root)
            args += [*self._parents(root, covered, tuple(binds)), "--ro-bind", root, root]
        args += [*self._parents(str(tree), covered, tuple(binds)), "--perms", "0777", "--dir", SANDBOX_HOME,
                 "--bind", str(tree), str(tree)]
        for path in [*hidden, *sites]:
            args += ["--remount-ro", path]
        return [*args, "--chdir", str(tree)]

    def argv(self, tree: Path, command: list[str], *, slot: int, hide: list[Path], status_fd: int,
             cpu_s: int) -> list[str]:
        """The full command line; `status_fd` receives bwrap's JSON status (child-pid once the sandbox is up)."""
        if not self.cfg.use_bwrap:
            return [*self._prlimit(cpu_s), *command]
        uid = self.uid_for_slot(slot)
        args = [self.tools["bwrap"], "--die-with-parent", "--new-session", "--hostname", "sandbox",
                "--json-status-fd", str(status_fd)]
        if uid is not None:
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                     "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            inner = [self.tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                     "--no-new-privs", "--", *command]
        else:
            args += ["--unshare-all", "--unshare-user", "--disable-userns"]
            inner = command
        return [*self._prlimit(cpu_s), *args, *self._mounts(tree, hide), "--", *inner]

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """A clean environment: nothing of the executor's (tokens included) reaches the tests."""
        bin_dir = self.runner.bin_dir if self.runner else self.interpreter.bin_dir
        path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
        base = {"PATH": path, "HOME": SANDBOX_HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        if self.runner is not None:
            # A plain `python -m pytest` (a shell test_command, a session) finds the runner's report plugin, and in
            # the isolated mode (no site-packages) its copies of pytest; the runner's boot rebuilds sys.path itself.
            base["PYTHONPATH"] = str(self.runner.site)
        if not self.cfg.use_bwrap:
            base["HOME"] = base["TMPDIR"] = "/tmp"
        return {**base, **extra}
