"""Process helpers the tests share (tests/ is on the path: its conftest.py is)."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether `pid` runs: not gone, not a zombie (dead, not yet reaped) nor dying (`X`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
