"""Output capping, git's view of patches, safe reads of sandbox-written files, and the bwrap command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import alive

from fleet.config.infra import SandboxConfig
from services.sandbox.bwrap import Interpreter, SandboxPolicy, UidRange
from services.sandbox.fstree import read_regular
from services.sandbox.gitcmd import parse_numstat, rename_sources, unquote_git_path
from services.sandbox.process import TailBuffer, kill_and_reap, run_limited


def test_tail_buffer_keeps_only_the_last_bytes_and_counts_all() -> None:
    buf = TailBuffer(10)
    for _ in range(1000):
        buf.feed(b"0123456789abc")
    assert buf.total == 13000
    assert buf.text() == "3456789abc"
    buf.feed(b"Z" * 50)
    assert buf.text() == "Z" * 10 and buf.total == 13050


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def test_patch_paths_include_both_sides_of_renames_and_quoted_names(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "old\tname.py").write_text("x = 1\n" * 20)
    (tmp_path / "caf\u00e9.py").write_text("y\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "base")
    (tmp_path / "tests").mkdir()
    os.rename(tmp_path / "old\tname.py", tmp_path / "tests" / "new.py")
    (tmp_path / "caf\u00e9.py").write_text("z\n")
    _git(tmp_path, "add", "-A")
    patch = _git(tmp_path, "diff", "--cached", "-M", "HEAD")
    assert 'rename from "old\\tname.py"' in patch
    (tmp_path / "p.diff").write_text(patch)
    _git(tmp_path, "reset", "-q", "--hard", "HEAD")
    out = subprocess.run(["git", "apply", "--numstat", "-z", "p.diff"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    # git reports only a rename's destination: the source comes from the patch header.
    assert sorted(parse_numstat(out)) == ["caf\u00e9.py", "tests/new.py"]
    assert rename_sources(patch) == ["old\tname.py"]
    assert unquote_git_path('"caf\\303\\251.py"') == "caf\u00e9.py"


def test_read_regular_refuses_symlinks_fifos_and_big_files(tmp_path: Path) -> None:
    (tmp_path / "ok").write_bytes(b"data")
    assert read_regular(tmp_path / "ok", 10) == b"data"
    os.symlink("/etc/passwd", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):
        read_regular(tmp_path / "link", 1 << 20)
    with pytest.raises(OSError, match="not a regular file"):
        read_regular(tmp_path / "fifo", 1 << 20)
    with pytest.raises(OSError, match="larger than"):
        read_regular(tmp_path / "ok", 2)


def _policy(tmp_path: Path, **kw: object) -> SandboxPolicy:
    interp = Interpreter(python="/opt/venv/bin/python", bin_dir="/opt/venv/bin",
                         prefixes=("/opt/venv", "/root/.pyenv/versions/3.11.7"))
    return SandboxPolicy(SandboxConfig(**kw), interp, tmp_path, pool_size=2)


def test_bwrap_argv_limits_isolates_and_drops_privileges(tmp_path: Path) -> None:
    policy = _policy(tmp_path, uid_base=70000, memory_mb=512, max_processes=32)
    tree = tmp_path / "task" / "tree"
    argv = policy.argv(tree, ["python", "-m", "pytest"], slot=1, hide=[], status_fd=9, cpu_s=30)
    joined = " ".join(argv)
    assert argv[0] == "prlimit" and f"--as={512 << 20}" in argv and "--cpu=30:35" in argv
    assert "--nproc=32" in argv or not policy.as_root
    assert "--die-with-parent" in argv and "--new-session" in argv and "--unshare-net" in joined + "--unshare-all"
    # Only the visible system folders are bound (issue 16: no `--ro-bind / /`, so the task set, gold patches and
    # the rest of the host are not there at all); the interpreter's folders are bound on their own, with parents.
    assert "--ro-bind / /" not in joined and "--ro-bind /usr /usr" in joined
    assert f"--bind {tree} {tree}" in joined and "--tmpfs /tmp" in joined and "--tmpfs /root" not in joined
    assert "--ro-bind /root/.pyenv/versions/3.11.7" in joined and "--dir /root " in joined
    if policy.as_root:
        assert argv[argv.index("--") + 1:argv.index("--") + 3] != ["python", "-m"]
        assert "setpriv" in argv and "--reuid=70001" in argv and "--no-new-privs" in argv
    assert argv[-3:] == ["python", "-m", "pytest"]


def test_environment_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_FLEET_SANDBOX_TOKEN", "secret")
    env = _policy(tmp_path).env({"X": "1"})
    assert "GRPO_FLEET_SANDBOX_TOKEN" not in env and env["X"] == "1"
    assert env["PATH"].startswith("/opt/venv/bin:") and env["HOME"] == "/tmp/home"


def test_without_bwrap_only_limits_apply(tmp_path: Path) -> None:
    argv = _policy(tmp_path, use_bwrap=False).argv(tmp_path, ["true"], slot=0, hide=[], status_fd=-1, cpu_s=5)
    assert argv[0] == "prlimit" and "bwrap" not in argv and argv[-1] == "true"



async def test_run_limited_caps_output_and_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    script = "head -c 3000000 /dev/zero; sleep 30 & echo BG $! >&2; wait; echo never"
    result = await run_limited(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), limit_s=1.5,
                               output_cap=1000)
    assert result.timed_out and result.wall_s < 1.5 + 3
    assert result.stdout.total == 3_000_000 and len(result.stdout.text()) == 1000
    # The background sleep was in the command's process group: it died with it.
    background = int(result.stderr.text().split("BG ")[1].split()[0])
    assert not alive(background)


async def test_run_limited_reads_every_byte_of_many_small_writes_and_of_what_an_exited_writer_left(
        tmp_path: Path) -> None:
    # The pipes are polled, not read on every write: nothing may be lost between ticks or after the exit.
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; echo last >&2"
    result = await run_limited(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), limit_s=60,
                               output_cap=1 << 20)
    lines = result.stdout.text().splitlines()
    assert (result.exit_code, len(lines), lines[-1], result.stderr.text()) == (0, 3000, "line-2999", "last\n")


async def test_a_writer_killed_after_its_reader_stopped_is_reaped() -> None:
    # A session diff past max_diff_kb: the reader stops at the cap, the writer fills the reader's buffer (asyncio
    # pauses the pipe), then is killed. On Python 3.11 a bare `proc.wait()` never returned there (a CI run hung 900 s).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 4096)",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    read = 0
    while read <= 1 << 20:
        read += len(await proc.stdout.read(1 << 20))
    await asyncio.sleep(0.5)  # the writer refills the pipe and the reader's buffer meanwhile
    await kill_and_reap(proc)
    assert proc.returncode == -9
    assert proc.stdout.at_eof(), "the paused pipe was read to its end (else wait() would wait for it forever)"
    await asyncio.wait_for(proc.wait(), 10)


async def test_run_limited_reports_the_exit_code(tmp_path: Path) -> None:
    result = await run_limited(["sh", "-c", "echo out; echo err >&2; exit 3"], env={"PATH": "/usr/bin:/bin"},
                               cwd=str(tmp_path), limit_s=30, output_cap=100)
    assert (result.exit_code, result.timed_out) == (3, False)
    assert (result.stdout.text(), result.stderr.text()) == ("out\n", "err\n")


def test_executors_on_one_host_never_share_slot_uids(tmp_path: Path) -> None:
    a = UidRange(70000, 4, lock_dir=str(tmp_path))
    b = UidRange(70000, 4, lock_dir=str(tmp_path))
    c = UidRange(70002, 4, lock_dir=str(tmp_path))  # overlaps a, then b
    assert (a.base, b.base, c.base) == (70000, 71000, 72002)
    a.release()
    assert UidRange(70000, 4, lock_dir=str(tmp_path)).base == 70000
    with pytest.raises(ValueError, match="pool_size"):
        UidRange(70000, 5000, lock_dir=str(tmp_path))
