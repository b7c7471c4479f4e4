"""Default locations. Everything that reads or writes task data also takes an explicit path; these are for runs."""

from __future__ import annotations

from pathlib import Path

from fleet.paths import cache_dir


def default_task_dir() -> Path:
    """The built task set of a run: `tasks` in the cache (`$GRPO_FLEET_CACHE`, else `.cache/` in the checkout)."""
    return cache_dir() / "tasks"


def default_sdist_cache() -> Path:
    """Where downloaded sdists are kept between builds (in the cache, beside the task set)."""
    return cache_dir() / "sdists"


def repos_dir(task_dir: str | Path) -> Path:
    """The bare git repositories of a built task set (`SandboxConfig.repos_root` for `embedded://` URLs)."""
    return Path(task_dir) / "repos"
