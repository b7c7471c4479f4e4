"""The task-set recipe (`recipe.yaml`): pinned sdists, where their code and tests live, and bug-drawing knobs."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_RECIPE = Path(__file__).with_name("recipe.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class VendorSdist(_Strict):
    package: str
    """PyPI name of a pure-Python dependency the tests import but the sandbox interpreter lacks."""
    version: str
    """Pinned version."""
    sha256: str
    """sha256 of the sdist; a download that differs is refused."""
    copy_map: dict[str, str] = Field(alias="copy")
    """Folder inside the sdist -> folder inside the task repository."""


class RepoRecipe(_Strict):
    name: str
    """Short repository name: the `embedded://NAME` URL, the bare repo `NAME.git`, and the instance-id prefix."""
    package: str
    """PyPI project name."""
    version: str
    """Pinned version (the SWE-bench `version` field)."""
    sha256: str
    """sha256 of the sdist; a download that differs is refused."""
    source: list[str]
    """Folders or files (relative to the sdist root) whose functions may receive bugs."""
    exclude: list[str] = Field(default_factory=list)
    """Paths under `source` that never receive bugs (tests, generated or trivial modules)."""
    tests: list[str]
    """Test folders or files (relative to the sdist root)."""
    pythonpath: list[str] = Field(default_factory=list)
    """Folders put on PYTHONPATH when the tests run (`src` layouts, vendored dependencies)."""
    vendor: list[VendorSdist] = Field(default_factory=list)
    """Dependencies copied into the repository so that the tests import without network access."""
    split: Literal["train", "validation"] | None = None
    """Every task of this repository goes to this split (a held-out repository); unset, each function's tasks go to
    a split drawn from its hash (`validation_fraction`)."""

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return value

    def test_command(self, pytest_args: list[str], test_files: list[str]) -> str:
        """The shell command the sandbox runs: pytest on `test_files` from the repository root."""
        # A fixed hash seed: tests parametrised over sets (inflection's) otherwise run, and print, in a different
        # order in every process, and the problem statements written from that output must be reproducible.
        env = "PYTHONHASHSEED=0 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "
        if self.pythonpath:
            env += f"PYTHONPATH={':'.join(self.pythonpath)} "
        args = " ".join(shlex.quote(a) for a in [*pytest_args, *test_files])
        return f"{env}python -m pytest {args}"


class Recipe(_Strict):
    recipe_version: int
    """Bumped whenever a change here changes the task set."""
    validation_fraction: float = Field(0.15, ge=0.0, lt=1.0)
    """Share of repository functions whose bugs go to the validation split."""
    max_bugs_per_function: int = Field(2, ge=1)
    """At most this many tasks per function, so that the set spreads over many functions."""
    max_test_files: int = Field(3, ge=1)
    """Test files a task runs: those naming the function most often (SWE-bench runs a task's own test files)."""
    max_fail_fraction: float = Field(0.75, gt=0.0, le=1.0)
    """Reject a bug that fails more than this fraction of the selected tests."""
    pytest_args: list[str]
    """Arguments every test run gets (before the test files)."""
    statement_frames: Literal["tests", "repository"] = "tests"
    """Traceback frames a problem statement shows: `tests` (the test files' only: the bug must be found from the
    failing assertions) or `repository` (the library's too, as a user pasting the whole traceback would: easier
    tasks, whose statements point at the line that raised)."""
    repos: list[RepoRecipe]
    """The task repositories."""

    @field_validator("repos")
    @classmethod
    def _unique(cls, repos: list[RepoRecipe]) -> list[RepoRecipe]:
        names = [r.name for r in repos]
        if len(set(names)) != len(names):
            raise ValueError(f"repos: names must be unique, got {names}")
        return repos

    def repo(self, name: str) -> RepoRecipe:
        for r in self.repos:
            if r.name == name:
                return r
        raise KeyError(f"unknown repository {name!r}; the recipe has {', '.join(r.name for r in self.repos)}")

    def fingerprint(self) -> str:
        """Hash of the recipe content: part of the build manifest, so that a task set says what made it."""
        # Unset repository splits stay out of the dump: the default recipe's fingerprint predates the key.
        dumped = self.model_dump(mode="json", by_alias=True)
        if dumped["statement_frames"] == "tests":  # likewise: the default predates the key
            del dumped["statement_frames"]
        for repo in dumped["repos"]:
            if repo["split"] is None:
                del repo["split"]
        return hashlib.sha256(json.dumps(dumped, separators=(",", ":")).encode()).hexdigest()[:16]


def load_recipe(path: str | Path | None = None) -> Recipe:
    p = Path(path) if path is not None else DEFAULT_RECIPE
    raw = yaml.safe_load(p.read_text())
    try:
        return Recipe.model_validate(raw)
    except ValueError as exc:
        raise ValueError(f"{p}: invalid recipe: {exc}") from exc
