"""`grpo-fleet status`: one screen on a running fleet — trainer step and phase, weight version per worker, queue
depths, the trajectory-age histogram and recent reward. Reads the replay buffer and the trainer over gRPC. While a
service (or the buffer's Redis) is down, its line says OUTAGE and what is down, and the command exits 1."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc import aio

from fleet.config import MasterConfig
from fleet.config.infra import ServicesConfig


def validation_lines(metrics: dict[str, float]) -> list[str]:
    """The last validation round's accuracy and verdict breakdown, from the trainer's status metrics."""
    from trainer.validation import VERDICT_KINDS

    if "val/tasks" not in metrics:
        return []
    tasks, graded = int(metrics["val/tasks"]), int(metrics.get("val/graded", metrics["val/tasks"]))
    accuracy = f"{metrics['val/accuracy']:.3f}" if "val/accuracy" in metrics else "n/a"
    counts = [(label, int(metrics.get(f"val/verdict/{kind}", 0))) for kind, label in VERDICT_KINDS.items()]
    breakdown = "  ".join(f"{label} {n}" for label, n in counts if n or label == "resolved")
    return [f"val       step {int(metrics.get('val/step', -1))}: accuracy {accuracy} (FULL / {graded} graded of "
            f"{tasks} tasks)  {breakdown}"]


async def _gather(cfg: MasterConfig) -> list[str]:
    from grpofleet.v1 import replay_buffer_pb2, replay_buffer_pb2_grpc, trainer_pb2, trainer_pb2_grpc
    from services.runtime.client import make_channel

    lines: list[str] = []
    t = cfg.services.rpc_timeout_s
    async with make_channel(cfg.services.trainer.address, cfg.services) as ch:
        try:
            st = await trainer_pb2_grpc.TrainerStub(ch).GetStatus(trainer_pb2.TrainerStatusRequest(), timeout=t)
            mode = "async" if st.async_mode else "sync"
            lines.append(f"trainer   step {st.step}/{st.max_steps}  version {st.weight_version}  epoch {st.epoch}  "
                         f"phase {st.phase}  ({mode}, {st.world_size} ranks)")
            keys = ("reward/mean", "loss/loss", "perf/tokens_per_s", "timing/step_s")  # val/*: its own line
            shown = [f"{k} {st.metrics[k]:.4g}" for k in keys if k in st.metrics]
            if shown:
                lines.append("          " + "  ".join(shown))
            lines.extend(validation_lines(dict(st.metrics)))
        except aio.AioRpcError as exc:
            lines.append(f"trainer   {outage_line(cfg.services.trainer.address, exc)}")
    async with make_channel(cfg.services.replay_buffer.address, cfg.services) as ch:
        stub = replay_buffer_pb2_grpc.ReplayBufferStub(ch)
        try:
            s = await stub.Stats(replay_buffer_pb2.StatsRequest(), timeout=t)
            w = await stub.ListWorkers(replay_buffer_pb2.ListWorkersRequest(include_dead=True), timeout=t)
        except aio.AioRpcError as exc:
            lines.append(f"buffer    {outage_line(cfg.services.replay_buffer.address, exc)}")
            return lines
        lines.append(f"buffer    prompts pending {s.prompts_pending}  leased {s.leases_outstanding}  ready "
                     f"{s.groups_ready}  sampled {s.sampled}  dead-lettered {s.dead_lettered}  (enqueued {s.enqueued})")
        if s.dead_lettered_by_reason:
            lines.append("          dead letters: " + ", ".join(f"{k}={v}" for k, v in
                                                            sorted(s.dead_lettered_by_reason.items())))
        if s.age_histogram:
            lines.append("          ages: " + "  ".join(f"{age}:{n}" for age, n in sorted(s.age_histogram.items())))
        now = time.time() * 1000
        for info in w.workers:
            age = (now - info.last_heartbeat_ms) / 1000
            lines.append(f"worker    {info.worker_id:<16} {info.address:<21} version {info.weight_version} "
                         f"(epoch {info.weight_epoch})  {info.state}  in flight {info.groups_in_flight}  "
                         f"heartbeat {age:.1f}s ago")
            if age < cfg.replay_buffer.worker_timeout_s:  # a dead worker is not asked (it would cost a timeout)
                lines.extend(await episode_lines(info.address, cfg.services, t))
    return lines


async def episode_lines(address: str, services: ServicesConfig, timeout_s: float) -> list[str]:
    """A worker's multi-turn episodes (its GetStatus `agent`), when it ran any; nothing when it does not answer."""
    from grpofleet.v1 import rollout_worker_pb2, rollout_worker_pb2_grpc
    from services.runtime.client import make_channel

    async with make_channel(address, services) as ch:
        try:
            st = await rollout_worker_pb2_grpc.RolloutWorkerStub(ch).GetStatus(
                rollout_worker_pb2.WorkerStatusRequest(), timeout=timeout_s)
        except aio.AioRpcError:
            return []  # a dead worker's line above says so
    a = st.agent
    if not a.episodes:
        return []
    ends = "  ".join(f"{k} {v}" for k, v in sorted(a.end_reasons.items()))
    return [f"          episodes {a.episodes}  ({ends})  tool calls {a.tool_calls}  tool errors {a.tool_errors}"]


def outage_line(address: str, exc: aio.AioRpcError) -> str:
    """What is down, while it is down: the service itself (no answer at `address`) or what it depends on (the replay
    buffer answers UNAVAILABLE naming its Redis, and for how long it has been away)."""
    from services.runtime.client import BACKEND_DOWN, describe_unavailable

    if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"error at {address} ({describe_unavailable(exc)})"
    details = (exc.details() or "").removeprefix(BACKEND_DOWN)
    if details.startswith("redis at "):
        return f"OUTAGE: its Redis is down ({details[:300]})"
    return f"OUTAGE: unreachable at {address} ({describe_unavailable(exc)})"


def show_status(cfg: MasterConfig, *, watch: bool = False) -> int:
    while True:
        lines = asyncio.run(_gather(cfg))
        if watch:
            print("\033[2J\033[H", end="")
        print("\n".join(lines), flush=True)
        if not watch:
            return 0 if not any("OUTAGE" in ln or " error at " in ln for ln in lines) else 1
        time.sleep(2)
