"""One test run per tree (`sandbox.tree_cache_size`): verdicts keyed by the tree their tests ran on, so that answers
whose diffs differ but leave the same files share one run (docs/services/sandbox.md, step 10)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from fleet.contracts.sandbox import TaskSpec, Verdict
from fleet.singleflight import SingleFlight


def tree_key(spec: TaskSpec, tree_id: str) -> str:
    """A run's cache key: the tree its tests run on and everything else of the spec but the agent's patch (tests,
    command, time limit), whose effect the tree already holds."""
    rest = {k: v for k, v in dataclasses.asdict(spec).items() if k != "patch"}
    return hashlib.sha256(json.dumps([tree_id, rest], sort_keys=True).encode()).hexdigest()


class TreeCache(SingleFlight[Verdict]):
    """`size` verdicts by tree key; only completed runs are kept (a timeout depends on the executor's load, an
    infrastructure failure on nothing the patch did)."""

    def __init__(self, size: int) -> None:
        super().__init__(size, keep=lambda v: v.status == "completed")
