"""The two ends of the replay-buffer benchmark's service pipeline (benchmarks/replay_buffer_bench.py): a rollout
worker's submit (payload write to Redis + header submit) and the trainer's sample (Sample + one MGET), either as
bytes (pre-serialized groups, ids read off the headers: transport + buffer only, like the raw Redis pipeline) or
through the fleet's real client, `buffer_client.BufferClient`."""

from __future__ import annotations

from typing import Any

from buffer_client import BufferClient
from buffer_client.submitter import Encoded
from fleet.config import load_config
from grpofleet.v1 import common_pb2, replay_buffer_pb2

TIMEOUT_S = 60.0


async def prepare(stub: Any, groups: list[common_pb2.ScoredGroup]) -> list[tuple[str, common_pb2.ScoredGroup]]:
    """Untimed: register a worker, begin a run, enqueue every prompt and lease it. Returns (lease id, group)."""
    worker = replay_buffer_pb2.WorkerInfo(worker_id="bench-worker", address="127.0.0.1:1", state="serving")
    await stub.RegisterWorker(replay_buffer_pb2.RegisterWorkerRequest(worker=worker), timeout=TIMEOUT_S)
    epoch = (await stub.BeginRun(replay_buffer_pb2.BeginRunRequest(), timeout=TIMEOUT_S)).epoch
    by_id = {g.prompt.group_id: g for g in groups}
    for i in range(0, len(groups), 200):
        req = replay_buffer_pb2.EnqueuePromptsRequest(groups=[g.prompt for g in groups[i : i + 200]])
        await stub.EnqueuePrompts(req, timeout=TIMEOUT_S)
    leased: list[tuple[str, common_pb2.ScoredGroup]] = []
    while len(leased) < len(groups):
        lease_req = replay_buffer_pb2.LeasePromptsRequest(worker_id="bench-worker", weight_epoch=epoch, max_groups=200)
        for lease in (await stub.LeasePrompts(lease_req, timeout=TIMEOUT_S)).leases:
            leased.append((lease.lease_id, by_id[lease.group.group_id]))
    return leased


class ServiceEnds:
    """One service round's two ends, both through `BufferClient` (its submit batching, its payload store): `submit`
    (a worker's) and `sample` (the trainer's); with `client_protobuf` False the groups go in pre-serialized and come
    out as bytes (ids off the Sample headers), as in the raw pipeline."""

    def __init__(self, address: str, url: str, prefix: str, client_protobuf: bool) -> None:
        self.client_protobuf = client_protobuf
        port = address.rsplit(":", 1)[1]
        overrides = [f"services.replay_buffer.port={port}", f"redis.url={url}", f"redis.key_prefix={prefix}"]
        cfg = load_config(None, overrides)
        self.client = BufferClient(cfg.services, cfg.redis, cfg.run.dir)
        self.stub = self.client.stub  # one channel per process, as the trainer and a worker have

    async def submit(self, item: tuple[str, Any]) -> None:
        lease_id, group = item
        if self.client_protobuf:  # check + serialize, then the payload write + header submit
            await self.client.submit("bench-worker", lease_id, group)
        else:  # pre-encoded: bytes in, like XADD
            header, data = group
            await self.client._submitter.submit_encoded("bench-worker", Encoded(lease_id, header, data))

    async def sample(self, step: int, want: int) -> list[str]:
        if self.client_protobuf:  # Sample + MGET + parse
            groups, _ = await self.client.sample(step, want, 1.0, min_groups=1)
            return [g.prompt.group_id for g in groups]
        req = replay_buffer_pb2.SampleRequest(step=step, num_groups=want, deadline_ms=1000, min_groups=1)
        answer = await self.stub.Sample(req, timeout=TIMEOUT_S)
        values = await self.client.payloads.get([g.payload_key for g in answer.groups])
        assert all(v is not None for v in values)
        return [g.group_id for g in answer.groups]  # ids off the headers: the bytes are not parsed, as raw

    async def close(self) -> None:
        await self.client.close()
