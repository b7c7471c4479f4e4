"""One look at the executors before a run: what their /healthz says about how they grade."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def test_runners(urls: list[str], timeout_s: float = 2.0) -> dict[str, dict[str, str]]:
    """{url: the versions its tests run with} for each executor that answers /healthz within `timeout_s` (all asked
    at once, so a start waits at most that long) with its `test_runner`; one that is not up yet, or predates the
    field, is left out: this is a check, not a dependency."""
    unique = list(dict.fromkeys(u.rstrip("/") for u in urls))
    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:
        answers = pool.map(lambda url: _test_runner(url, timeout_s), unique)
    return {url: runner for url, runner in zip(unique, answers, strict=True) if runner}


def _test_runner(url: str, timeout_s: float) -> dict[str, str] | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as resp:
            health = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while starting or draining still carries the body
        try:
            health = json.loads(exc.read())
        except ValueError:
            return None
    except (OSError, ValueError):
        return None
    return runner_of(health)


def runner_of(health: object) -> dict[str, str] | None:
    """The `test_runner` of a /healthz body ({"python", "pytest"}), or None where it is missing or malformed (an
    executor that predates the field). Read here for the trainer's start-up check and by `SandboxClient`."""
    runner = health.get("test_runner") if isinstance(health, dict) else None
    if not isinstance(runner, dict) or not runner:
        return None
    return {str(k): str(v) for k, v in runner.items()}
