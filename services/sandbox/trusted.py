"""The trusted runner folder, and the command line that starts pytest through it.

`TrustedRunner.build` makes, once per executor, a read-only folder outside every task tree:

    ROOT/site/grpo_runner/   the runner (`services/sandbox/runner/`: boot, report plugin, stream protocol)
    ROOT/site/pytest, _pytest, pluggy, ...   copies of the test interpreter's `sandbox.runner_packages` (isolated mode)
    ROOT/bin/python          the interpreter the tests see on PATH

In the isolated mode (`sandbox.isolated_site`, default) the tests run on the base interpreter with `-S`: no
site-packages at all, only the standard library, the runner packages and the tree, so no installed copy of a task's
upstream package can stand in for the tree's (the sandbox also hides every site-packages folder, see `bwrap.py`).

`pytest_command` recognises the task-set form of `test_command`, `[VAR=value ...] python -m pytest ARGS`, so that it
runs through the runner like the default command; any other command runs as a shell command, graded by its exit
status alone (it produces no per-test report).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.contracts.sandbox import TaskSpec
from services.sandbox.runner import testpaths

RUNNER_SOURCE = Path(__file__).resolve().parent / "runner"
# Environment variables the runner's interpreter may see at start: anything else named PYTHON* (PYTHONPATH,
# PYTHONHOME, PYTHONSTARTUP...) could make it import from the tree before the runner has run.
_START_ENV = frozenset({"PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONIOENCODING"})
_PROBE = """
import importlib.util, json, os, site, sys
out = {"base": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
       "base_prefix": os.path.realpath(sys.base_prefix),
       "site": site.getsitepackages() + site.getsitepackages([sys.base_prefix, sys.base_exec_prefix])
               + [site.getusersitepackages()], "packages": {}, "config": None}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is not None:
        out["packages"][name] = list(spec.submodule_search_locations or []) or [spec.origin]
out["versions"] = {"python": ".".join(map(str, sys.version_info[:3]))}
try:
    import importlib.metadata
    out["versions"]["pytest"] = importlib.metadata.version("pytest")
except Exception:
    pass
try:
    from _pytest.config.findpaths import CONFIG_LOADERS_BY_NAME
    out["config"] = sorted(CONFIG_LOADERS_BY_NAME)
except ImportError:
    pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class PytestCommand:
    """`[VAR=value ...] python -m pytest ARGS`: the environment assignments, PYTHONPATH entries and pytest args."""

    env: dict[str, str]
    paths: list[str]
    args: list[str]


