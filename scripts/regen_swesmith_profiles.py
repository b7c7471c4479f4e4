"""Regenerate `envs/swe/harnesses/data/swesmith_profiles.json` from an installed or unzipped swesmith.

    .venv/bin/python scripts/regen_swesmith_profiles.py --swesmith /tmp/sb41/smith [--out PATH]

`--swesmith` is the folder holding the `swesmith` package (e.g. the 0.0.9 wheel unzipped: `pip download --no-deps
swesmith==0.0.9 && unzip`). Each registered `RepoProfile` becomes one entry: the image name its harness runs
(`image_name`, arch pinned to x86_64: the harness creates every container with `platform="linux/x86_64"`), its
`test_cmd`, how `get_test_files` picks the files it appends and restores, and the log parser as a registered name
(`services/sandbox/images/parsers/swesmith.py`). A profile whose parser or test-file selection is not ported is kept
with a `refused` reason, so the loader names it instead of grading it with the wrong command.

swesmith 0.0.9 imports swebench 4 names that swebench 5 dropped (`DOCKER_USER`, `KEY_INSTANCE_ID`,
`harness.dockerfiles`); only Docker-side code uses them, so they are filled with swebench 4's values before import.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "envs/swe/harnesses/data/swesmith_profiles.json"
# swebench 4.x's values of the names swesmith 0.0.9 imports and swebench 5 no longer has.
_SWEBENCH4 = {"DOCKER_USER": "root", "DOCKER_WORKDIR": "/testbed", "DOCKER_PATCH": "/tmp/patch.diff",
              "KEY_INSTANCE_ID": "instance_id", "KEY_MODEL": "model_name_or_path", "KEY_PREDICTION": "model_patch",
              "UTF8": "utf-8"}
_DELEGATE = re.compile(r"^\s*return\s+(\w+)\(log\)\s*$", re.MULTILINE)
# get_test_files implementations the loader reproduces: by the class that defines them.
_TEST_FILES = {"RepoProfile": "none", "PythonProfile": "pytest_ids", "GoProfile": "go_funcs"}


def _shim_swebench() -> None:
    import swebench.harness.constants as constants

    def missing(name: str) -> Any:
        if name in _SWEBENCH4:
            return _SWEBENCH4[name]
        raise AttributeError(name)

    # PEP 562: `from module import name` falls back to the module's __getattr__.
    constants.__getattr__ = missing
    if "swebench.harness.dockerfiles" not in sys.modules:
        try:
            import swebench.harness.dockerfiles  # noqa: F401
        except ImportError:
            stub = types.ModuleType("swebench.harness.dockerfiles")
            stub.get_dockerfile_env = lambda *a, **k: ""  # type: ignore[attr-defined]
            sys.modules["swebench.harness.dockerfiles"] = stub


def load_registry(swesmith_root: Path) -> Any:
    sys.path.insert(0, str(swesmith_root))
    _shim_swebench()
    from swesmith.profiles import registry

    return registry


def _defined_by(cls: type, attr: str) -> type:
    return next(k for k in cls.__mro__ if attr in vars(k))


def parser_source(cls: type, ported: dict[str, str]) -> str:
    """`Class.log_parser`, or `module.function` where the profile's parser only returns that function's result; a
    function whose source is character for character a ported one's (typescript.py copies javascript.py's) is
    named as that one."""
    owner = _defined_by(cls, "log_parser")
    method = vars(owner)["log_parser"]
    source = inspect.getsource(method)
    match = _DELEGATE.search(source)
    if not match or len(source.strip().splitlines()) > 2:
        return f"{owner.__name__}.log_parser"
    module = sys.modules[owner.__module__]
    name = f"{module.__name__.rsplit('.', 1)[-1]}.{match.group(1)}"
    func = getattr(module, match.group(1), None)
    if func is None:  # imported inside the method: not one of the shared parsers
        return name
    text = inspect.getsource(func)
    for known in ported:
        mod, _, fn = known.partition(".")
        other = sys.modules.get(f"swesmith.profiles.{mod}")
        if other is not None and hasattr(other, fn) and inspect.getsource(getattr(other, fn)) == text:
            return known
    return name


def profile_entry(profile: Any, ported: dict[str, str]) -> dict[str, Any]:
    cls = type(profile)
    profile.arch = "x86_64"
    entry: dict[str, Any] = {
        "language": cls.__module__.rsplit(".", 1)[-1], "owner": profile.owner, "repo": profile.repo,
        "commit": profile.commit, "mirror_name": profile.mirror_name, "image_name": profile.image_name,
        "test_cmd": profile.test_cmd, "min_testing": bool(profile.min_testing), "timeout": profile.timeout,
    }
    source = parser_source(cls, ported)
    test_files = _TEST_FILES.get(_defined_by(cls, "get_test_files").__name__)
    cmd_owner = _defined_by(cls, "get_test_cmd").__name__
    if source in ported:
        entry["log_parser"] = ported[source]
    reasons = [] if source in ported else [f"log parser {source} not ported"]
    if test_files is None:
        reasons.append(f"test-file selection {_defined_by(cls, 'get_test_files').__name__}.get_test_files not ported")
    if cmd_owner != "RepoProfile":
        reasons.append(f"test command {cmd_owner}.get_test_cmd not ported")
    if profile.min_testing and test_files not in ("none", "pytest_ids"):
        reasons.append("min_testing with a run-time test-file selection not ported")
    entry["test_files"] = test_files or "unported"
    if reasons:
        entry["refused"] = "; ".join(reasons)
    return entry


def build(swesmith_root: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from services.sandbox.images.parsers.swesmith import PORTED_FROM

    registry = load_registry(swesmith_root)
    import swesmith.constants as sc

    profiles = {p.repo_name: profile_entry(p, PORTED_FROM) for p in registry.values()}
    try:
        version = metadata.version("swesmith")
    except metadata.PackageNotFoundError:
        version = "unknown"
    dist = next(swesmith_root.glob("swesmith-*.dist-info"), None)
    if dist is not None:
        version = dist.name.removeprefix("swesmith-").removesuffix(".dist-info")
    return {"swesmith_version": version, "source": f"swesmith {version} wheel (PyPI), swesmith/profiles/*.py",
            "org_gh": sc.ORG_NAME_GH, "org_dh": sc.ORG_NAME_DH,
            "profiles": dict(sorted(profiles.items()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--swesmith", type=Path, required=True, help="folder holding the swesmith package")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = build(args.swesmith.resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    refused = sum("refused" in p for p in data["profiles"].values())
    print(f"{args.out}: {len(data['profiles'])} profiles of swesmith {data['swesmith_version']}, {refused} refused")


if __name__ == "__main__":
    main()
