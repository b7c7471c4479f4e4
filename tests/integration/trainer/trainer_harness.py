"""Harness of the trainer's integration tests: a real replay buffer (`grpo-fleet serve replay-buffer`, embedded Redis),
the real trainer (`trainer/main.py` as a subprocess), and `FakeRollout`, which stands in for rollout workers ONLY
here: it registers, receives weight pushes (through the worker's own `weightsync.receive`), leases prompt groups
and submits scored groups through the buffer's gRPC API, with random tokens.

Fixtures stop only the processes they started, through their Popen handles.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc import aio

from fleet.contracts import scored_group
from grpofleet.v1 import (
    common_pb2,
    replay_buffer_pb2,
    replay_buffer_pb2_grpc,
    rollout_worker_pb2,
    rollout_worker_pb2_grpc,
)
from rollout.engine.base import checkpoint_weight_spec
from weightsync import factory as worker_weights

ROOT = Path(__file__).resolve().parents[3]
RPC_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp: Path, model: str, *, async_on: bool, steps: int, **extra: Any) -> Path:
    cfg: dict[str, Any] = {
        "policy": {"model_name": model, "max_total_sequence_length": 256, "train_global_batch_size": 8,
                   "train_micro_batch_size": 4, "optimizer": {"lr": 1.0e-4},
                   "generation": {"backend": "hf", "max_new_tokens": 32},
                   "weight_sync": {"join_poll_s": 0.3}},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4, "max_num_steps": steps,
                 "sample_deadline_s": 1.0, "sample_timeout_s": 120.0,
                 "async_grpo": {"enabled": async_on, "max_trajectory_age_steps": 2,
                                "in_flight_weight_updates": async_on}},
        "loss_fn": {"reference_policy_kl_penalty": 0.0, "use_importance_sampling_correction": True,
                    "truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0},
        "env": {"arith": {"num_tasks": 40}},
        "data": {"train": {"dataset_name": "arith", "max_prompt_length": 64, "context": "none"}},
        "checkpointing": {"save_period": 2},
        "logger": {"progress_bar": False, "tensorboard_enabled": True},
        "services": {"replay_buffer": {"port": free_port()}, "trainer": {"port": free_port()}},
        "replay_buffer": {"heartbeat_interval_s": 0.5, "worker_timeout_s": 30.0},
        "run": {"dir": str(tmp / "run")},
    }
    for dotted, value in extra.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def start_trainer(config: Path, *overrides: str) -> subprocess.Popen[bytes]:
    log = open(config.parent / "trainer.log", "ab")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen([sys.executable, str(ROOT / "trainer" / "main.py"), "--config", str(config), *overrides],
                            cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)


@dataclass
class FakeRollout(rollout_worker_pb2_grpc.RolloutWorkerServicer):
    """A rollout worker's contract, without a model: weights are received and checked, tokens are random."""

    buffer_address: str
    model_path: str
    dtype: str = "float32"
    worker_id: str = "fake-0"
    delay_s: float = 0.05  # "generation time" per group
    slow_groups: dict[str, float] = field(default_factory=dict)  # group id -> extra delay (stragglers)
    version: int = 0  # the registry takes no negative versions: (0, epoch 0) = no weights yet (run epochs start at 1)
    epoch: int = 0
    pushes: list[tuple[int, int]] = field(default_factory=list)
    leased: list[tuple[str, int, int]] = field(default_factory=list)  # (group id, epoch, version) at lease time
    submitted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec, _ = checkpoint_weight_spec(self.model_path, self.dtype)
        self.spec = {k: (v.shape, v.dtype) for k, v in spec.items()}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._tasks: list[asyncio.Future[Any]] = []

    # -- the RolloutWorker service -----------------------------------------------------------------------------------
    async def PushWeights(self, request_iterator: AsyncIterator[common_pb2.WeightChunk],  # noqa: N802
                          context: aio.ServicerContext) -> rollout_worker_pb2.PushWeightsResponse:
        ws = await worker_weights.receive(request_iterator, self.spec)
        if (ws.epoch, ws.version) < (self.epoch, self.version):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "older than served")
        self.version, self.epoch = ws.version, ws.epoch
        self.pushes.append((ws.epoch, ws.version))
        await self._heartbeat()
        return rollout_worker_pb2.PushWeightsResponse(version=ws.version, epoch=ws.epoch, bytes=ws.nbytes)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def start(self) -> FakeRollout:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self.server = aio.server()
        rollout_worker_pb2_grpc.add_RolloutWorkerServicer_to_server(self, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        self.channel = aio.insecure_channel(self.buffer_address)
        self.stub = replay_buffer_pb2_grpc.ReplayBufferStub(self.channel)
        await self.stub.RegisterWorker(replay_buffer_pb2.RegisterWorkerRequest(worker=self._info()),
                                       timeout=RPC_TIMEOUT)
        self._tasks = [asyncio.ensure_future(self._heartbeats()), asyncio.ensure_future(self._leases())]

    def stop(self) -> None:
        async def _stop() -> None:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.server.stop(None)
            await self.channel.close()

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _info(self) -> replay_buffer_pb2.WorkerInfo:
        return replay_buffer_pb2.WorkerInfo(worker_id=self.worker_id, address=self.address,
                                            weight_version=self.version, weight_epoch=self.epoch,
                                            state="serving" if self.pushes else "starting")

    async def _heartbeat(self) -> None:
        await self.stub.Heartbeat(replay_buffer_pb2.HeartbeatRequest(worker=self._info()), timeout=RPC_TIMEOUT)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(0.3)
            try:
                await self._heartbeat()
            except aio.AioRpcError:
                pass

    async def _leases(self) -> None:
        while True:
            if not self.pushes:
                await asyncio.sleep(0.05)
                continue
            try:
                r = await self.stub.LeasePrompts(replay_buffer_pb2.LeasePromptsRequest(
                    worker_id=self.worker_id, weight_version=self.version, weight_epoch=self.epoch, max_groups=2),
                    timeout=RPC_TIMEOUT)
            except aio.AioRpcError:  # FAILED_PRECONDITION until this epoch's weights arrive
                await asyncio.sleep(0.05)
                continue
            if not r.leases:
                await asyncio.sleep(max(r.retry_after_ms, 20) / 1000)
                continue
            for lease in r.leases:
                self.leased.append((lease.group.group_id, self.epoch, self.version))
                self._tasks.append(asyncio.ensure_future(self._score(lease, self.version)))

    async def _score(self, lease: replay_buffer_pb2.Lease, version: int) -> None:
        p = lease.group
        await asyncio.sleep(self.delay_s + self.slow_groups.get(p.group_id, 0.0))
        rng = random.Random(p.group_id)
        trajs = []
        for i in range(p.num_generations):
            n = rng.randint(4, 16)
            reward = float((hash(p.group_id) + i) % 2)
            trajs.append(common_pb2.Trajectory(
                response_token_ids=[rng.randrange(3, 2000) for _ in range(n)],
                generation_logprobs=[-7.6 + rng.uniform(-0.2, 0.2) for _ in range(n)],
                token_versions=[version] * n, reward=reward, finish_reason="stop",
                verdict=common_pb2.Verdict(status=common_pb2.VERDICT_STATUS_COMPLETED,
                                           resolution=common_pb2.RESOLUTION_FULL if reward else
                                           common_pb2.RESOLUTION_NO)))
        group = common_pb2.ScoredGroup(prompt=p, trajectories=trajs, worker_id=self.worker_id, min_version=version,
                                       max_version=version, submitted_at_ms=int(time.time() * 1000))
        try:
            req = scored_group.submit_request(self.worker_id, lease.lease_id, group)
            await self.stub.SubmitGroup(req, timeout=RPC_TIMEOUT)
            self.submitted.append(p.group_id)
        except aio.AioRpcError:
            pass  # e.g. the buffer is gone at teardown

    def stats(self) -> dict[str, Any]:
        async def get() -> Any:
            return await self.stub.Stats(replay_buffer_pb2.StatsRequest(), timeout=RPC_TIMEOUT)

        r = asyncio.run_coroutine_threadsafe(get(), self._loop).result(30)
        out = {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields if f.type != f.TYPE_MESSAGE}
        out["age_histogram"] = dict(r.age_histogram)
        out["dead_lettered_by_reason"] = dict(r.dead_lettered_by_reason)
        return out




def replay_buffer_factory() -> Iterator[Any]:
    """start(config_path) -> address; the process is terminated (SIGTERM, then SIGKILL) at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> str:
        log = open(config.parent / "replay_buffer.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen([sys.executable, "-m", "launch.cli", "serve", "replay-buffer", "--config", str(config)],
                                cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        address = f"127.0.0.1:{load(config)['services']['replay_buffer']['port']}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError((config.parent / "replay_buffer.log").read_text())
            if "listening on" in (config.parent / "replay_buffer.log").read_text():
                return address
            time.sleep(0.1)
        raise TimeoutError("replay buffer did not start")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
