"""The rollout worker's loop: lease prompt groups, generate G answers each, score them, submit the scored group.

Wiring: `rollout.server` builds the engine, the scorer, the buffer client and the episode runners (each given the
config sections it reads) and hands them to `RolloutWorker`;
the worker never talks to the trainer — the trainer pushes weights to it through the servicer, which calls
`apply_weights`. A worker leases nothing until it holds weights of the current run epoch (join handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from buffer_client import BufferClient
from fleet.config import MasterConfig
from fleet.contracts.buffer import Lease, WorkerInfo
from fleet.contracts.groups import PromptGroup, ScoredGroup, Trajectory
from fleet.contracts.weights import NO_WEIGHTS
from rollout.agent.computer import ComputerRunner
from rollout.agent.local import LocalToolRunner
from rollout.agent.runner import AgentRunner
from rollout.engine import Generation, GenerationEngine, SamplingSpec
from rollout.engine.base import EngineUnavailableError
from rollout.scoring import Scorer, ScoringUnavailable
from services.runtime.errors import FailedPrecondition
from weightsync.header import WeightSet

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    tokens_generated: int = 0
    groups_submitted: int = 0
    groups_released: int = 0
    weight_updates: int = 0
    total_pause_s: float = 0.0
    last_pause_s: float = 0.0
    scoring_retries: int = 0
    integrity_violations: int = 0
    """Samples whose verdict was `integrity_violation` (a caught reward hack)."""
    started_at: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    _clock_at: float = 0.0  # last busy/idle transition; 0 until the first weights arrive
    _busy: bool = False

    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self.started_at
        return self.tokens_generated / elapsed if elapsed > 0 else 0.0

    def set_busy(self, busy: bool) -> None:
        """Account the time since the last call as busy (groups in flight) or idle (none: the buffer had nothing to
        lease). The clock starts with the first weights: before them the worker is joining, not idling."""
        now = time.monotonic()
        if self._clock_at:
            if self._busy:
                self.busy_s += now - self._clock_at
            else:
                self.idle_s += now - self._clock_at
        self._clock_at, self._busy = now, busy

    def summary(self) -> dict[str, float]:
        self.set_busy(self._busy)
        return {"tokens_generated": self.tokens_generated, "tokens_per_s": self.tokens_per_s(),
                "groups_submitted": self.groups_submitted, "groups_released": self.groups_released,
                "weight_updates": self.weight_updates, "total_pause_s": self.total_pause_s,
                "busy_s": self.busy_s, "idle_s": self.idle_s, "scoring_retries": self.scoring_retries,
                "integrity_violations": self.integrity_violations}


@dataclass
class EpisodeRunners:
    """The multi-turn runners of a worker, composed by `rollout/server.py`: in-process tools (any mode), sandbox code
    sessions (`env.code.mode: agent` only) and computer use (when the config selects that path)."""

    local_tools: LocalToolRunner
    agent: AgentRunner | None = None
    computer: ComputerRunner | None = None


class RolloutWorker:
    def __init__(self, cfg: MasterConfig, worker_id: str, address: str, engine: GenerationEngine,
                 scorer: Scorer, buffer: BufferClient, decode: Decoder, runners: EpisodeRunners | None = None) -> None:
        """`runners`: None for a worker of single-shot answers and in-process tools only."""
        self.cfg = cfg
        self.worker_id = worker_id
        self.address = address
        self.engine = engine
        self.scorer = scorer
        self.buffer = buffer
        self.decode = decode
        runners = runners or EpisodeRunners(LocalToolRunner(cfg.env, cfg.policy, engine, decode.tokenizer))
        # Agent mode: SWE samples are multi-turn episodes in sandbox sessions owned by this worker.
        self.agent = runners.agent
        # Environments whose tools run here (envs/lookup.py): multi-turn episodes in any mode, no sandbox.
        self.local_tools = runners.local_tools
        self.computer = runners.computer
        self.weights = NO_WEIGHTS  # what the engine serves; set only once a push has loaded
        self.state = "starting"
        self.in_flight: dict[str, asyncio.Task[None]] = {}
        self._samples: dict[str, int] = {}  # lease id -> the answers its group asks for
        self.stats = WorkerStats(started_at=time.monotonic())
        self._weights_lock = asyncio.Lock()
        self._slot_free = asyncio.Event()
        self._leasing_paused = False
        self._draining = False

    @property
    def version(self) -> int:
        return self.weights.version

    @property
    def epoch(self) -> int:
        return self.weights.epoch

    # ---- registry -------------------------------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.worker_id, address=self.address, weight_version=self.version, weight_epoch=self.epoch,
            state=self.state, groups_in_flight=len(self.in_flight),
        )

    async def heartbeat_loop(self) -> None:
        reply = await self.buffer.register(self.info())
        interval = max(0.2, reply.heartbeat_interval_ms / 1000 or self.cfg.replay_buffer.heartbeat_interval_s)
        log.info("registered with the replay buffer (run epoch %d, current version %d); waiting for weights",
                 reply.epoch, reply.current_version)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.buffer.heartbeat(self.info())
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                # The registry lost us (worker timed out, or Redis lost state): register again.
                log.warning("the replay buffer no longer knows this worker; registering again")
                await self.buffer.register(self.info())

    async def engine_watch(self, every_s: float = 1.0) -> None:
        """Fails (and with it the service: `run_service` supervises it) once the engine can no longer serve: a
        worker whose vLLM EngineCore died would otherwise stay registered and heartbeating, failing every group it
        leases until they are dead-lettered. Exiting hands it to whatever restarts it (the launcher, compose, k8s)."""
        while (why := self.engine.failure()) is None:  # noqa: ASYNC110 (a state vLLM exposes, with no event to await)
            await asyncio.sleep(every_s)
        raise EngineUnavailableError(f"{why}; stopping this worker so that it is restarted")

    # ---- weights (called by the servicer) --------------------------------------------------------------------
    async def apply_weights(self, ws: WeightSet) -> tuple[float, float]:
        """Load a pushed weight set. Returns (pause_s, load_s). Older (epoch, version) than served is refused; the
        same one is a no-op (pushes are retried)."""
        async with self._weights_lock:
            if ws.id < self.weights:
                raise FailedPrecondition(
                    f"weight version {ws.version} (epoch {ws.epoch}) is older than the served {self.version} "
                    f"(epoch {self.epoch})")
            if ws.id == self.weights:
                return 0.0, 0.0
            a = self.cfg.grpo.async_grpo
            in_flight = a.enabled and a.in_flight_weight_updates
            self._leasing_paused = not in_flight
            try:
                stats = await self.engine.update_weights(
                    ws.version, ws.tensors, in_flight=in_flight, reset_cache=a.recompute_kv_cache_after_weight_updates,
                    epoch=ws.epoch)
            finally:
                self._leasing_paused = False
            self.weights = ws.id
            self.state = "draining" if self._draining else "serving"
            self.stats.weight_updates += 1
            if self.stats.weight_updates == 1:
                self.stats.set_busy(bool(self.in_flight))
            self.stats.last_pause_s = stats.pause_s
            self.stats.total_pause_s += stats.pause_s
        log.info("serving weight version %d (epoch %d): paused %.3fs, load %.3fs", ws.version, ws.epoch,
                 stats.pause_s, stats.load_s)
        # Tell the buffer right away: the lease check reads the registry, not our next heartbeat.
        await self.buffer.heartbeat(self.info())
        return stats.pause_s, stats.load_s

    # ---- leasing --------------------------------------------------------------------------------------------
    async def lease_loop(self) -> None:
        # The budget is in answers, not groups: a validation round's groups of one answer each fill what
        # `max_groups_in_flight` training groups would, so the engine batches them as wide (not 16 at a time).
        g = self.cfg.grpo.num_generations_per_prompt
        budget = self.cfg.rollout.max_groups_in_flight * g
        while not self._draining:
            if self.version < 0 or self._leasing_paused:
                await asyncio.sleep(0.1)
                continue
            free = (budget - sum(self._samples.values())) // g  # whole training groups still fit
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            try:
                reply = await self.buffer.lease(self.worker_id, self.version, self.epoch, free)
            except aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                log.debug("lease refused: %s", exc.details())
                await asyncio.sleep(0.5)
                continue
            if not reply.leases:
                await asyncio.sleep(reply.retry_after_ms / 1000 if reply.retry_after_ms else 0.2)
                continue
            for lease in reply.leases:
                task = asyncio.create_task(self._run_group(lease), name=f"group-{lease.group.group_id}")
                self.in_flight[lease.lease_id] = task
                self._samples[lease.lease_id] = lease.group.num_generations or g
            self.stats.set_busy(True)

    async def _run_group(self, lease: Lease) -> None:
        try:
            group = await self.process_group(lease.group)
        except asyncio.CancelledError:
            # Drain timed out (or shutdown): the group goes back to the queue for another worker.
            self.stats.groups_released += 1
            await asyncio.shield(self.buffer.release(self.worker_id, lease.lease_id, "worker_draining"))
            raise
        except ScoringUnavailable as exc:
            self.stats.groups_released += 1
            log.warning("group %s: scoring infrastructure failed (%s); giving the lease back",
                        lease.group.group_id, exc)
            await self.buffer.release(self.worker_id, lease.lease_id, f"scoring_unavailable: {exc}")
        except Exception:
            log.exception("group %s failed; giving the lease back", lease.group.group_id)
            await self.buffer.release(self.worker_id, lease.lease_id, "worker_error")
        else:
            await self._submit(lease, group)
        finally:
            self.in_flight.pop(lease.lease_id, None)
            self._samples.pop(lease.lease_id, None)
            self.stats.set_busy(bool(self.in_flight))
            self._slot_free.set()

    async def _submit(self, lease: Lease, group: ScoredGroup) -> None:
        try:
            await self.buffer.submit(self.worker_id, lease.lease_id, group)
        except aio.AioRpcError as exc:
            # Refused (e.g. its payload expired during a long outage): give the lease back, so the group is
            # generated again rather than held until the lease times out.
            self.stats.groups_released += 1
            log.error("group %s: submit refused (%s: %s); giving the lease back", lease.group.group_id,
                      exc.code().name, exc.details())
            with contextlib.suppress(aio.AioRpcError):  # not outstanding any more: nothing to give back
                await self.buffer.release(self.worker_id, lease.lease_id, f"submit_refused: {exc.details()}")
        else:
            self.stats.groups_submitted += 1

    def _sampling(self, prompt: PromptGroup) -> SamplingSpec:
        g = self.cfg.policy.generation
        max_new = min(g.max_new_tokens, self.cfg.policy.max_total_sequence_length - len(prompt.prompt_token_ids))
        return SamplingSpec(
            temperature=self.cfg.grpo.val_temperature if prompt.validation else g.temperature,
            top_p=g.top_p, top_k=g.top_k, max_new_tokens=max(1, max_new), stop_strings=list(g.stop_strings),
        )

    async def process_group(self, prompt: PromptGroup) -> ScoredGroup:
        """Generate G answers concurrently; score each as soon as it is generated."""
        payload = json.loads(prompt.env_payload or b"{}")
        sampling = self._sampling(prompt)
        n = prompt.num_generations or self.cfg.grpo.num_generations_per_prompt
        agent = self.agent is not None and AgentRunner.handles(prompt.env_name)
        sample = self._agent_sample if agent else self._one_sample
        if LocalToolRunner.handles(prompt.env_name):
            sample = self._local_tools_sample
        if ComputerRunner.handles(prompt.env_name):
            sample = self._computer_sample
        # An image task's pull starts at lease time, not when the first answer reaches an executor.
        prefetch = asyncio.create_task(self.scorer.prefetch(payload), name=f"prefetch-{prompt.group_id}")
        try:
            trajectories = await asyncio.gather(*(sample(prompt, payload, sampling, i) for i in range(n)))
        finally:
            prefetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prefetch
        return ScoredGroup.assemble(prompt, trajectories, self.worker_id, self.version)

    async def _one_sample(self, prompt: PromptGroup, payload: dict[str, object], sampling: SamplingSpec,
                          index: int) -> Trajectory:
        t0 = time.monotonic()
        gen: Generation = await self.engine.generate(
            f"{prompt.group_id}/{index}/{time.monotonic_ns()}", list(prompt.prompt_token_ids), sampling)
        t1 = time.monotonic()
        self.stats.tokens_generated += len(gen.token_ids)
        text = self.decode(gen.token_ids)
        verdict, reward, retries = await self.scorer.score(prompt.env_name, payload, text,
                                                           truncated=gen.finish_reason == "length")
        self.stats.scoring_retries += retries
        self.stats.integrity_violations += verdict.status == "integrity_violation"
        # A single-shot answer: every response token was generated.
        return Trajectory(gen.token_ids, gen.logprobs, gen.token_versions, reward, verdict, gen.finish_reason,
                          generation_s=t1 - t0, scoring_s=time.monotonic() - t1)

    async def _agent_sample(self, prompt: PromptGroup, payload: dict[str, object],
                            sampling: SamplingSpec, index: int) -> Trajectory:
        assert self.agent is not None
        trajectory = await self.agent.sample(prompt, payload, sampling, index)
        self.stats.tokens_generated += _generated_tokens(trajectory)
        return trajectory

    async def _computer_sample(self, prompt: PromptGroup, payload: dict[str, object],
                               sampling: SamplingSpec, index: int) -> Trajectory:
        if self.computer is None:
            raise ValueError(f"group {prompt.group_id}: a computer_use task reached a worker whose config does not "
                             "select the computer-use path (data.train.dataset_name=computer_use)")
        trajectory = await self.computer.sample(prompt, payload, sampling, index)
        self.stats.tokens_generated += _generated_tokens(trajectory)
        return trajectory

    async def _local_tools_sample(self, prompt: PromptGroup, payload: dict[str, object],
                                  sampling: SamplingSpec, index: int) -> Trajectory:
        trajectory = await self.local_tools.sample(prompt, payload, sampling, index)
        self.stats.tokens_generated += _generated_tokens(trajectory)
        return trajectory

    def episode_summary(self) -> dict[str, Any]:
        """Multi-turn episodes of this worker (agent mode and in-process tool environments), summed."""
        parts = [self.local_tools.summary(), *([self.agent.summary()] if self.agent is not None else [])]
        reasons: Counter[str] = Counter()
        for part in parts:
            reasons.update(part["end_reasons"])
        return {"episodes": sum(p["episodes"] for p in parts), "end_reasons": dict(reasons),
                "tool_calls": sum(p["tool_calls"] for p in parts), "tool_errors": sum(p["tool_errors"] for p in parts)}

    # ---- drain ----------------------------------------------------------------------------------------------
    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """Stop leasing, let the groups in flight finish (up to timeout_s), give back the rest. The wait is always
        bounded: 0 (a Drain call that names no timeout) means `services.grace_s`, and no more than the longest a
        group in flight can still take (its scoring, `env.code.task_timeout`, plus the grace) is ever waited."""
        self._draining = True
        self.state = "draining"
        self._slot_free.set()
        grace = self.cfg.services.grace_s
        bound = min(timeout_s if timeout_s > 0 else grace, self.cfg.env.code.task_timeout + grace)
        tasks = list(self.in_flight.values())
        done, pending = await asyncio.wait(tasks, timeout=bound) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for runner in (self.agent, self.computer):
            if runner is not None:
                await runner.close()  # its sessions go now, not when their lease runs out
        return len(done), len(pending)


def _generated_tokens(t: Trajectory) -> int:
    """Tokens the engine made for an episode's trajectory (its observation tokens it did not)."""
    return t.episode.generated_tokens if t.episode is not None else len(t.response_token_ids)


class Decoder:
    """Token ids -> text for scoring (the tokenizer of the served model)."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    def __call__(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))  # type: ignore[attr-defined]
