"""Starting a child that dies with its parent (and, if asked, runs on given cores) from a process that uses gRPC.

The usual way -- `prctl(PR_SET_PDEATHSIG)` and `sched_setaffinity` in a `preexec_fn` -- forces CPython onto a plain
`fork()` (only a spawn without `preexec_fn` may use `vfork()`), and a plain fork runs gRPC's `pthread_atfork`
handlers. With gRPC channels in use (the launcher's readiness probes, a service's server) those handlers restart
gRPC's threads in the child between fork and exec, and the child can die there before it ever runs the command:
grpcio 1.85 here, a launcher probing a gRPC server while it spawned, lost 39 of 300 `/bin/true` children to SIGSEGV
with a `preexec_fn` and none without (grpc/grpc#43055; `tests/unit/fleet/test_spawn.py` runs that race). In the
fleet it surfaced as a sandbox that "exited with -6 before it was ready" and wrote nothing but gRPC's
`pthread_create failed` to its log.

So both settings are made by util-linux programs that `exec` the command (`setpriv --pdeathsig`, `taskset -c`): no
Python code runs in the child. Without util-linux, a `preexec_fn` is used only while gRPC is not loaded.
The death signal fires when the *thread* that started the child exits: start children from a long-lived thread.
`setpriv` sets the death signal after its own exec, so a parent killed in that first millisecond leaves an orphan
(measured here under load, killing the parent the moment it had the pid: 35 of 100); the guard holds from the
command's exec on.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def guarded(argv: Sequence[str], *, cpus: Sequence[int] | None = None,
            death_signal: signal.Signals = signal.SIGTERM) -> tuple[list[str], Callable[[], None] | None]:
    """(the command line to start, the `preexec_fn` to pass, None unless util-linux is missing) for `argv` to get
    `death_signal` when its parent dies and, given `cpus`, to run on those cores only (its children inherit both)."""
    if not sys.platform.startswith("linux"):
        return list(argv), None
    prefix: list[str] = []
    left: list[str] = []
    setpriv, taskset = shutil.which("setpriv"), shutil.which("taskset")
    if setpriv:
        prefix += [setpriv, "--pdeathsig", death_signal.name.removeprefix("SIG"), "--"]
    else:
        left.append("die with its parent")
    if cpus:
        if taskset:
            prefix += [taskset, "--cpu-list", ",".join(str(c) for c in cpus)]
        else:
            left.append(f"run on cores {list(cpus)}")
    if not left:
        return [*prefix, *argv], None
    if "grpc" in sys.modules:
        log.warning("util-linux (setpriv, taskset) is missing and gRPC is loaded: %s will not %s",
                    argv[0], " or ".join(left))
        return [*prefix, *argv], None
    prctl = ctypes.CDLL(None, use_errno=True).prctl if not setpriv else None  # loaded here: the hook only calls it
    pinned = list(cpus) if cpus and not taskset else None

    def hook() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, death_signal)
        if pinned:
            os.sched_setaffinity(0, pinned)

    return [*prefix, *argv], hook
