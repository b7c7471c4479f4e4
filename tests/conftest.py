"""Shared test settings, and how `make test` spreads the suite over one pytest-xdist worker per core.

Fixtures that start services live next to the tests that use them.

Scheduling (`-n auto --dist loadscope --no-loadscope-reorder`, with the scope of each test given by `lane_of`): a
scope runs on one worker, in order, and scopes are handed out in collection order (tests/e2e first, so the longest
lanes start first).
- `serial`: tests/e2e, whose tests each start a whole fleet sized for the machine: one at a time, on one worker, while
  the other workers take the rest.
- `docker`: what needs the Docker engine (tests/e2e/test_compose.py, the Docker runtime tests), one engine per host
  that its first user starts and stops, and the other image tests, whose session registry
  (tests/integration/images/conftest.py) the Docker runtime tests use too: built once.
- every other module is its own scope, so a module-scoped fixture (a vLLM engine, a test repository) starts once.
The lanes are read from the test ids alone because the controller sees nothing else; xdist's own `xdist_group` mark
does not reach it under pytest 9 (xdist 3.8 writes the group into `item._nodeid`, which pytest 9 no longer reads).
Without xdist (`pytest tests/unit/...`) none of this applies and everything runs in order, as before.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

# Child processes started by tests (services, torchrun) must not fight over the two cores with BLAS threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's own CPU binding (`auto`) pins the model runner of every engine to the same core: on a 2-core host it keeps
# the last core back for the scheduler and binds the one OpenMP thread, and with it all 46 threads of the
# `VLLM::Worker`, to core 0. The chaos fleet's two engines then share core 0 (and, in the suite, with the engine of a
# test on the other xdist worker): its heal test alone took 82-110 s and 148-223 CPU-seconds of the machine pinned,
# 63-65 s and 128-135 CPU-s unpinned (each engine's start 22-34 -> 15 s). Unpinned, the one thread runs where the
# kernel finds room. This also wins over `vllm_cfg.cpu_threads=affinity` (rollout/engine/vllm_engine.py yields to a
# binding in the environment), which no test runs on a real engine.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

# vLLM's processes talk over ZeroMQ sockets named <VLLM_RPC_BASE_PATH>/<uuid> (default: /tmp itself), and an engine
# killed with SIGKILL (the chaos and process-lifetime tests do it on purpose) never removes its own: over a day of
# suite runs on the CI host 1,258 of them had piled up in /tmp. The session's processes, xdist workers and the
# fleets they start alike, inherit one folder of their own, which the process that made it removes when it exits.
if "VLLM_RPC_BASE_PATH" not in os.environ:
    _IPC = tempfile.mkdtemp(prefix="grpo-fleet-ipc-")  # short: a socket's path has at most 107 bytes
    os.environ["VLLM_RPC_BASE_PATH"] = _IPC
    atexit.register(shutil.rmtree, _IPC, ignore_errors=True)

# (prefix of a test id, lane), first match wins.
LANES = (
    ("tests/e2e/test_compose.py::", "docker"),
    ("tests/integration/images/", "docker"),
    ("tests/e2e/", "serial"),
)


def lane_of(nodeid: str) -> str:
    """The xdist scope of the test `nodeid`: its lane (LANES) or else its module."""
    for prefix, lane in LANES:
        if nodeid.startswith(prefix):
            return lane
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return LaneScheduling(config, log)


# benchmarks/suite_timeline.py: when and where each test ran (setup, call and teardown together), one JSON line per
# test appended by the worker that ran it.
TIMELINE = os.environ.get("GRPO_FLEET_TEST_TIMELINE")


if TIMELINE:  # defined only then: an ordinary run wraps no test
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        start = time.time()
        yield
        with open(TIMELINE, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "start": start, "end": time.time()}) + "\n")
