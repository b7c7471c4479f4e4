"""Entry point of the trusted runner:
`python -s -P -S boot.py KEY_FD REPORT_FD TREE [--path P]... [--only NODE_ID]... -- PYTEST_ARGS`
(`--only`: run these collected tests alone, the others deselected).

Order matters, and is the point of this file:
1. read the report key from its pipe and close it (nothing of the tree has run yet);
2. import pytest, its builtin plugins and the report plugin from the runner folder (read-only, outside the tree):
   from now on a module of the tree named `pytest`, `pluggy`, `_pytest` or like any of their submodules cannot stand
   in for them, because the interpreter finds them in `sys.modules`;
3. snapshot pytest's internals (the plugin's `Baseline`);
4. only then put the tree (and the command's PYTHONPATH entries, relative to it) first on `sys.path`, as
   `python -m pytest` would, and run pytest with the plugin registered before any conftest.
`-P` keeps the tree and this folder off `sys.path` at start; `-S` (the isolated mode) keeps the interpreter's
site-packages, and so any installed copy of a task's upstream package, out of reach.
"""

from __future__ import annotations

import os
import sys


def _read_key(fd: int) -> bytes:
    key = b""
    while chunk := os.read(fd, 64):
        key += chunk
    os.close(fd)
    return key


def main(argv: list[str]) -> int:
    key_fd, report_fd, tree = int(argv[0]), int(argv[1]), argv[2]
    rest = argv[3:]
    split = rest.index("--")
    opts, pytest_args = rest[:split], rest[split + 1:]
    values = [(opts[i], opts[i + 1]) for i in range(0, len(opts) - 1, 2)]
    paths = [v for name, v in values if name == "--path"]
    only = [v for name, v in values if name == "--only"]
    key = _read_key(key_fd)
    os.set_inheritable(report_fd, False)  # test subprocesses never get the stream
    runner_site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, runner_site)

    import importlib

    import pytest
    from _pytest.config import default_plugins

    for name in default_plugins:
        importlib.import_module(f"_pytest.{name}")
    from grpo_runner.plugin import ReportPlugin

    plugin = ReportPlugin(report_fd, key, tree, frozenset(only) if only else None)
    del key
    tree = os.path.realpath(tree)
    extra = [p if os.path.isabs(p) else os.path.join(tree, p) for p in paths]
    sys.path[:] = [tree, *extra, *[p for p in sys.path if p != runner_site], runner_site]
    if paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)  # what the command's children would have seen
    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *pytest_args]
    return int(pytest.main(pytest_args, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
