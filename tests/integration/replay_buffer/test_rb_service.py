"""The replay-buffer service over gRPC on 127.0.0.1 with a real Redis: the contract of replay_buffer.proto."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rb_service_helpers import Client, begin, groups_of, invariant_holds, lease, prompt, scored, submit, worker

from fleet.config import load_config
from fleet.contracts import scored_group
from grpofleet.v1 import replay_buffer_pb2 as pb
from services.replay_buffer.servicer import SERVICE_NAME


async def test_lease_submit_sample_round_trip(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    prompts = [prompt(f"g{i}") for i in range(3)]
    assert (await c.call("EnqueuePrompts", groups=prompts)).enqueued == 3
    assert (await c.call("EnqueuePrompts", groups=prompts[:1])).duplicates == 1
    epoch = await begin(c, "w1")
    leases = (await lease(c, "w1", 0, epoch)).leases
    assert [x.group.group_id for x in leases] == ["g0", "g1", "g2"]
    assert leases[0].group.enqueued_at_ms > 0 and leases[0].delivery_count == 1
    sent = {x.group.group_id: scored(x.group, 0) for x in leases}
    for x in leases:
        assert (await submit(c, "w1", x.lease_id, sent[x.group.group_id])) == pb.SubmitGroupResponse()
    assert (await submit(c, "w1", leases[0].lease_id, sent["g0"])).duplicate
    reply = await c.call("Sample", step=0, num_groups=3, deadline_ms=1000)
    assert list(await groups_of(c, reply)) == [sent["g0"], sent["g1"], sent["g2"]]  # whole groups, byte for byte
    assert not reply.HasField("starvation")
    stats = await c.call("Stats")
    assert (stats.enqueued, stats.duplicates, stats.submitted, stats.sampled, stats.epoch) == (3, 1, 3, 3, epoch)
    assert dict(stats.age_histogram) == {0: 3} and stats.live_workers == 1 and stats.max_age == 1
    assert invariant_holds(stats)
    assert (await rb.app.store.accounting()).ok


async def test_back_pressure_at_the_age_bound(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("s0", 0), prompt("s2", 2), prompt("s3", 3)])
    epoch = await begin(c, "w1")
    assert [x.group.group_id for x in (await lease(c, "w1", 0, epoch)).leases] == ["s0"]
    empty = await lease(c, "w1", 0, epoch)
    assert (len(empty.leases), empty.reason, empty.retry_after_ms) == (0, "age_bound", 50)
    await c.call("PublishVersion", version=1, epoch=epoch, step=1)
    assert [x.group.group_id for x in (await lease(c, "w1", 1, epoch)).leases] == ["s2"]
    # The trainer is at step 3 now: a worker still on version 1 would produce groups too old for it.
    await c.call("PublishVersion", version=3, epoch=epoch, step=3)
    assert (await lease(c, "w1", 1, epoch)).reason == "age_bound"
    assert [x.group.group_id for x in (await lease(c, "w1", 2, epoch)).leases] == ["s3"]
    assert (await lease(c, "w1", 3, epoch)).reason == "queue_empty"


async def test_groups_past_the_bound_are_dead_lettered_with_reason(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("old"), prompt("fresh"), prompt("late")])
    epoch = await begin(c, "w1")
    lo, lf, ll = (await lease(c, "w1", 0, epoch)).leases
    await submit(c, "w1", lo.lease_id, scored(lo.group, 0))
    await submit(c, "w1", lf.lease_id, scored(lf.group, 1, newest=2))
    reply = await c.call("Sample", step=2, num_groups=2, deadline_ms=0)
    assert [g.prompt.group_id for g in await groups_of(c, reply)] == ["fresh"]
    assert (reply.starvation.reason, reply.starvation.evicted_now) == ("generating", 1)
    await c.call("PublishVersion", version=3, epoch=epoch, step=3)
    assert (await submit(c, "w1", ll.lease_id, scored(ll.group, 1))).dead_lettered
    stats = await c.call("Stats")
    assert dict(stats.dead_lettered_by_reason) == {"too_old": 1, "stale_on_submit": 1}
    assert invariant_holds(stats)


async def test_a_live_workers_heartbeat_keeps_its_lease_past_the_timeout_and_its_death_frees_it(buffer) -> None:
    # A group that grades for longer than the lease timeout (SWE-bench tasks run up to 30 minutes) stays with the
    # worker that heartbeats; once the heartbeats stop, it goes back within the timeout.
    # A heartbeat every 0.2 s against a 1 s timeout: a 5x margin, so a loaded CI machine's stalls of a few hundred
    # milliseconds between two calls do not expire the lease (a 0.3 s timeout against 0.1 s heartbeats did).
    rb = await buffer("replay_buffer.lease_timeout_s=1.0")
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("g")])
    epoch = await begin(c, "slow", "w2")
    (held,) = (await lease(c, "slow", 0, epoch)).leases
    for _ in range(15):  # 3 s: three lease timeouts
        await c.call("Heartbeat", worker=worker("slow", 0, epoch))
        await asyncio.sleep(0.2)
        assert (await lease(c, "w2", 0, epoch)).reason == "queue_empty"
    assert not (await submit(c, "slow", held.lease_id, scored(held.group, 0))).duplicate
    await c.call("EnqueuePrompts", groups=[prompt("h")])
    (orphan,) = (await lease(c, "slow", 0, epoch)).leases  # and then "slow" dies: no more heartbeats
    for _ in range(200):  # up to 10 s for a 1 s timeout
        again = (await lease(c, "w2", 0, epoch)).leases
        if again:
            break
        await asyncio.sleep(0.05)
    assert [(x.group.group_id, x.delivery_count) for x in again] == [("h", 2)], orphan
    assert (await c.call("Stats")).reclaimed == 1


async def test_lease_of_a_worker_that_never_submits_is_reclaimed_and_trained_once(buffer) -> None:
    rb = await buffer("replay_buffer.lease_timeout_s=0.3")
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("g")])
    epoch = await begin(c, "doomed", "w2")
    (first,) = (await lease(c, "doomed", 0, epoch)).leases  # and then the worker is SIGKILLed
    assert (await lease(c, "w2", 0, epoch)).reason == "queue_empty"
    for _ in range(50):
        leases = (await lease(c, "w2", 0, epoch)).leases
        if leases:
            break
        await asyncio.sleep(0.05)
    (second,) = leases
    assert (second.group.group_id, second.delivery_count) == ("g", 2)
    await submit(c, "w2", second.lease_id, scored(second.group, 0))
    assert (await submit(c, "doomed", first.lease_id, scored(first.group, 0))).duplicate
    reply = await c.call("Sample", step=0, num_groups=2, deadline_ms=300, min_groups=1)
    assert [g.prompt.group_id for g in await groups_of(c, reply)] == ["g"]
    stats = await c.call("Stats")
    assert (stats.reclaimed, stats.submitted, stats.sampled, stats.leases_outstanding) == (1, 1, 1, 0)
    assert (await rb.app.store.accounting()).ok


async def test_begin_run_returns_sampled_groups_the_checkpoint_did_not_commit(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt(f"s{s}", s) for s in range(3)])
    epoch = await begin(c, "w1")
    for step in range(3):
        await c.call("PublishVersion", version=step, epoch=epoch, step=step)
        (x,) = (await lease(c, "w1", step, epoch, 1)).leases
        await submit(c, "w1", x.lease_id, scored(x.group, step))
        assert len(await groups_of(c, await c.call("Sample", step=step, num_groups=1, deadline_ms=1000))) == 1
        if step == 0:
            assert (await c.call("CommitStep", step=0, epoch=epoch)).committed_groups == 1
    # Crash after training step 2; the checkpoint holds step 1. Step 2's group must be trained again, once.
    resumed = await c.call("BeginRun", resume_step=2, weight_version=2)
    assert (resumed.epoch, resumed.returned_groups, resumed.committed_groups) == (epoch + 1, 1, 1)
    reply = await c.call("Sample", step=2, num_groups=1, deadline_ms=0)
    assert [g.prompt.group_id for g in await groups_of(c, reply)] == ["s2"]
    stats = await c.call("Stats")
    assert (stats.returned_on_resume, stats.sampled, stats.uncommitted_groups, stats.min_target_step) == (1, 3, 1, 2)
    with pytest.raises(aio.AioRpcError) as err:  # the dead trainer's epoch is over
        await c.call("CommitStep", step=2, epoch=epoch)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_validation_groups_are_sampled_only_for_validation(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("v", validation=True), prompt("t")])
    epoch = await begin(c, "w1")
    for x in (await lease(c, "w1", 0, epoch)).leases:
        await submit(c, "w1", x.lease_id, scored(x.group, 0))
    assert [g.prompt.group_id for g in await groups_of(c, await c.call("Sample", step=9, num_groups=5))] == []
    val = await c.call("Sample", step=9, num_groups=5, validation=True)
    assert [g.prompt.group_id for g in await groups_of(c, val)] == ["v"]


async def test_worker_registry(buffer) -> None:
    rb = await buffer("replay_buffer.worker_timeout_s=0.3", "replay_buffer.heartbeat_interval_s=0.1")
    c = rb.client()
    epoch = await begin(c)
    reg = await c.call("RegisterWorker", worker=worker("w1", 0, epoch))
    assert (reg.heartbeat_interval_ms, reg.epoch, reg.current_version) == (100, epoch, 0)
    await c.call("RegisterWorker", worker=worker("w2", 0, epoch))
    await asyncio.sleep(0.35)
    hb = await c.call("Heartbeat", worker=worker("w1", 1, epoch))
    assert hb.epoch == epoch
    live = (await c.call("ListWorkers")).workers
    assert [(w.worker_id, w.weight_version) for w in live] == [("w1", 1)]
    assert [w.worker_id for w in (await c.call("ListWorkers", include_dead=True)).workers] == ["w1", "w2"]


_NOPE = scored(prompt("nope"), 0)
BAD_REQUESTS = [
    ("EnqueuePrompts", {"groups": [prompt("")]}, "INVALID_ARGUMENT", "group_id must not be empty"),
    ("EnqueuePrompts", {"groups": [prompt("a", -1)]}, "INVALID_ARGUMENT", "target_step must be >= 0"),
    ("EnqueuePrompts", {"groups": [prompt("a", generations=0)]}, "INVALID_ARGUMENT", "num_generations"),
    ("LeasePrompts", {"worker_id": "", "max_groups": 1}, "INVALID_ARGUMENT", "worker_id must not be empty"),
    ("LeasePrompts", {"worker_id": "w1", "weight_version": -1, "max_groups": 1}, "INVALID_ARGUMENT", "weight_version"),
    ("LeasePrompts", {"worker_id": "w1", "max_groups": 0}, "INVALID_ARGUMENT", "max_groups must be >= 1"),
    ("LeasePrompts", {"worker_id": "~pool", "max_groups": 1}, "INVALID_ARGUMENT", "reserved"),
    ("LeasePrompts", {"worker_id": "nobody", "max_groups": 1}, "FAILED_PRECONDITION", "not registered"),
    ("Sample", {"step": -1, "num_groups": 1}, "INVALID_ARGUMENT", "step must be >= 0"),
    ("Sample", {"step": 0, "num_groups": 0}, "INVALID_ARGUMENT", "num_groups must be >= 1"),
    ("Sample", {"step": 0, "num_groups": 1, "min_groups": 2}, "INVALID_ARGUMENT", "min_groups"),
    ("Sample", {"step": 0, "num_groups": 1, "deadline_ms": -5}, "INVALID_ARGUMENT", "deadline_ms"),
    ("BeginRun", {"resume_step": -3}, "INVALID_ARGUMENT", "resume_step must be >= 0"),
    ("PublishVersion", {"version": 1, "epoch": 99, "step": 1}, "FAILED_PRECONDITION", "epoch"),
    ("PublishVersion", {"version": -1}, "INVALID_ARGUMENT", "version must be >= 0"),
    ("CommitStep", {"step": -1}, "INVALID_ARGUMENT", "step must be >= 0"),
    ("Heartbeat", {"worker": worker("ghost")}, "NOT_FOUND", "not registered"),
    ("RegisterWorker", {"worker": pb.WorkerInfo(worker_id="w")}, "INVALID_ARGUMENT", "address"),
    ("ReleaseLease", {"worker_id": "w1", "lease_id": "1-0@1"}, "NOT_FOUND", "not outstanding"),
    ("ReleaseLease", {"worker_id": "w1", "lease_id": "bogus"}, "INVALID_ARGUMENT", "malformed lease id"),
    ("SubmitGroup", {"worker_id": "w1", "lease_id": "1-0@1"}, "INVALID_ARGUMENT", "scored_group must be set"),
    ("SubmitGroup", {"worker_id": "w1", "lease_id": "1-0@1", "header": scored_group.header_of(_NOPE),
                     "scored_group": _NOPE.SerializeToString()}, "NOT_FOUND", "never enqueued"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "fields", "code", "text"), BAD_REQUESTS, ids=[f"{b[0]}-{b[3]}" for b in BAD_REQUESTS]
)
async def test_bad_requests_get_a_status_code_not_a_crash(buffer, method, fields, code, text) -> None:  # noqa: ANN001
    rb = await buffer()
    c = rb.client()
    with pytest.raises(aio.AioRpcError) as err:
        await c.call(method, **fields)
    assert err.value.code() == getattr(grpc.StatusCode, code), err.value.details()
    assert text in (err.value.details() or "")
    assert (await c.call("Stats")).enqueued == 0  # and the service still answers


async def test_submit_of_a_broken_group_is_invalid(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    await c.call("EnqueuePrompts", groups=[prompt("g")])
    epoch = await begin(c, "w1")
    (x,) = (await lease(c, "w1", 0, epoch)).leases
    partial = scored(x.group, 0)
    del partial.trajectories[1]
    lying = scored(x.group, 0, newest=1)
    lying.min_version = 1  # claims younger weights than its first tokens had
    unaligned = scored(x.group, 0)
    unaligned.trajectories[0].generation_logprobs.append(0.0)
    for bad, text in ((partial, "whole groups"), (lying, "< group.min_version"), (unaligned, "differ in length")):
        with pytest.raises(aio.AioRpcError) as err:
            await submit(c, "w1", x.lease_id, bad, inline=True)  # the buffer checks what it reads: inline bytes
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in (err.value.details() or "")
    with pytest.raises(aio.AioRpcError) as err:
        await submit(c, "w1", "not-a-lease", scored(x.group, 0))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not (await submit(c, "w1", x.lease_id, scored(x.group, 0))).duplicate


async def test_oversized_message_is_resource_exhausted(buffer) -> None:
    rb = await buffer("services.max_message_mb=1")
    big = [prompt(f"g{i}") for i in range(4)]
    for p in big:
        p.env_payload = b"x" * 400_000
    # A client allowed to send 64 MB; the server accepts 1 MB, and grpc itself refuses the rest.
    c = Client(rb.address, load_config(None, []))
    try:
        with pytest.raises(aio.AioRpcError) as err:
            await c.call("EnqueuePrompts", groups=big)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (await c.call("EnqueuePrompts", groups=big[:1])).enqueued == 1
    finally:
        await c.close()


async def test_auth_on_requires_the_token_except_for_health(buffer) -> None:
    rb = await buffer("services.auth_token=s3cret")
    anonymous, wrong, good = rb.client(token=""), rb.client(token="guess"), rb.client(token="s3cret")
    for c in (anonymous, wrong):
        with pytest.raises(aio.AioRpcError) as err:
            await c.call("Stats")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await good.call("Stats")).enqueued == 0
    health = health_pb2_grpc.HealthStub(anonymous.channel)
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_auth_off_needs_no_token(buffer) -> None:
    rb = await buffer()
    assert (await rb.client(token="").call("Stats")).epoch == 0


async def test_every_rpc_of_the_contract_is_served(buffer) -> None:
    rb = await buffer()
    c = rb.client()
    for method in pb.DESCRIPTOR.services_by_name["ReplayBuffer"].methods:
        try:
            await c.call(method.name)
        except aio.AioRpcError as exc:  # default requests are mostly invalid; what matters is they are handled
            assert exc.code() != grpc.StatusCode.UNIMPLEMENTED, method.name
            assert exc.code() != grpc.StatusCode.INTERNAL and exc.code() != grpc.StatusCode.UNKNOWN, method.name
