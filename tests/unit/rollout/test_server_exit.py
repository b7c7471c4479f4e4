"""The rollout process's exit after an orderly stop (`rollout.server.exit_now`, issue 18): exit handlers run and
output is flushed, but nothing left behind -- a non-daemon thread, the interpreter's teardown of a large heap --
keeps the process alive."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import atexit, sys, threading
    from rollout.server import exit_now
    threading.Thread(target=threading.Event().wait, name="left-behind").start()  # non-daemon, never ends
    atexit.register(print, "exit handler ran")
    sys.stdout.write("unflushed output")
    exit_now(3)
""")


def test_exit_now_runs_exit_handlers_flushes_and_does_not_wait_for_threads_left_behind() -> None:
    # Without exit_now the child never exits (the interpreter joins the thread): the generous timeout catches that.
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "unflushed output" in done.stdout
    assert "exit handler ran" in done.stdout
