"""Print the host's pip index settings as uv arguments, one per line (scripts/setup.sh and scripts/lock.sh read them).

uv does not read pip's configuration, and the CPU torch wheel reaches this kind of machine through it (a find-links
folder, extra file:// indexes, a constraints file). Precedence as pip applies it: PIP_* environment variables, then
the [install] section, then [global]. pip merges every index it knows, so uv is told to as well
(`--index-strategy unsafe-best-match`): with uv's default, the first index that lists torch would win.
"""

from __future__ import annotations

import subprocess
import sys

# pip key -> (uv flag, takes several whitespace-separated values)
_KEYS = {
    "index-url": ("--default-index", False),
    "extra-index-url": ("--extra-index-url", True),
    "find-links": ("--find-links", True),
    "constraint": ("--constraint", True),
    "trusted-host": ("--allow-insecure-host", True),
}


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list` lines (`section.key='value'`) -> the value pip would use for each key of `_KEYS`."""
    rank = {":env:": 0, "install": 1, "global": 2}
    best: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if not sep or key not in _KEYS or section not in rank:
            continue
        value = value.strip().strip("'\"")
        if key not in best or rank[section] < best[key][0]:
            best[key] = (rank[section], value)
    return {key: value for key, (_, value) in best.items()}


def uv_args(settings: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for key, value in settings.items():
        flag, many = _KEYS[key]
        for item in value.split() if many else [value]:
            args += [flag, item]
    return args


def main() -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    print("\n".join(uv_args(pip_settings(proc.stdout if proc.returncode == 0 else ""))))


if __name__ == "__main__":
    main()
