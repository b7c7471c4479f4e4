"""A rollout worker's GetStatus reports its multi-turn episodes (in-process tool environments here), summed over
its runners: what `grpo-fleet status` shows under the worker's line."""

from __future__ import annotations

import asyncio
from typing import Any

from fleet.config import MasterConfig
from grpofleet.v1 import rollout_worker_pb2
from launch.status import episode_lines
from rollout.servicer import RolloutWorkerServicer
from rollout.worker import Decoder, RolloutWorker


def _worker() -> RolloutWorker:
    none: Any = None
    return RolloutWorker(MasterConfig(), "w0", "127.0.0.1:1", none, none, none, Decoder(none))


def test_get_status_carries_the_episode_counts_of_the_worker() -> None:
    worker = _worker()
    worker.local_tools.end_reasons.update({"submitted": 5, "max_turns": 2})
    worker.local_tools.tool_calls, worker.local_tools.tool_errors = 13, 3
    reply = asyncio.run(RolloutWorkerServicer(worker, "vllm").GetStatus(rollout_worker_pb2.WorkerStatusRequest(),
                                                                         None))
    a = reply.agent
    assert (a.episodes, dict(a.end_reasons), a.tool_calls, a.tool_errors) == (7, {"submitted": 5, "max_turns": 2},
                                                                              13, 3)


def test_status_shows_no_episode_line_for_a_worker_that_does_not_answer() -> None:
    cfg = MasterConfig()
    assert asyncio.run(episode_lines("127.0.0.1:1", cfg.services, 0.5)) == []


async def test_a_drain_that_names_no_timeout_still_ends_after_the_grace() -> None:
    cfg = MasterConfig()
    cfg.services.grace_s = 0.3
    cfg.env.code.task_timeout = 0.2
    none: Any = None
    worker = RolloutWorker(cfg, "w0", "127.0.0.1:1", none, none, none, Decoder(none))
    loop = asyncio.get_running_loop()
    for timeout_s, bound in ((0.0, 0.3), (3600.0, 0.5)):  # no timeout: the grace; a huge one: task_timeout + grace
        worker.in_flight["lease"] = asyncio.create_task(asyncio.sleep(3600))  # a group that never finishes
        t0 = loop.time()
        assert await asyncio.wait_for(worker.drain(timeout_s), 5) == (0, 1)
        assert loop.time() - t0 < bound + 0.5, (timeout_s, loop.time() - t0)
