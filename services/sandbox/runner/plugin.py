"""The runner's pytest plugin: streams every outcome to the executor and checks, at the end, that nothing the tests
imported altered how outcomes were made.

Registered before any conftest or test module is imported, so its snapshot (`Baseline`) is of pytest as installed.
What it reports as a violation (each one becomes the verdict `integrity_violation`):
- a plugin registered while the tests ran that is neither a conftest nor named by one (`pytest_plugins`);
- a hook implementation, a pytest internal that decides outcomes, a builtin exception, or a test function whose code
  or identity changed after the snapshot (monkeypatching pytest from code under test);
- a skip or xfail raised from code that is not a test file (code under test turning its own failure into one);
- a test module or the runner's own modules replaced in `sys.modules`.
Code that reads this process's memory can defeat any in-process check; the threat model in docs/services/sandbox.md
says so, and the executor's checks (signature, sequence, exit status) do not depend on this plugin's good health.
"""

from __future__ import annotations

import builtins
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest
from _pytest import main as pytest_main
from _pytest import outcomes, python, reports, runner, skipping

from . import protocol
from .testpaths import is_test_path

_write = os.write  # bound before the tree's code runs
_MISSING = object()
# Where hooks registered while the tests run may come from: pytest, pluggy and this runner, as installed.
_TRUSTED_DIRS = tuple(os.path.dirname(os.path.realpath(m.__file__ or "")) + os.sep
                      for m in (pytest_main, pluggy, sys.modules[__package__ or "grpo_runner"]))
# Objects whose replacement would change outcomes: (owner, attribute names).
_GUARDED: list[tuple[object, tuple[str, ...]]] = [
    (runner, ("call_and_report", "runtestprotocol", "call_runtest_hook", "check_interactive_exception",
              "pytest_runtest_makereport", "pytest_runtest_call", "pytest_runtest_protocol")),
    (runner.CallInfo, ("from_call",)),
    (reports.TestReport, ("from_item_and_call", "__init__")),
    (reports.BaseReport, ("passed", "failed", "skipped")),
    (skipping, ("evaluate_xfail_marks", "evaluate_skip_marks", "pytest_runtest_makereport", "pytest_runtest_call",
                "pytest_runtest_setup")),
    (outcomes, ("skip", "fail", "xfail", "exit", "importorskip", "Skipped", "Failed", "XFailed", "Exit",
                "OutcomeException")),
    (python, ("pytest_pyfunc_call",)),
    (python.Function, ("runtest", "setup", "_getobj")),
    (pytest_main.Session, ("perform_collect", "pytest_runtest_logreport", "pytest_collectreport")),
    (pytest_main, ("pytest_runtestloop", "wrap_session")),
    (pluggy.HookCaller, ("__call__", "_hookexec", "get_hookimpls")),
    (pluggy.PluginManager, ("_hookexec", "register")),
    (pytest, ("skip", "fail", "xfail", "exit", "main")),
    (os, ("_exit", "write", "fork")),
    (sys, ("exit",)),
]
_GUARDED_BUILTINS = ("__import__", "isinstance", "issubclass", "getattr", "type", "super", "BaseException",
                     "Exception", "AssertionError", "SystemExit", "KeyboardInterrupt", "ImportError")


def _code(obj: object) -> object:
    func = getattr(obj, "__func__", obj)
    for name in ("fget", "__wrapped__"):
        func = getattr(func, name, func)
    return getattr(func, "__code__", None)


