"""Helpers of the service tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from fleet.config import MasterConfig
from fleet.contracts import scored_group
from fleet.contracts.buffer import payload_key
from grpofleet.v1 import common_pb2, replay_buffer_pb2_grpc
from grpofleet.v1 import replay_buffer_pb2 as pb
from services.runtime.client import make_channel

RPC_TIMEOUT_S = 10.0


class Client:
    """One channel and stub; `call("Stats")` or `call("Sample", step=0, ...)` with a deadline on every call. With
    `redis_url`, also the data plane: `submit` writes payload keys (as the fleet's workers do) and `groups_of` reads
    them (as the trainer does); the key prefix is the buffer's (`redis.key_prefix` of `cfg`, or `prefix`)."""

    def __init__(self, address: str, cfg: MasterConfig, token: str | None = None, *, redis_url: str = "",
                 prefix: str | None = None) -> None:
        self.channel = make_channel(address, cfg.services, token=token)
        self.stub = replay_buffer_pb2_grpc.ReplayBufferStub(self.channel)
        self.redis = Redis.from_url(redis_url) if redis_url else None
        self.prefix = prefix or cfg.redis.key_prefix

    async def call(self, method: str, request: Any = None, rpc_deadline_s: float = RPC_TIMEOUT_S, **fields: Any) -> Any:
        if request is None:
            request = getattr(pb, f"{method}Request")(**fields)
        return await getattr(self.stub, method)(request, timeout=rpc_deadline_s)

    async def close(self) -> None:
        await self.channel.close()
        if self.redis is not None:
            await self.redis.aclose()


def prompt(gid: str, target: int = 0, *, validation: bool = False, generations: int = 2) -> common_pb2.PromptGroup:
    return common_pb2.PromptGroup(
        group_id=gid, target_step=target, env_name="arith", task_id=gid, prompt_token_ids=[1, 2, 3],
        num_generations=generations, validation=validation,
    )  # fmt: skip


def scored(p: common_pb2.PromptGroup, version: int, *, tokens: int = 16, newest: int | None = None) -> Any:
    """A whole group generated with `version` (its later tokens with `newest`, as after an in-flight update)."""
    newest = version if newest is None else newest
    g = common_pb2.ScoredGroup(prompt=p, worker_id="w", min_version=version, max_version=newest)
    for i in range(p.num_generations):
        t = g.trajectories.add(response_token_ids=range(tokens), reward=float(i), finish_reason="stop")
        t.generation_logprobs.extend([-0.25] * tokens)
        t.token_versions.extend([version] * (tokens // 2) + [newest] * (tokens - tokens // 2))
        t.verdict.status = common_pb2.VERDICT_STATUS_COMPLETED
    return g


def worker(wid: str = "w1", version: int = 0, epoch: int = 0) -> pb.WorkerInfo:
    return pb.WorkerInfo(worker_id=wid, address=f"127.0.0.1:{len(wid)}", weight_version=version, weight_epoch=epoch,
                         state="serving")  # fmt: skip


async def begin(client: Any, *workers: str, resume_step: int = 0, version: int = 0) -> int:
    """BeginRun, then register workers holding this epoch's weights (the join handshake)."""
    epoch = (await client.call("BeginRun", resume_step=resume_step, weight_version=version)).epoch
    for w in workers:
        await client.call("RegisterWorker", worker=worker(w, version, epoch))
    return int(epoch)


async def lease(client: Any, wid: str, version: int, epoch: int, n: int = 10) -> Any:
    return await client.call("LeasePrompts", worker_id=wid, weight_version=version, weight_epoch=epoch, max_groups=n)


async def submit(client: Any, wid: str, lease_id: str, group: Any, *, inline: bool = False) -> Any:
    """Header filled from the group and the group serialized, without the worker-side checks of
    `scored_group.encode`: what the service itself accepts or refuses is what these tests check. The bytes go to a
    payload key first (the fleet's path) when the client reaches Redis, else (or with `inline`) in the call."""
    header = scored_group.header_of(group)
    data = group.SerializeToString()
    if inline or client.redis is None:
        return await client.call("SubmitGroup", worker_id=wid, lease_id=lease_id, header=header, scored_group=data)
    key = payload_key(client.prefix, header.group_id)
    await client.redis.set(key, data, px=600_000)
    header.payload_bytes = len(data)
    return await client.call("SubmitGroup", worker_id=wid, lease_id=lease_id, header=header, payload_key=key)


async def groups_of(client: Any, reply: pb.SampleResponse) -> list[common_pb2.ScoredGroup]:
    """The scored groups of a Sample answer, read from the payload keys it names (bytes as the workers wrote them)."""
    keys = [g.payload_key for g in reply.groups]
    values = await client.redis.mget(keys) if keys else []
    assert all(v is not None for v in values), "a sampled group's payload key is gone"
    return [common_pb2.ScoredGroup.FromString(v) for v in values]


def invariant_holds(s: pb.StatsResponse) -> bool:
    """enqueued = sampled + pending + ready + dead_lettered, from Stats alone."""
    return s.enqueued == s.sampled + s.prompts_pending + s.groups_ready + s.validation_ready + s.dead_lettered