def pytest_command(command: str) -> PytestCommand | None:
    """The parts of a `test_command` of the task-set form, or None for any other shell command."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    env: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if len(words) < 3 or words[0] not in ("python", "python3") or words[1:3] != ["-m", "pytest"]:
        return None
    if any(w in ("|", "&&", "||", ";", "&", ">", "<") or "$" in w or "`" in w for w in words):
        return None
    paths = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    return PytestCommand(env=env, paths=paths, args=words[3:])


@dataclass
class TrustedRunner:
    root: Path
    python: str
    """The interpreter the runner starts (the base interpreter in the isolated mode)."""
    isolated: bool
    config_names: frozenset[str]
    """Every file name the installed pytest reads configuration from."""
    prefixes: tuple[str, ...] = ()
    """Host folders the interpreter needs inside the sandbox (bound read-only)."""
    hidden_site: list[str] = field(default_factory=list)
    """site-packages folders the sandbox hides (isolated mode)."""
    versions: dict[str, str] = field(default_factory=dict)
    """{"python": "3.11.7", "pytest": "9.2.0"}: what a test's node id depends on. pytest names parametrised tests,
    and its rules change between releases (9.0 names a string parameter longer than 100 characters `argname<index>`
    where 8.x spells it out), so a task set's FAIL_TO_PASS ids hold only for the pytest that made them."""

    @property
    def site(self) -> Path:
        return self.root / "site"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @classmethod
    async def build(cls, python: str, prefixes: tuple[str, ...], *, isolated: bool,
                    packages: list[str]) -> TrustedRunner:
        """Probe `python`, copy the runner (and in the isolated mode the runner packages) into a fresh folder."""
        probe = await _probe(python, packages)
        missing = sorted(set(packages) - set(probe["packages"]) - {"py"})
        if isolated and missing:
            raise RuntimeError(f"sandbox.runner_packages: {', '.join(missing)} not importable by {python}")
        root = Path(tempfile.mkdtemp(prefix="grpo-runner-"))
        try:
            await asyncio.to_thread(_populate, root, probe["packages"] if isolated else {})
            exe = probe["base"] if isolated else python
            await _compile(exe, root / "site")
            os.symlink(exe, root / "bin" / "python")
            os.symlink(exe, root / "bin" / "python3")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        names = frozenset(probe["config"] or testpaths.CONFIG_NAMES) | testpaths.CONFIG_NAMES
        hidden = await asyncio.to_thread(_site_folders, probe) if isolated else []
        if isolated:
            prefixes = (probe["base_prefix"], os.path.dirname(exe))
        return cls(root, exe, isolated, names, tuple(dict.fromkeys(prefixes)), hidden, probe["versions"])

    def argv(self, *, key_fd: int, report_fd: int, tree: Path, paths: list[str], args: list[str],
             only: list[str] | None = None) -> list[str]:
        flags = ["-s", "-P", "-S"] if self.isolated else ["-s", "-P"]
        opts = [x for p in paths for x in ("--path", p)] + [x for t in only or [] for x in ("--only", t)]
        return [self.python, *flags, str(self.site / "grpo_runner" / "boot.py"), str(key_fd), str(report_fd),
                str(tree), *opts, "--", *args]

    def test_command(self, spec: TaskSpec, tree: Path, key_fd: int, report_fd: int, *,
                     disable_autoload: bool, only: list[str] | None = None,
                     tracebacks: bool = True) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) of a task's test run: pytest through this runner, or a shell command that is not of
        the task-set form, in which any pytest the shell starts loads the report plugin (weaker: see
        runner/shell.py). Every form streams a signed report. `only`: the same command, running these tests alone
        (the runner's forms only: see `runs_tests_itself`); without `tracebacks`, that run formats none (`--tb=no`
        after the command's options: pytest takes the last `--tb`)."""
        quiet = ["--tb=no"] if only is not None and not tracebacks else []
        if spec.test_command is not None:
            parsed = pytest_command(spec.test_command)
            if parsed is None:
                if only is not None:
                    raise ValueError("a shell test command cannot run a subset of its tests")
                env = {"PYTEST_ADDOPTS": "-p grpo_runner.shell", "GRPO_RUNNER_FDS": f"{key_fd},{report_fd}"}
                return ["/bin/sh", "-c", spec.test_command], env
            # Before a `--`, after which pytest reads only paths.
            cut = parsed.args.index("--") if "--" in parsed.args else len(parsed.args)
            argv = self.argv(key_fd=key_fd, report_fd=report_fd, tree=tree, paths=parsed.paths,
                             args=[*parsed.args[:cut], *quiet, *parsed.args[cut:]], only=only)
            return argv, self.start_env(parsed.env)
        env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if disable_autoload else {}
        files = sorted({t.split("::", 1)[0] for t in [*spec.fail_to_pass, *spec.pass_to_pass]})
        args = ["-p", "no:cacheprovider", "-q", "-rfE", "--tb=short", *files, *quiet]
        return self.argv(key_fd=key_fd, report_fd=report_fd, tree=tree, paths=[], args=args, only=only), env

    @staticmethod
    def runs_tests_itself(spec: TaskSpec) -> bool:
        """Whether the runner starts pytest itself for `spec` (and so can run a subset of its tests)."""
        return spec.test_command is None or pytest_command(spec.test_command) is not None

    @staticmethod
    def start_env(env: dict[str, str]) -> dict[str, str]:
        """`env` without the PYTHON* variables that act before the runner has run."""
        return {k: v for k, v in env.items() if not k.startswith("PYTHON") or k in _START_ENV}

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


async def _probe(python: str, packages: list[str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(python, "-I", "-c", _PROBE, *packages, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"sandbox.python={python!r} cannot be probed: {err.decode(errors='replace')[-300:]}")
    result: dict[str, Any] = json.loads(out)
    return result


async def _compile(python: str, site: Path) -> None:
    """Bytecode for whatever came without it (the runner itself), by the interpreter that will run it."""
    proc = await asyncio.create_subprocess_exec(python, "-I", "-m", "compileall", "-q", str(site),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"cannot compile the runner folder with {python}: {err.decode(errors='replace')[-300:]}")


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link where the filesystem allows (starting an executor costs ~10 ms, not a copy of pygments), else a
    copy. Either way the sandbox sees the files read-only, through the runner folder's own bind."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _populate(root: Path, packages: dict[str, list[str]]) -> None:
    site = root / "site"
    (root / "bin").mkdir()
    shutil.copytree(RUNNER_SOURCE, site / "grpo_runner", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # The packages' bytecode comes along: the tests run with PYTHONDONTWRITEBYTECODE from a read-only folder, and
    # compiling pytest from source on every run costs ~0.2 s.
    for locations in packages.values():
        source = Path(locations[0])
        if source.is_dir():
            shutil.copytree(source, site / source.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(source), str(site / source.name))
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        if Path(dirpath).is_relative_to(site / "grpo_runner"):
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)


def _site_folders(probe: dict[str, Any]) -> list[str]:
    """Every site-packages / dist-packages folder of this host's Pythons that exists: hidden in the isolated mode.
    The base interpreter's own (a pyenv or uv Python under a venv) counts too: the runner starts it with `-S`, but a
    session's or a shell `test_command`'s plain `python` is that interpreter, and its `site` would add them."""
    found = {os.path.realpath(p) for p in probe["site"]}
    for base in ("/usr/lib", "/usr/local/lib", "/usr/lib64"):
        for entry in Path(base).glob("python3*/*-packages") if Path(base).is_dir() else []:
            found.add(os.path.realpath(entry))
    for entry in Path("/usr/lib/python3").glob("dist-packages"):
        found.add(os.path.realpath(entry))
    return sorted(p for p in found if os.path.isdir(p))

