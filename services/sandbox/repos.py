"""Repo providers: `repo_url` -> a local git repository the executor can materialise working trees from.

Built in: a local path (bare or not), `file://PATH`, and `embedded://NAME` -> `{sandbox.repos_root}/NAME.git` (the
task set's bare repositories). Other schemes plug in with `register_provider("s3", fn)`; a provider only has to
return a local git repository (a mirror it keeps up to date, for instance), never a working tree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from fleet.config.infra import SandboxConfig


class RepoNotFound(LookupError):
    """`repo_url` names no repository this executor can reach: an infrastructure failure, never the patch's fault."""


RepoProvider = Callable[[str, SandboxConfig], Path]
"""`provider(repo_url, cfg) -> path of a local git repository` (raises RepoNotFound)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _is_git_repo(path: Path) -> bool:
    bare = (path / "HEAD").is_file() and (path / "objects").is_dir()
    return bare or (path / ".git").exists()


def _checked(path: Path, url: str) -> Path:
    path = path.resolve()
    if not path.is_dir():
        raise RepoNotFound(f"repository {url!r}: {path} does not exist")
    if not _is_git_repo(path):
        raise RepoNotFound(f"repository {url!r}: {path} is not a git repository")
    return path


def local_provider(url: str, cfg: SandboxConfig) -> Path:
    return _checked(Path(url).expanduser(), url)


def file_provider(url: str, cfg: SandboxConfig) -> Path:
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise RepoNotFound(f"repository {url!r}: file:// URLs must name a local path")
    return _checked(Path(unquote(parsed.path)), url)


def embedded_provider(url: str, cfg: SandboxConfig) -> Path:
    name = url[len("embedded://"):].strip("/")
    if not _NAME.match(name) or ".." in name:
        raise RepoNotFound(f"repository {url!r}: embedded names are [A-Za-z0-9._-]+")
    if cfg.repos_root is None:
        raise RepoNotFound(f"repository {url!r}: sandbox.repos_root is not set (point it at the task set's repos/)")
    root = Path(cfg.repos_root)
    candidates = [root / f"{name}.git", root / name]
    for path in candidates:
        if path.is_dir():
            return _checked(path, url)
    raise RepoNotFound(f"repository {url!r}: no {candidates[0]} (sandbox.repos_root={cfg.repos_root})")


_PROVIDERS: dict[str, RepoProvider] = {"file": file_provider, "embedded": embedded_provider}


def register_provider(scheme: str, provider: RepoProvider) -> None:
    """Make `scheme://...` repo URLs resolve through `provider` (replaces an earlier one of the same scheme)."""
    if not re.match(r"^[a-z][a-z0-9+.-]*$", scheme):
        raise ValueError(f"invalid URL scheme {scheme!r}")
    _PROVIDERS[scheme] = provider


def resolve_repo(url: str, cfg: SandboxConfig) -> Path:
    """The local git repository behind `url`. Plain paths (no `scheme://`) are local repositories."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        return local_provider(url, cfg)
    provider = _PROVIDERS.get(scheme.lower())
    if provider is None:
        known = ", ".join(f"{s}://" for s in sorted(_PROVIDERS))
        raise RepoNotFound(f"repository {url!r}: no provider for {scheme}:// (known: {known}, or a local path)")
    return provider(url, cfg)
