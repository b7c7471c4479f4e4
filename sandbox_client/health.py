"""One look at the executors before a run: what their /healthz says about how they grade."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def test_runners(urls: list[str], timeout_s: float = 2.0) -> dict[str, dict[str, str]]:
    """{url: the versions its tests run with} for each executor that answers /healthz now with its `test_runner`
    (one that is not up yet, or predates the field, is left out: this is a check, not a dependency)."""
    found: dict[str, dict[str, str]] = {}
    for url in dict.fromkeys(u.rstrip("/") for u in urls):
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as resp:
                health = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 503 while starting or draining still carries the body
            try:
                health = json.loads(exc.read())
            except ValueError:
                continue
        except (OSError, ValueError):
            continue
        runner = health.get("test_runner") if isinstance(health, dict) else None
        if isinstance(runner, dict) and runner:
            found[url] = {str(k): str(v) for k, v in runner.items()}
    return found
