"""Helpers of the computer-use integration tests: tasks, where their targets are, and the browsers' processes."""

from __future__ import annotations

import os
from typing import Any

from envs.computer_use.actions import Click
from envs.computer_use.env import ComputerUseEnvironment, make_computer_tasks
from envs.computer_use.tasks import _gap
from envs.registry import Task
from fleet.config.env import ComputerUseEnvConfig

UID_BASE = 64000  # away from the other suites' ranges (each executor still claims a free range of its own)
UID = 64999  # a browser run directly (not through a session) as this uid, like a session's
CFG = ComputerUseEnvConfig(families=["click_button"], max_actions=4, action_timeout_s=5.0)
ENV = ComputerUseEnvironment(CFG)


def button_task(seed: int = 0) -> Task:
    return make_computer_tasks(CFG, seed, "train", 1)[0]


def payload(task: Task, **over: Any) -> dict[str, Any]:
    return {**ENV.task_to_payload(task), **over}


def click_on(task: Task, label: str) -> Click:
    """The centre of the button labelled `label` (the page's layout: stacked blocks of fixed height, 8 px top)."""
    labels, _ = task.metadata["params"]
    width, height = task.metadata["viewport"]
    row, gap = _gap((width, height), len(labels))
    return Click(width // 2, 8 + labels.index(label) * (row + gap) + row // 2)


def sandbox_pids(session_id: str, *, browser_only: bool = False) -> list[int]:
    """Host pids of one session's sandbox (bwrap, its init, the browser: their command lines carry
    --grpo-session=ID), or of its browser process alone."""
    marker = f"--grpo-session={session_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if marker in argv and (not browser_only or argv[0].endswith(b"chromium")):
                found.append(int(entry))
    return found


def browser_pid(session_id: str) -> int:
    pids = sandbox_pids(session_id, browser_only=True)
    assert len(pids) == 1, pids
    return pids[0]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
