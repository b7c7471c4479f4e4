"""The data plane (issue 20): a worker's `BufferClient.submit` writes the group's bytes to Redis and sends the header
only, several groups per SubmitGroups call; the trainer's `BufferClient.sample` reads them back with one MGET; payload
keys leak neither from a worker that dies between its write and its submit (they expire) nor after a commit; a key the
submit names must be one of its group's; and the payload store rides out a Redis outage like the buffer's clients do."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from rb_service_helpers import begin, prompt, scored

from buffer_client import BufferClient
from buffer_client.payloads import PayloadStore
from buffer_client.wire import from_proto_group, to_proto_prompt
from fleet.config import MasterConfig, load_config
from fleet.contracts import scored_group
from fleet.contracts.buffer import payload_key
from fleet.contracts.groups import PromptGroup, ScoredGroup
from services.replay_buffer.embedded import start_embedded_redis
from services.runtime.outage import Outage, ServiceDown


def _config(rb: Any, *overrides: str) -> MasterConfig:
    port = rb.address.rsplit(":", 1)[1]
    return load_config(None, [f"services.replay_buffer.port={port}", f"redis.url={rb.redis_url}",
                              f"redis.key_prefix={rb.cfg.redis.key_prefix}", *overrides])


def _client(rb: Any, *overrides: str) -> BufferClient:
    cfg = _config(rb, *overrides)
    return BufferClient(cfg.services, cfg.redis, cfg.run.dir)


def _scored(p: PromptGroup, version: int) -> ScoredGroup:
    """`scored` for a leased group, as the worker hands it to the client (the contract's types)."""
    return from_proto_group(scored(to_proto_prompt(p), version))


async def _payload_keys(client: BufferClient) -> list[bytes]:
    return [k async for k in client.payloads.redis.scan_iter(match=f"{{{client.payloads.prefix}}}:payload:*")]


async def test_worker_submits_travel_through_redis_several_per_call_and_reach_the_trainer_whole(buffer) -> None:
    rb = await buffer()
    c, client = rb.client(), _client(rb)
    try:
        await c.call("EnqueuePrompts", groups=[prompt(f"g{i}") for i in range(6)])
        epoch = await begin(c, "w1")
        leases = (await client.lease("w1", 0, epoch, 6)).leases
        sent = {x.group.group_id: _scored(x.group, 0) for x in leases}
        calls: list[int] = []
        send = client._submitter._send

        async def counting(worker_id: str, groups: list[Any]) -> Any:
            calls.append(len(groups))
            return await send(worker_id, groups)

        client._submitter._send = counting
        outcomes = await asyncio.gather(*(client.submit("w1", x.lease_id, sent[x.group.group_id]) for x in leases))
        assert not any(o.duplicate or o.dead_lettered or o.requeued for o in outcomes)
        assert sum(calls) == 6 and len(calls) < 6, calls  # concurrent submits shared calls
        again = await client.submit("w1", leases[0].lease_id, sent["g0"])  # a retried submit
        assert again.duplicate
        groups, starvation = await client.sample(0, 6, 1.0)
        assert sorted(groups, key=lambda g: g.prompt.group_id) == [sent[f"g{i}"] for i in range(6)]
        assert starvation.reason == ""
        assert len(await _payload_keys(client)) == 6  # sampled, not committed: a resumed trainer reads them again
        assert await client.commit_step(0, epoch) == 6
        assert await _payload_keys(client) == []
        assert (await rb.app.store.accounting()).ok
    finally:
        await client.close()


async def test_one_refused_group_of_a_batch_fails_alone(buffer) -> None:
    rb = await buffer()
    c, client = rb.client(), _client(rb)
    try:
        await c.call("EnqueuePrompts", groups=[prompt(f"g{i}") for i in range(3)])
        epoch = await begin(c, "w1")
        leases = (await client.lease("w1", 0, epoch, 3)).leases
        lease_ids = [x.lease_id for x in leases[:2]] + [f"1-0@{epoch}"]  # the last was never granted
        results = await asyncio.gather(
            *(client.submit("w1", lid, _scored(x.group, 0)) for lid, x in zip(lease_ids, leases, strict=True)),
            return_exceptions=True,
        )
        assert [type(r).__name__ for r in results] == ["SubmitOutcome", "SubmitOutcome", "AioRpcError"]
        assert results[2].code() == grpc.StatusCode.NOT_FOUND  # type: ignore[union-attr]
        stats = await c.call("Stats")
        assert (stats.submitted, stats.leases_outstanding) == (2, 1)
        assert len(await _payload_keys(client)) == 2  # the refused group's bytes were freed
        assert (await rb.app.store.accounting()).ok
    finally:
        await client.close()


async def test_a_worker_whose_submit_is_refused_gives_the_lease_back(buffer) -> None:
    from rollout.worker import Decoder, RolloutWorker

    # g's lease must outlive the test (0.5 s, the fixture's default, expired on a loaded machine: a flake).
    rb = await buffer("replay_buffer.lease_timeout_s=60")
    c, client = rb.client(), _client(rb)
    none: Any = None
    worker = RolloutWorker(_config(rb), "w1", "127.0.0.1:1", none, none, client, Decoder(none))
    try:
        await c.call("EnqueuePrompts", groups=[prompt("g"), prompt("h")])
        epoch = await begin(c, "w1")
        lg, lh = (await client.lease("w1", 0, epoch, 2)).leases
        await worker._submit(lh, _scored(lg.group, 0))  # g's group on h's lease: refused (lease of another group)
        assert (worker.stats.groups_submitted, worker.stats.groups_released) == (0, 1)
        stats = await c.call("Stats")
        assert (stats.released, stats.leases_outstanding, stats.submitted) == (1, 1, 0)  # h goes back to the pool
        assert await _payload_keys(client) == []  # the refused bytes were freed
        await worker._submit(lg, _scored(lg.group, 0))
        assert worker.stats.groups_submitted == 1
    finally:
        await client.close()


async def test_an_orphaned_payload_expires_and_a_submit_after_that_is_refused(buffer) -> None:
    rb = await buffer()
    c, client = rb.client(), _client(rb)
    try:
        await c.call("EnqueuePrompts", groups=[prompt("g")])
        epoch = await begin(c, "w1")
        (x,) = (await client.lease("w1", 0, epoch, 1)).leases
        header, data = scored_group.encode(scored(to_proto_prompt(x.group), 0))
        short = PayloadStore(client.payloads.url, client.payloads.prefix, Outage("redis", 5.0), ttl_ms=100)
        (key,) = await short.put([("g", data)])  # the worker dies here, before its submit
        await asyncio.sleep(0.5)
        assert await _payload_keys(client) == []  # nothing leaked
        with pytest.raises(aio.AioRpcError) as err:
            await c.call("SubmitGroup", worker_id="w1", lease_id=x.lease_id, header=header, payload_key=key)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "write it again" in err.value.details()
        assert not (await client.submit("w1", x.lease_id, _scored(x.group, 0))).duplicate  # the lease still held
        await short.close()
    finally:
        await client.close()


async def test_a_submit_may_name_only_a_payload_key_of_its_own_group(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    prefix = rb.cfg.redis.key_prefix
    await c.call("EnqueuePrompts", groups=[prompt("g"), prompt("h")])
    epoch = await begin(c, "w1")
    x, _ = (await c.call("LeasePrompts", worker_id="w1", weight_epoch=epoch, max_groups=2)).leases
    header, data = scored_group.encode(scored(to_proto_prompt(x.group), 0))
    for key in (f"{{{prefix}}}:status", payload_key(prefix, "h"), payload_key(prefix, "g")[:-8] + "NOT-HEX!"):
        with pytest.raises(aio.AioRpcError) as err:
            await c.call("SubmitGroup", worker_id="w1", lease_id=x.lease_id, header=header, payload_key=key)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a payload key of group 'g'" in (
            err.value.details() or "")
    key = payload_key(prefix, "g")
    assert c.redis is not None
    await c.redis.set(key, data[:-1], px=60_000)
    with pytest.raises(aio.AioRpcError) as err:
        await c.call("SubmitGroup", worker_id="w1", lease_id=x.lease_id, header=header, payload_key=key)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "header.payload_bytes" in err.value.details()
    assert await c.redis.exists(key) == 0  # refused: freed
    assert (await c.call("Stats")).leases_outstanding == 2


async def test_payload_store_rides_out_a_redis_outage_and_names_redis_past_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # always: everysec may answer before its AOF write while an fsync is slow (test_rb_redis_outage.py says more).
    url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")
    caplog.set_level(logging.INFO, logger="services.runtime.outage")
    store = PayloadStore(url, "po", Outage(f"redis at {url}", 60.0), ttl_ms=60_000)
    try:
        (key,) = await store.put([("g", b"before")])
        redis.kill()
        writing = asyncio.create_task(store.put([("g", b"during")]))
        await asyncio.sleep(1.0)
        assert not writing.done()
        url, redis = start_embedded_redis(tmp_path / "redis", appendfsync="always")  # from its AOF
        (later,) = await asyncio.wait_for(writing, 60)
        assert await store.get([key, later]) == [b"before", b"during"]
        assert store.outage.outages == 1
        assert len([r for r in caplog.records if "is unavailable (" in r.getMessage()]) == 1
        redis.kill()
        store.outage = Outage(f"redis at {url}", 1.0)
        with pytest.raises(ServiceDown, match=f"redis at {url} has been down for"):
            await store.get([key])
    finally:
        await store.close()
        redis.stop()


async def test_a_worker_holds_as_many_answers_of_one_answer_validation_groups_as_of_training_groups(buffer) -> None:
    """`rollout.max_groups_in_flight` counts answers: 2 groups of 4 answers allow 8, and validation tasks of one
    answer each are leased while a whole training group still fits, 5 at once, never past 8 (with groups counted,
    a round of 200 tasks went to the engine 16 at a time where 16 groups of 8, 128 answers, were allowed)."""
    from fleet.contracts.weights import WeightsId
    from rollout.worker import Decoder, RolloutWorker

    rb = await buffer("replay_buffer.lease_timeout_s=60")
    c, client = rb.client(), _client(rb)
    none: Any = None
    cfg = _config(rb, "rollout.max_groups_in_flight=2", "grpo.num_generations_per_prompt=4")
    worker = RolloutWorker(cfg, "w1", "127.0.0.1:1", none, none, client, Decoder(none))
    go, peak = asyncio.Event(), [0]

    async def generate(group: PromptGroup) -> ScoredGroup:  # the engine's part, held until `go`
        peak[0] = max(peak[0], len(worker.in_flight))
        await go.wait()
        return _scored(group, 0)

    worker.process_group = generate  # type: ignore[method-assign]

    async def round_of(groups: list[Any]) -> int:
        peak[0] = 0
        go.clear()
        await c.call("EnqueuePrompts", groups=groups)
        seen = [0]
        for _ in range(200):  # until the worker has taken groups and stopped taking more for 0.5 s
            await asyncio.sleep(0.05)
            seen.append(len(worker.in_flight))
            if seen[-1] and len(set(seen[-10:])) == 1:
                break
        held = peak[0]
        go.set()
        expected = worker.stats.groups_submitted + len(groups)  # none of this round submitted before `go`
        for _ in range(500):  # every group of the round generated and submitted, the last ones leased after `go`
            if worker.stats.groups_submitted == expected and not worker.in_flight:
                break
            await asyncio.sleep(0.02)
        return held

    loop: asyncio.Task[None] | None = None
    try:
        epoch = await begin(c, "w1")
        worker.weights = WeightsId(epoch, 0)
        loop = asyncio.create_task(worker.lease_loop())
        assert await round_of([prompt(f"v{i}", validation=True, generations=1) for i in range(12)]) == 8 - 4 + 1
        assert await round_of([prompt(f"t{i}", generations=4) for i in range(5)]) == 2
        assert worker.stats.groups_submitted == 12 + 5
    finally:
        if loop is not None:
            loop.cancel()
        await client.close()