class Baseline:
    """Identities and code objects of everything `_GUARDED` names, taken before the tree's code runs."""

    def __init__(self, extra: list[tuple[object, tuple[str, ...]]]) -> None:
        self.objects: dict[str, tuple[object, object]] = {}
        for owner, names in [*_GUARDED, *extra]:
            label = getattr(owner, "__name__", type(owner).__name__)
            for name in names:
                value = owner.__dict__.get(name, getattr(owner, name, None)) if isinstance(owner, type) \
                    else getattr(owner, name, None)
                self.objects[f"{label}.{name}"] = (value, _code(value))
        self._owners = [(owner, names) for owner, names in [*_GUARDED, *extra]]
        self.builtins = {name: getattr(builtins, name) for name in _GUARDED_BUILTINS}
        self.modules = {name: mod for name, mod in sys.modules.items()
                        if name.split(".")[0] in ("pytest", "_pytest", "pluggy", __package__)}

    def changes(self) -> Iterator[str]:
        for owner, names in self._owners:
            label = getattr(owner, "__name__", type(owner).__name__)
            for name in names:
                value = owner.__dict__.get(name, getattr(owner, name, None)) if isinstance(owner, type) \
                    else getattr(owner, name, None)
                old, code = self.objects[f"{label}.{name}"]
                if value is not old or _code(value) is not code:
                    yield f"{label}.{name} was replaced while the tests ran"
        for name, value in self.builtins.items():
            if getattr(builtins, name, None) is not value:
                yield f"builtins.{name} was replaced while the tests ran"
        for name, mod in self.modules.items():
            if sys.modules.get(name, mod) is not mod:
                yield f"module {name} was replaced in sys.modules"


