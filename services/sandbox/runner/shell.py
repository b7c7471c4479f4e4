"""The report plugin for a `test_command` that is not of the task-set form (any shell command): loaded into every
pytest the command starts through `PYTEST_ADDOPTS=-p grpo_runner.shell`, with the fds in `GRPO_RUNNER_FDS`.

Weaker than `boot.py`, and documented so: pytest starts the usual way (the tree first on `sys.path`, so it can shadow
pytest's own imports), and processes the command runs before pytest could read the key. Only the first pytest of the
command gets the key; a later one reports nothing, so its tests count as not run.
"""

from __future__ import annotations

import os

import pytest

from .plugin import ReportPlugin


def _plugin() -> ReportPlugin | None:
    fds = os.environ.pop("GRPO_RUNNER_FDS", "")
    try:
        key_fd, report_fd = (int(x) for x in fds.split(","))
        key = os.read(key_fd, 64)
        os.close(key_fd)
    except (ValueError, OSError):
        return None
    os.set_inheritable(report_fd, False)
    return ReportPlugin(report_fd, key, os.getcwd()) if key else None


# Made at import (pytest's preparse, before any conftest is imported): the plugin's snapshot is of pytest as loaded.
_PLUGIN = _plugin()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if _PLUGIN is not None and not config.pluginmanager.is_registered(_PLUGIN):
        config.pluginmanager.register(_PLUGIN, "grpo-runner-report")
