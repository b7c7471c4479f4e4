"""A small real git repository for sandbox tests, patches made against it with git itself, and a session-serving
sandbox server with its client.

`calc` has two bugs (`add`, `mul`); its test patch adds `tests/test_mul.py`, whose parametrised ids include one with a
space. FAIL_TO_PASS / PASS_TO_PASS below are what SWE-bench would list for the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.config.infra import SandboxConfig, SandboxSessionConfig
from fleet.contracts.sandbox import TaskSpec
from sandbox_client.sessions import SessionClient
from services.sandbox.server import SandboxServer

# The gold fix with one line of context around each change, where git's own diff has three.
ONE_LINE_CONTEXT = """diff --git a/calc/core.py b/calc/core.py
--- a/calc/core.py
+++ b/calc/core.py
@@ -1,3 +1,3 @@
 def add(a, b):
-    return a - b
+    return a + b
 
@@ -5,3 +5,3 @@
 def mul(a, b):
-    return a + b
+    return a * b
 
"""

# Slot uids of this test session: distinct from a task-set build or another test session running on the same host.
UID_BASE = 100_000 + (os.getpid() % 10_000) * 16

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}

CORE = '''\
def add(a, b):
    return a - b


def mul(a, b):
    return a + b


def neg(x):
    return -x
'''
FIXED = CORE.replace("return a - b", "return a + b").replace("return a + b\n\n\ndef neg", "return a * b\n\n\ndef neg")
ADD_ONLY = CORE.replace("return a - b", "return a + b")

FILES = {
    "calc/__init__.py": "from calc.core import add, mul, neg\n",
    "calc/core.py": CORE,
    "tests/conftest.py": "# the suite's shared fixtures would live here\n",
    "tests/test_core.py": '''\
import pytest

from calc import add, neg


def test_add():
    assert add(2, 3) == 5


@pytest.mark.parametrize("x", [1, -2])
def test_neg(x):
    assert neg(x) == -x


class TestNeg:
    def test_zero(self):
        assert neg(0) == 0
''',
    "setup.cfg": "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n",
}
TEST_MUL = '''\
import pytest

from calc import mul


class TestMul:
    @pytest.mark.parametrize("a,b,want", [(2, 3, 6), (0, 5, 0)], ids=["two three", "zero"])
    def test_mul(self, a, b, want):
        assert mul(a, b) == want
'''
F2P = ["tests/test_core.py::test_add", "tests/test_mul.py::TestMul::test_mul[two three]",
       "tests/test_mul.py::TestMul::test_mul[zero]"]
P2P = ["tests/test_core.py::test_neg[1]", "tests/test_core.py::test_neg[-2]", "tests/test_core.py::TestNeg::test_zero"]


def git(repo: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, input=stdin,
                          env={**os.environ, **GIT_ENV, **(env or {})}).stdout


@dataclass
class CalcRepo:
    path: Path
    base: str
    test_patch: str
    gold: str = field(default="")

    def diff(self, changes: dict[str, str | None], symlinks: dict[str, str] | None = None) -> str:
        """A patch against `base`: path -> new text (None deletes it); symlinks: path -> target."""
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as index_dir:
            env = {"GIT_INDEX_FILE": str(Path(index_dir) / "index"), "GIT_WORK_TREE": tmp}
            git(self.path, "read-tree", self.base, env=env)
            git(self.path, "checkout-index", "-a", env=env)
            for rel, text in changes.items():
                target = Path(tmp) / rel
                if text is None:
                    target.unlink()
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
            for rel, dest in (symlinks or {}).items():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(dest, Path(tmp) / rel)
            git(self.path, "add", "-A", ".", env={**env, "GIT_DIR": str(self.path / ".git")})
            return git(self.path, "diff", "--cached", "--binary", self.base, env=env)

    def spec(self, patch: str, **kw: object) -> TaskSpec:
        args: dict[str, object] = {"repo_url": str(self.path), "base_commit": self.base, "patch": patch,
                                   "test_patch": self.test_patch, "fail_to_pass": F2P, "pass_to_pass": P2P,
                                   "timeout": 60.0}
        args.update(kw)
        return TaskSpec(**args)  # type: ignore[arg-type]


def make_calc_repo(root: Path) -> CalcRepo:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q")
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "calc with two bugs")
    base = git(root, "rev-parse", "HEAD").strip()
    repo = CalcRepo(root, base, "")
    repo.test_patch = repo.diff({"tests/test_mul.py": TEST_MUL})
    repo.gold = repo.diff({"calc/core.py": FIXED})
    return repo


def sandbox_pids(uid_base: int = UID_BASE, count: int = 16) -> list[int]:
    """Processes running as one of the test session's slot uids (there must be none between tasks)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if uid_base <= uid < uid_base + count:
            pids.append(int(entry))
    return pids


async def eventually(predicate: Callable[[], object], within_s: float = 30.0, what: str = "condition") -> None:
    """Wait until `predicate()` is true (polling: the state lives in another component)."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def entries(path: str | Path) -> list[str]:
    return sorted(os.listdir(path))


def exists(path: str | Path) -> bool:
    return os.path.lexists(path)


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.asynccontextmanager
async def session_server(cfg: SandboxConfig, **sessions: Any) -> AsyncIterator[SandboxServer]:
    """A real sandbox HTTP server with sessions on (three at most), `sessions` overriding SandboxSessionConfig's
    other defaults."""
    settings = SandboxSessionConfig(**{"max_sessions": 3, **sessions})
    server = SandboxServer(cfg.model_copy(update={"sessions": settings}))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0)


def server_url(server: SandboxServer) -> str:
    return f"http://127.0.0.1:{server.port}"


@contextlib.asynccontextmanager
async def session_client(server: SandboxServer) -> AsyncIterator[SessionClient]:
    client = SessionClient([server_url(server)], owner="worker-a", max_retries=1, backoff_s=0.05)
    try:
        yield client
    finally:
        await client.close()