class ReportPlugin:
    """Streams outcomes over `fd`, signed with `key`; see `protocol`."""

    def __init__(self, fd: int, key: bytes, tree: str, only: frozenset[str] | None = None) -> None:
        self._fd, self._key, self._seq = fd, key, 0
        self._only = only
        """Node ids to run (`--only`; None: every test collected): the others are deselected."""
        self._tree = os.path.realpath(tree)
        self._violations: list[str] = []
        self._plugins_at_start: set[int] = set()
        self._hooks_at_start: dict[int, object] = {}
        self._functions: dict[str, tuple[object, object]] = {}
        self._calling: set[str] = set()
        """Tests whose call phase runs now: a report made meanwhile is one of their subtests (pytest >= 9's `subtests`
        fixture, unittest's `subTest`), not a second call phase."""
        self._pm: pluggy.PluginManager | None = None
        own = tuple(n for n, v in vars(type(self)).items() if callable(v) and not n.startswith("__"))
        self._baseline = Baseline([(type(self), own),
                                   (protocol, ("encode", "encode_payload", "test_payload", "mac", "_dump"))])
        self._emit({"k": "start", "pytest": pytest.__version__, "pid": os.getpid()})

    def _emit(self, record: dict[str, Any] | str) -> None:
        """Write one record (a dict, or a payload already made by `protocol.test_payload`)."""
        if isinstance(record, str):
            data = protocol.encode_payload(self._key, self._seq, record)
        else:
            data = protocol.encode(self._key, self._seq, record)
        self._seq += 1
        view = memoryview(data)
        while view:
            view = view[_write(self._fd, view):]

    def _violation(self, why: str) -> None:
        if why not in self._violations and len(self._violations) < 50:
            self._violations.append(why)

    # ---- snapshot once the initial conftests and command-line plugins are in --------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        pm = self._pm = session.config.pluginmanager
        self._plugins_at_start = {id(p) for p in pm.get_plugins()}
        for impl in self._hookimpls(pm):
            self._hooks_at_start[id(impl.function)] = _code(impl.function)

    @staticmethod
    def _hookimpls(pm: pluggy.PluginManager) -> Iterator[Any]:
        for name in dir(pm.hook):
            caller = getattr(pm.hook, name, None)
            if isinstance(caller, pluggy.HookCaller):
                yield from caller.get_hookimpls()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            obj = getattr(item, "obj", None) if isinstance(item, python.Function) else None
            if obj is not None:
                self._functions[item.nodeid] = (obj, _code(obj))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> Generator[None, object, object]:
        # The outermost wrapper: it deselects after every conftest's own selection. A conftest that brings the
        # others back only makes the run longer: the executor grades the tests it asked for, and a first run
        # whose FAIL_TO_PASS tests did not all run and fail is followed by the full one.
        result = yield
        if self._only is not None:
            dropped = [item for item in items if item.nodeid not in self._only]
            if dropped:
                items[:] = [item for item in items if item.nodeid in self._only]
                config.hook.pytest_deselected(items=dropped)
        return result

    # ---- outcomes ------------------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._emit({"k": "collect", "id": report.nodeid})

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        recorded = self._functions.get(item.nodeid)
        obj = getattr(item, "obj", None)
        if recorded is not None and (obj is not recorded[0] or _code(obj) is not recorded[1]):
            self._violation(f"the test function of {item.nodeid} was replaced before it ran")
        self._calling.add(item.nodeid)
        try:
            return (yield)
        finally:
            self._calling.discard(item.nodeid)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.excinfo is not None and call.excinfo.errisinstance((outcomes.Skipped, outcomes.XFailed)):
            origin = self._origin(call.excinfo.tb)
            if origin is not None and not is_test_path(origin):
                self._violation(f"{item.nodeid}: {call.excinfo.typename} raised from {origin}, not from a test")
        when = "subtest" if report.when == "call" and item.nodeid in self._calling else report.when
        self._emit(protocol.test_payload(report.nodeid, when, report.outcome, hasattr(report, "wasxfail")))
        return report

    def _origin(self, tb: Any) -> str | None:
        """The tree file, relative, of the innermost frame in the tree on the way to a raise."""
        found = None
        while tb is not None:
            path = os.path.realpath(tb.tb_frame.f_code.co_filename)
            if path.startswith(self._tree + os.sep):
                found = os.path.relpath(path, self._tree)
            tb = tb.tb_next
        return found

    # ---- the end: in-process checks, then the final record ----------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        for why in self._checks():
            self._violation(why)
        self._emit({"k": "end", "exit": int(exitstatus), "v": self._violations})

    def _checks(self) -> Iterator[str]:
        yield from self._baseline.changes()
        shadowed = sorted(n for n in vars(self) if n in vars(type(self)))
        if shadowed:
            yield f"the runner's plugin was altered ({', '.join(shadowed)})"
        pm = self._pm
        if pm is None:
            yield "the session started without the runner's plugin"
            return
        named = self._named_plugins(pm)
        for impl in self._hookimpls(pm):
            where = self._hook_file(impl.function)
            name = f"{impl.plugin_name}.{getattr(impl.function, '__name__', '?')}"
            start = self._hooks_at_start.get(id(impl.function), _MISSING)
            if start is not _MISSING and _code(impl.function) is not start:
                yield f"hook {name} was changed while the tests ran"
            if where.startswith(self._tree + os.sep):
                rel = os.path.relpath(where, self._tree)
                if not is_test_path(rel) and getattr(impl.plugin, "__name__", None) not in named:
                    yield f"hook {name} comes from {rel}, which is neither a test file nor a conftest"
            elif start is _MISSING and not where.startswith(_TRUSTED_DIRS):
                yield f"hook {name} from {where} was registered while the tests ran"

    @staticmethod
    def _hook_file(function: object) -> str:
        code = _code(function)
        return os.path.realpath(getattr(code, "co_filename", "") or "?")

    def _named_plugins(self, pm: pluggy.PluginManager) -> set[str]:
        """Modules the (pristine) conftests ask for with `pytest_plugins`."""
        named: set[str] = set()
        for module in pm.get_plugins():
            if self._is_conftest(module):
                spec = getattr(module, "pytest_plugins", ())
                named.update([spec] if isinstance(spec, str) else [str(s) for s in spec])
        return named

    def _is_conftest(self, plugin: object) -> bool:
        file = getattr(plugin, "__file__", None)
        return isinstance(file, str) and Path(file).name == "conftest.py" and \
            os.path.realpath(file).startswith(self._tree + os.sep)

