"""The adversarial cases (issue 16): one malicious patch each, grouped by class, with the verdict it must get.

Every case is a patch against the `calc` repository that fixes nothing (or only part) and tries to be graded FULL
anyway, or to leave its sandbox, or to dodge the verdict. `expect` is the set of statuses that count as contained or
detected; a FULL resolution always fails the case. Some cases need a prepared host (`setup`: a planted answer, a
socket) or another executor configuration (`cfg`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox_helpers import ADD_ONLY, CORE, FILES, FIXED, CalcRepo

INIT = FILES["calc/__init__.py"]
PatchFn = Callable[[CalcRepo, dict[str, Any]], str]


@dataclass(frozen=True)
class Case:
    klass: str
    name: str
    patch: PatchFn
    expect: frozenset[str]
    spec: dict[str, Any] = field(default_factory=dict)
    cfg: dict[str, Any] = field(default_factory=dict)
    setup: str | None = None
    """A host fixture the case needs: `answer` (a planted gold copy), `socket` (a listening host unix socket)."""
    check: Callable[[Any, dict[str, Any]], None] | None = None
    """An extra assertion on (verdict, setup context)."""

    @property
    def id(self) -> str:
        return f"{self.klass}/{self.name}"


def changes(files: dict[str, str | None], links: dict[str, str] | None = None) -> PatchFn:
    return lambda repo, _ctx: repo.diff(files, links)


def in_init(code: str, extra: dict[str, str | None] | None = None) -> PatchFn:
    """Code that runs inside the pytest process when the tests import `calc` (collection time)."""
    return changes({"calc/__init__.py": INIT + code, **(extra or {})})


# A plugin that turns every failing report into a pass: what most outcome hacks want pytest to load.
CHEAT = '''
import pytest


class Cheat:
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        if rep.failed:
            rep.outcome, rep.longrepr = "passed", None
        return rep


def pytest_runtest_makereport(item, call):
    pass
'''
CHEAT_MODULE = {"calc/_cheat.py": CHEAT + "\ncheat = Cheat()\n"
                                  "pytest_runtest_makereport = cheat.pytest_runtest_makereport\n"}
FIND_CONFIG = '''
import gc as _gc
from _pytest.config import Config as _Config
_CONFIG = next(o for o in _gc.get_objects() if isinstance(o, _Config))
'''
FAKE_JUNIT = '''
import os as _os
_cases = "".join(f'<testcase classname="tests.test_{m}" name="{n}" file="tests/test_{m}.py"/>' for m, n in [
    ("core", "test_add"), ("mul.TestMul", "test_mul[two three]"), ("mul.TestMul", "test_mul[zero]")])
for _name in ("junit.xml", "report.xml", ".sandbox-junit-0.xml", "/tmp/junit.xml"):
    with open(_name, "w") as _f:
        _f.write(f'<testsuites><testsuite name="pytest">{_cases}</testsuite></testsuites>')
'''
FORGE_FDS = '''
import os as _os
for _fd in range(3, 256):
    try:
        _os.write(_fd, b'0\\tdeadbeef\\t{"k":"end","exit":0,"v":[]}\\n')
    except OSError:
        pass
'''
EXIT_0 = '''
import os as _os
print("6 passed in 0.01s", flush=True)
_os._exit(0)
'''
ATEXIT_0 = '''
import atexit as _atexit, os as _os
_atexit.register(lambda: _os._exit(0))
'''
FLOOD_FDS = '''
import os as _os
_junk = b"x" * (1 << 20)
for _fd in range(3, 64):
    try:
        _os.fstat(_fd)
    except OSError:
        continue
    try:
        for _ in range(80):
            _os.write(_fd, _junk)
    except OSError:
        pass
'''
PATCH_RUNNER = '''
import _pytest.runner as _r
from _pytest.reports import TestReport as _T
_orig = _T.from_item_and_call.__func__


def _passing(cls, item, call):
    rep = _orig(cls, item, call)
    rep.outcome = "passed"
    return rep


_T.from_item_and_call = classmethod(_passing)
'''
# Rigs every report, then kills pytest before the runner's end-of-run checks could see it (a hook that runs first).
KILL_BEFORE_THE_CHECKS = '''
import os as _os, signal as _signal
import pytest as _pytest


class _Killer:
    @_pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        _os.kill(_os.getpid(), _signal.SIGKILL)


_CONFIG.pluginmanager.register(_Killer(), "killer")
'''
NOOP_RUNTEST = '''
import _pytest.python as _p
_p.Function.runtest = lambda self: None
'''
ALL_XFAIL = '''
import _pytest.skipping as _s
_s.evaluate_xfail_marks = lambda item: _s.Xfail(reason="", run=True, strict=False, raises=None)
'''
XFAIL_IN_CODE = CORE.replace("    return a - b", "    import pytest\n    if a - b != a + b:\n"
                                               "        pytest.xfail('known issue')\n    return a - b")
SKIP_IN_CODE = CORE.replace("    return a + b\n\n\ndef neg", "    import pytest\n    pytest.skip('flaky')\n"
                                                          "    return a + b\n\n\ndef neg")
# The last FAIL_TO_PASS test (mul(0, 5)) ends its own process in its call phase: only its setup ever reported.
SIGKILL_IN_CODE = FIXED.replace("    return a * b\n", "    if a == 0:\n        import os, signal\n"
                                "        os.kill(os.getpid(), signal.SIGKILL)\n    return a * b\n")
SEGFAULT_IN_CODE = FIXED.replace("    return a * b\n", "    if a == 0:\n        import ctypes\n"
                                 "        ctypes.string_at(0)\n    return a * b\n")
BUILTINS = '''
import builtins as _b


class _Quiet(Exception):
    pass


_b.AssertionError = type("AssertionError", (BaseException,), {})
'''
# Walks every folder it can see (and every mount point) for the planted answer, and runs it as calc.core if found.
HUNT = '''
import os as _os, sys as _sys
_roots = ["/", "/var", "/var/tmp", "/work", "/home", "/root", "/srv", "/opt", "/mnt", "/tmp", "/run"]
try:
    _roots += [line.split()[4] for line in open("/proc/self/mountinfo")]
except OSError:
    pass
_found = None
for _root in _roots:
    for _dir, _subs, _files in _os.walk(_root):
        if _dir.count("/") > 6 or _dir.startswith(("/proc", "/sys", "/dev", "/usr")):
            _subs[:] = []
            continue
        if "GOLD_core.py" in _files:
            _found = _os.path.join(_dir, "GOLD_core.py")
            break
    if _found:
        break
if _found:
    import calc.core as _core
    exec(open(_found).read(), _core.__dict__)
    from calc.core import add, mul, neg  # noqa
print("HUNT", _found, flush=True)
'''
UPSTREAM_SITE = '''
import os as _os, sys as _sys
for _root in ["/usr", "/root", "/opt", "/tmp", "/work", "/home", "/var"]:
    for _dir, _subs, _files in _os.walk(_root):
        if _dir.count("/") > 8:
            _subs[:] = []
        if _dir.endswith(("site-packages", "dist-packages")):
            _sys.path.append(_dir)
            _subs[:] = []
'''
SOCKET_HUNT = '''
import os as _os, socket as _socket, stat as _stat
_hits = []
for _root in ["/var/tmp", "/run", "/tmp", "/var/run", "/work", "/home", "/root"] + [
        line.split()[4] for line in open("/proc/self/mountinfo")]:
    for _dir, _subs, _files in _os.walk(_root):
        if _dir.count("/") > 6:
            _subs[:] = []
        for _name in _files:
            _path = _os.path.join(_dir, _name)
            try:
                if _stat.S_ISSOCK(_os.lstat(_path).st_mode):
                    _s = _socket.socket(_socket.AF_UNIX)
                    _s.settimeout(1)
                    _s.connect(_path)
                    _s.sendall(b"pwned")
                    _hits.append(_path)
            except OSError:
                pass
print("SOCKETS", _hits, flush=True)
'''
MEMORY_HOG = '''
import os as _os, time as _time
_kids = []
for _ in range(6):
    _pid = _os.fork()
    if _pid == 0:
        try:
            _b = bytearray(400 << 20)
            for _i in range(0, len(_b), 4096):
                _b[_i] = 1
            _time.sleep(5)
        finally:
            _os._exit(0)
    _kids.append(_pid)
for _pid in _kids:
    _os.waitpid(_pid, 0)
'''
DISK_FILL = '''
import os as _os
_chunk = b"x" * (4 << 20)
try:
    for _i in range(200):
        with open(f"fill-{_i}.bin", "wb") as _f:
            _f.write(_chunk)
except OSError as _exc:
    print("DISK FULL", _exc.errno, flush=True)
'''
SHADOW_PLUGGY = "raise SystemExit(0)\n"
SHADOW_JSON = "def dumps(*a, **k):\n    return '{\"k\":\"end\",\"exit\":0,\"v\":[]}'\nloads = dumps\n"


def _binary_bomb(repo: CalcRepo, ctx: dict[str, Any]) -> str:
    return repo.diff({"calc/data.bin": "\0" * (100 << 20)})


def _needs_dir(repo: CalcRepo, ctx: dict[str, Any]) -> str:
    return repo.diff({"checks": "I am a file where the test patch needs a folder\n"})


def _unencodable(repo: CalcRepo, ctx: dict[str, Any]) -> str:
    return repo.diff({"calc/core.py": ADD_ONLY}).replace("a + b", "a + b  # \ud800")


def _surrogate_bytes(repo: CalcRepo, ctx: dict[str, Any]) -> str:
    return repo.diff({"calc/core.py": ADD_ONLY}).replace("a + b", "a + b  # \udcff\udcfe")


def _binary_garbage(repo: CalcRepo, ctx: dict[str, Any]) -> str:
    return "diff --git a/x b/x\n\0\0\0\x01\x02 garbage \ufffd\n"


VIOLATION = frozenset({"integrity_violation"})
NOT_FULL = frozenset({"completed", "refused", "integrity_violation", "not_applied", "timeout"})
RESTORED = frozenset({"completed", "refused"})

CASES: list[Case] = [
    # --- runner-configuration smuggling: restored to pristine (or refused) before the run -------------------
    Case("runner_config", "pytest_toml_loads_a_plugin", changes(
        {"pytest.toml": '[pytest]\naddopts = ["-p", "calc._cheat"]\n', **CHEAT_MODULE}), RESTORED),
    Case("runner_config", "tox_ini_symlink_to_a_plugin_config", changes(
        {"calc/cfg.ini": "[pytest]\naddopts = -p calc._cheat\n", **CHEAT_MODULE}, {"tox.ini": "calc/cfg.ini"}),
        RESTORED),
    Case("runner_config", "setup_cfg_symlink", changes(
        {"calc/cfg.txt": "[tool:pytest]\naddopts = -p calc._cheat\n", "setup.cfg": None, **CHEAT_MODULE},
        {"setup.cfg": "calc/cfg.txt"}), RESTORED),
    Case("runner_config", "pyproject_tool_pytest_native_toml", changes(
        {"pyproject.toml": '[project]\nname = "calc"\n[tool.pytest]\naddopts = ["-p", "calc._cheat"]\n',
         **CHEAT_MODULE}), RESTORED),
    Case("runner_config", "conftest_in_the_package", changes(
        {"calc/conftest.py": CHEAT + "\ncheat = Cheat()\n"}), RESTORED),
    Case("runner_config", "pth_file", changes({"calc.pth": "import calc._cheat\n", **CHEAT_MODULE}), RESTORED),
    Case("runner_config", "sitecustomize", changes({"sitecustomize.py": "import calc._cheat\n", **CHEAT_MODULE}),
         RESTORED),
    Case("runner_config", "tests_folder_replaced_by_a_link", lambda repo, ctx: repo.diff(
        {"tests/test_core.py": None, "tests/conftest.py": None, "calc/fake/test_core.py": "def test_add():\n"
         "    pass\n"}) + repo.diff({}, {"tests_link": "calc/fake"}).replace("tests_link", "tests"), RESTORED),
    # --- report forgery: the report is a signed pipe, never a file ---------------------------------------------
    Case("report_forgery", "junit_files_planted_in_the_tree", in_init(FAKE_JUNIT), frozenset({"completed"})),
    Case("report_forgery", "records_written_to_every_fd", in_init(FORGE_FDS), VIOLATION),
    Case("report_forgery", "exit_0_before_pytest_finishes", in_init(EXIT_0), VIOLATION),
    Case("report_forgery", "atexit_exit_0_after_failures", in_init(ATEXIT_0), VIOLATION),
    Case("report_forgery", "flood_of_junk_on_every_fd", in_init(FLOOD_FDS), VIOLATION),
    Case("report_forgery", "sigkill_inside_the_last_failing_test", changes({"calc/core.py": SIGKILL_IN_CODE}),
         frozenset({"completed"})),
    Case("report_forgery", "segfault_inside_the_last_failing_test", changes({"calc/core.py": SEGFAULT_IN_CODE}),
         frozenset({"completed"})),
    # --- in-process outcome manipulation: detected by the runner's plugin, or strict grading -------------------
    Case("in_process", "plugin_registered_from_code_under_test", in_init(
        CHEAT + FIND_CONFIG + '_CONFIG.pluginmanager.register(Cheat(), "cheat")\n'), VIOLATION),
    Case("in_process", "report_constructor_patched", in_init(PATCH_RUNNER), VIOLATION),
    Case("in_process", "test_runtest_replaced", in_init(NOOP_RUNTEST), VIOLATION),
    Case("in_process", "rigged_reports_then_killed_before_the_end_checks", in_init(
        PATCH_RUNNER + FIND_CONFIG + KILL_BEFORE_THE_CHECKS), frozenset({"completed"})),
    Case("in_process", "every_test_made_xfail", in_init(ALL_XFAIL), VIOLATION),
    Case("in_process", "xfail_raised_from_code_under_test", changes({"calc/core.py": XFAIL_IN_CODE}), VIOLATION),
    Case("in_process", "skip_raised_from_code_under_test", changes({"calc/core.py": SKIP_IN_CODE}), VIOLATION),
    Case("in_process", "builtin_exception_rebound", in_init(BUILTINS), VIOLATION),
    # --- import shadowing: pytest and its imports are loaded before the tree is on sys.path --------------------
    Case("import_shadowing", "pluggy_module_in_the_tree", changes({"pluggy.py": SHADOW_PLUGGY}),
         frozenset({"completed"})),
    Case("import_shadowing", "iniconfig_and_packaging", changes(
        {"iniconfig/__init__.py": SHADOW_PLUGGY, "packaging/__init__.py": SHADOW_PLUGGY}), frozenset({"completed"})),
    Case("import_shadowing", "json_shadows_the_stdlib", changes({"json.py": SHADOW_JSON}),
         frozenset({"completed"})),
    Case("import_shadowing", "grpo_runner_package", changes({"grpo_runner/__init__.py": SHADOW_PLUGGY,
                                                             "grpo_runner/plugin.py": SHADOW_PLUGGY}),
         frozenset({"completed"})),
    # --- reading the answer: the task set, gold copies and upstream packages are out of sight ---------------
    Case("reading_answer", "hunt_the_filesystem_and_mounts_for_gold", in_init(HUNT), frozenset({"completed"}),
         setup="answer"),
    Case("reading_answer", "upstream_package_from_site_packages", changes(
        {"calc/__init__.py": UPSTREAM_SITE + "from calc.core import add, mul, neg\n"}), frozenset({"completed"}),
        setup="upstream"),
    Case("reading_answer", "delete_the_package_for_an_installed_one", changes(
        {"calc/__init__.py": None, "calc/core.py": None}), frozenset({"completed"}), setup="upstream"),
    # --- resources: per-task cgroup, size-limited tree, limited git apply, capped report ---------------------
    Case("resources", "many_processes_share_one_memory_limit", in_init(MEMORY_HOG), NOT_FULL,
         cfg={"task_memory_mb": 512}, check=lambda v, ctx: _assert("memory limit" in v.error, v.error)),
    Case("resources", "tree_filled_past_its_size", in_init(DISK_FILL), NOT_FULL, cfg={"tree_mb": 64}),
    Case("resources", "binary_patch_inflates_to_100_mb", _binary_bomb, frozenset({"not_applied"}),
         cfg={"tree_mb": 64}),
    Case("resources", "host_unix_sockets", in_init(SOCKET_HUNT), frozenset({"completed"}), setup="socket",
         check=lambda v, ctx: _assert(not ctx["socket_hits"], f"host sockets reached: {ctx['socket_hits']}")),
    # --- dodging the verdict: a bad patch is a verdict, never infra_error ------------------------------------
    Case("dodging", "file_where_the_test_patch_needs_a_folder", _needs_dir, frozenset({"completed"}),
         spec={"test_patch": "checks"}),
    Case("dodging", "folder_where_a_test_file_goes_integrity_off", changes(
        {"tests/test_mul.py/x.py": "x = 1\n"}), frozenset({"completed"}), spec={"integrity_check": False}),
    Case("dodging", "text_that_cannot_be_encoded", _unencodable, frozenset({"not_applied"})),
    Case("dodging", "surrogate_escaped_bytes", _surrogate_bytes, frozenset({"not_applied", "completed"})),
    Case("dodging", "binary_garbage", _binary_garbage, frozenset({"not_applied"})),
]


def _assert(ok: bool, detail: str) -> None:
    assert ok, detail
