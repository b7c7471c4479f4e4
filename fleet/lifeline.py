"""No process a service starts outlives it, even when the service is SIGKILLed (issue 37).

A service's children are not all its own to configure: vLLM spawns its `EngineCore` (and `Worker`) processes
through multiprocessing, the sandbox starts runners, Chromium and skopeo, and a SIGKILL runs no handler of the
service. So each service starts a *lifeline* first: a tiny guard process (this file, run as a script on the bare
interpreter: stdlib only, ~15 ms to start, a few MB) that holds a pidfd of the service and, until the service
exits, notes its descendants from /proc every `SCAN_S` seconds. When the service is gone -- however it went -- the
guard SIGKILLs what is left of it:

* every descendant it noted that still runs (matched by start time, so a reused pid is never hit), and whatever
  those have started since (their children still name them as parent after the service's death reparented them);
  this catches processes that left the service's process group (`setsid`, `bwrap --new-session`);
* the service's whole process group, when the service leads it (`grpo-fleet up` starts each service in its own
  session; a shell starts each job in its own group): that also catches a child started after the last scan.
  A group the service does not lead (a script without job control) is never signalled: it holds the service's
  caller too.

Containers and pods need none of this (their PID namespace dies with its first process), but the same service run
by hand or under another supervisor does; the launcher's own group kill (launch/supervisor.py) is the second line.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

SCAN_S = 1.0
"""How often the guard notes the service's descendants (a child younger than this escapes a guard whose service
does not lead its process group)."""


def hold_descendants() -> subprocess.Popen[bytes] | None:
    """Start the guard of this process (idempotent per process). Returns it, or None where it cannot run (no pidfd:
    Linux < 5.3, or not Linux)."""
    global _guard
    if _guard is not None and _guard[0] == os.getpid():
        return _guard[1]
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/proc/self"):
        return None
    # -I -S: no site-packages, no environment-driven imports: the guard depends on nothing that could break it.
    # stdin closed; stdout/stderr shared with the service, so its one line lands in the service's log.
    proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                            stdin=subprocess.DEVNULL, close_fds=True)
    _guard = (os.getpid(), proc)
    return proc


_guard: tuple[int, subprocess.Popen[bytes]] | None = None


def _stat(pid: int) -> tuple[int, int, int, str] | None:
    """(ppid, pgid, start time in ticks, comm) of a process, or None once it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm, rest = raw[raw.index("(") + 1: raw.rindex(")")], raw[raw.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[2]), int(rest[19]), comm


def _table() -> dict[int, tuple[int, int, int, str]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            out[int(name)] = st
    return out


def _descendants(roots: set[int], table: dict[int, tuple[int, int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def guard(service: int) -> int:
    """The guard's body: wait for `service` to exit, noting its descendants, then kill them. Returns 0."""
    me = os.getpid()
    try:
        fd = os.pidfd_open(service)
        leads_group = os.getpgid(service) == service
    except OSError:  # gone already
        return 0
    noted: dict[int, int] = {}  # pid -> start time
    while not select.select([fd], [], [], SCAN_S)[0]:
        table = _table()
        for pid in _descendants({service}, table) - {me}:
            noted[pid] = table[pid][2]
    table = _table()
    alive = {pid for pid, start in noted.items() if pid in table and table[pid][2] == start}
    victims = (alive | _descendants(alive, table)) - {me}
    if victims:
        names = ", ".join(f"{table[p][3]} {p}" for p in sorted(victims))
        print(f"lifeline: process {service} is gone; killing what it left: {names}", file=sys.stderr, flush=True)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if leads_group:  # last: the group may include this guard
        try:
            os.killpg(service, signal.SIGKILL)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(guard(int(sys.argv[1])))
