"""ReplayStore against a real Redis: every transition, every error, and the accounting check after each test."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from rb_store_helpers import assert_accounting, prompts, read, scored, start_run

from services.replay_buffer.models import WorkerRecord
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound


async def test_enqueue_is_idempotent_on_group_id(make_store) -> None:
    store = await make_store()
    assert await store.enqueue(prompts(("a", 0), ("b", 0))) == (2, 0)
    assert await store.enqueue(prompts(("a", 5), ("c", 0), ("c", 0))) == (1, 2)
    stats = await store.stats()
    assert (stats.counters["enqueued"], stats.counters["duplicates"], stats.prompts_pending) == (3, 2, 3)
    await assert_accounting(store)


async def test_lease_needs_a_run_a_registered_worker_and_the_current_epoch(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0)))
    await store.workers.put(WorkerRecord("w1", "w1:1"))
    with pytest.raises(FailedPrecondition, match="BeginRun"):
        await store.lease("w1", 0, 0, 1)
    epoch = await start_run(store)
    with pytest.raises(FailedPrecondition, match="not registered"):
        await store.lease("w2", 0, epoch, 1)
    with pytest.raises(FailedPrecondition, match="join handshake"):
        await store.lease("w1", 0, epoch + 1, 1)
    assert len((await store.lease("w1", 0, epoch, 1)).leases) == 1
    await assert_accounting(store)


async def test_lease_takes_only_the_eligible_prefix_then_answers_age_bound(make_store) -> None:
    store = await make_store(max_age=1, retry_after_ms=321)
    await store.enqueue(prompts(("s0", 0), ("s1", 1), ("s2", 2), ("s1b", 1)))
    epoch = await start_run(store, "w")
    got = await store.lease("w", 0, epoch, 10)
    assert [x.group_id for x in got.leases] == ["s0", "s1"]  # s2 needs version >= 1; s1b waits behind it
    assert [x.delivery_count for x in got.leases] == [1, 1]
    empty = await store.lease("w", 0, epoch, 10)
    assert (empty.leases, empty.reason, empty.retry_after_ms) == ([], "age_bound", 321)
    assert [x.group_id for x in (await store.lease("w", 1, epoch, 10)).leases] == ["s2", "s1b"]
    await assert_accounting(store)


async def test_empty_queue_answers_queue_empty(make_store) -> None:
    store = await make_store()
    epoch = await start_run(store, "w")
    res = await store.lease("w", 0, epoch, 4)
    assert (res.leases, res.reason) == ([], "queue_empty")
    assert res.retry_after_ms > 0


async def test_sync_mode_leases_only_the_current_step(make_store) -> None:
    store = await make_store(max_age=0)
    await store.enqueue(prompts(("s0", 0), ("s1", 1)))
    epoch = await start_run(store, "w")
    assert [x.group_id for x in (await store.lease("w", 0, epoch, 4)).leases] == ["s0"]
    assert (await store.lease("w", 0, epoch, 4)).reason == "age_bound"


async def test_round_trip_and_duplicate_submit_stores_once(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    (lease,) = (await store.lease("w", 0, epoch, 1)).leases
    assert lease.payload == b"prompt:a" and lease.kind == "prompt"
    first = await store.submit(lease.lease_id, scored("a", 0))
    again = await store.submit(lease.lease_id, scored("a", 0))
    assert (first.duplicate, again.duplicate, again.dead_lettered) == (False, True, False)
    stats = await store.stats()
    assert (stats.counters["submitted"], stats.groups_ready, stats.prompts_pending) == (1, 1, 0)
    res = await store.sample(0, 1, 0)
    assert await read(store, res) == [b"scored:a"] and res.starvation is None
    assert (await store.stats()).age_histogram == {0: 1}
    await assert_accounting(store)


async def test_submit_rejects_unknown_groups_and_foreign_or_forged_leases(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    la, lb = (await store.lease("w", 0, epoch, 2)).leases
    with pytest.raises(NotFound, match="never enqueued"):
        await store.submit(la.lease_id, scored("zzz", 0))
    with pytest.raises(InvalidArgument, match="malformed lease id"):
        await store.submit("nonsense", scored("a", 0))
    with pytest.raises(InvalidArgument, match="is for group 'b'"):
        await store.submit(lb.lease_id, scored("a", 0))
    with pytest.raises(NotFound, match="never granted"):
        await store.submit(f"1-0@{epoch}", scored("a", 0))
    # "c" is queued but was never leased: its entry id cannot be submitted against.
    entry_c = (await store.redis.xrange(store.keys.prompts))[-1][0].decode()
    with pytest.raises(NotFound, match="never granted"):
        await store.submit(f"{entry_c}@{epoch}", scored("c", 0))
    await assert_accounting(store)


async def test_sample_returns_oldest_weights_first(make_store) -> None:
    store = await make_store(max_age=3)
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    leases = (await store.lease("w", 2, epoch, 3)).leases
    for lease, v in zip(leases, [2, 0, 1], strict=True):
        await store.submit(lease.lease_id, scored(lease.group_id, v))
    assert await read(store, await store.sample(2, 3, 0)) == [b"scored:b", b"scored:c", b"scored:a"]
    assert (await store.stats()).age_histogram == {2: 1, 1: 1, 0: 1}


async def test_groups_beyond_the_age_bound_are_dead_lettered_not_sampled(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(("old", 0), ("ok", 0)))
    epoch = await start_run(store, "w")
    lo, lk = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(lo.lease_id, scored("old", 0))
    await store.submit(lk.lease_id, scored("ok", 1))
    res = await store.sample(2, 2, 0)
    assert await read(store, res) == [b"scored:ok"]
    assert res.starvation is not None and res.starvation.evicted_now == 1
    (fields,) = await store.dead_letters()
    assert fields["gid"] == b"old" and fields["reason"] == b"too_old" and fields["data"] == b"scored:old"
    assert (await store.stats()).dead_by_reason == {"too_old": 1}
    await assert_accounting(store)


async def test_submit_of_a_group_already_too_old_is_dead_lettered(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    (lease,) = (await store.lease("w", 0, epoch, 1)).leases
    await store.publish_version(3, epoch, 3)
    res = await store.submit(lease.lease_id, scored("a", 0))
    assert res.dead_lettered and not res.duplicate
    assert (await store.stats()).dead_by_reason == {"stale_on_submit": 1}
    await assert_accounting(store)


async def test_sample_waits_for_a_submit_and_wakes_at_once(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    (lease,) = (await store.lease("w", 0, epoch, 1)).leases
    waiting = asyncio.create_task(store.sample(0, 1, 10.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await store.submit(lease.lease_id, scored("a", 0))
    res = await asyncio.wait_for(waiting, 2.0)
    assert await read(store, res) == [b"scored:a"]


async def test_a_short_answer_says_why(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, _ = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(la.lease_id, scored("a", 0))
    res = await store.sample(0, 2, 0.05)
    assert await read(store, res) == [b"scored:a"]
    s = res.starvation
    assert s is not None
    assert (s.reason, s.prompts_pending, s.leases_outstanding, s.live_workers) == ("generating", 1, 1, 1)
    assert s.waited_s >= 0.05
    empty = await (await make_store()).sample(0, 1, 0)
    assert await read(store, empty) == [] and empty.starvation is not None and empty.starvation.reason == "no_prompts"


async def test_min_groups_means_all_or_nothing_at_the_deadline(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, _ = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(la.lease_id, scored("a", 0))
    assert await read(store, await store.sample(0, 2, 0, min_groups=2)) == []
    assert await read(store, await store.sample(0, 2, 0, min_groups=1)) == [b"scored:a"]
    await assert_accounting(store)


async def test_validation_groups_are_kept_apart_and_never_age_out(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(("v", 0), validation=True) + prompts(("t", 0)))
    epoch = await start_run(store, "w")
    lv, lt = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(lv.lease_id, scored("v", 0, validation=True))
    await store.submit(lt.lease_id, scored("t", 0))
    assert (await store.stats()).validation_ready == 1
    assert await read(store, await store.sample(0, 5, 0)) == [b"scored:t"]
    assert await read(store, await store.sample(50, 5, 0, validation=True)) == [b"scored:v"]
    stats = await store.stats()
    assert stats.dead_by_reason == {} and stats.uncommitted == 1  # validation groups are not kept for resume
    await assert_accounting(store)


async def test_expired_lease_is_reclaimed_and_leased_again_first(make_store) -> None:
    store = await make_store(lease_timeout_ms=50)
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "dead-worker", "w2")
    (first,) = (await store.lease("dead-worker", 0, epoch, 1)).leases
    await asyncio.sleep(0.1)
    assert await store.reclaim_expired() == (1, 0)
    assert await store.reclaim_expired() == (0, 0)  # pool entries are not reclaimed twice
    again = (await store.lease("w2", 0, epoch, 2)).leases
    assert [(x.group_id, x.delivery_count) for x in again] == [("a", 2), ("b", 1)]
    await store.submit(again[0].lease_id, scored("a", 0))
    # The first holder was only slow: its late submit is a duplicate, the group is stored once.
    assert (await store.submit(first.lease_id, scored("a", 0))).duplicate
    assert await read(store, await store.sample(0, 5, 0)) == [b"scored:a"]
    assert (await store.stats()).counters["reclaimed"] == 1
    await assert_accounting(store)


async def test_group_is_dead_lettered_after_max_deliveries(make_store) -> None:
    store = await make_store(lease_timeout_ms=20, max_deliveries=2)
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    for expected in ((1, 0), (0, 1)):
        assert len((await store.lease("w", 0, epoch, 1)).leases) == 1
        await asyncio.sleep(0.05)
        assert await store.reclaim_expired() == expected
    assert (await store.stats()).dead_by_reason == {"max_deliveries": 1}
    assert (await store.lease("w", 0, epoch, 1)).reason == "queue_empty"
    await assert_accounting(store)


async def test_release_gives_the_lease_back_or_dead_letters_it(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, lb = (await store.lease("w", 0, epoch, 2)).leases
    assert await store.release(la.lease_id, dead_letter=False, detail="worker_draining") == "released"
    with pytest.raises(NotFound):
        await store.release(la.lease_id, dead_letter=False)
    assert await store.release(lb.lease_id, dead_letter=True, detail="scoring failed 3x") == "dead"
    (again,) = (await store.lease("w", 0, epoch, 5)).leases
    assert (again.group_id, again.delivery_count) == ("a", 2)
    (entry,) = await store.redis.xrange(store.keys.dead)
    assert entry[1][b"reason"] == b"released" and entry[1][b"detail"] == b"scoring failed 3x"
    await assert_accounting(store)


async def _sample_steps(store, epoch: int, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Enqueue, lease, submit and sample one group per step 0..steps-1, each generated one version behind."""
    await store.enqueue(prompts(*[(f"g{s}", s) for s in range(steps)]))
    for s in range(steps):
        await store.publish_version(s, epoch, s)
        (lease,) = (await store.lease("w", max(s - 1, 0), epoch, 1)).leases
        await store.submit(lease.lease_id, scored(lease.group_id, max(s - 1, 0)))
        assert await read(store, await store.sample(s, 1, 0)) == [f"scored:g{s}".encode()]


async def test_begin_run_returns_groups_sampled_after_the_checkpoint(make_store) -> None:
    store = await make_store()
    epoch = await start_run(store, "w")
    await _sample_steps(store, epoch, 4)
    assert await store.commit_step(0, epoch) == 1
    # The trainer dies after training steps 1..3 but its last checkpoint holds step 1: steps 2 and 3 come back
    # (generated with versions 1 and 2, which the resumed timeline shares).
    info = await store.begin_run(2, 2)
    assert (info.epoch, info.returned_groups, info.committed_groups, info.requeued_groups) == (epoch + 1, 2, 1, 0)
    assert await read(store, await store.sample(2, 5, 0)) == [b"scored:g2", b"scored:g3"]
    stats = await store.stats()
    assert (stats.counters["returned_on_resume"], stats.counters["sampled"], stats.committed_step) == (2, 4, 1)
    await assert_accounting(store)


async def test_commit_step_forgets_checkpointed_groups_and_checks_the_epoch(make_store) -> None:
    store = await make_store()
    epoch = await start_run(store, "w")
    await _sample_steps(store, epoch, 3)
    with pytest.raises(FailedPrecondition, match="epoch"):
        await store.commit_step(2, epoch + 1)
    assert await store.commit_step(1, epoch) == 2
    assert (await store.stats()).uncommitted == 1
    assert (await store.begin_run(3, 3)).returned_groups == 0  # step 2 < 3: committed by the resume itself
    assert await store.redis.xlen(store.keys.traj) == 0
    await assert_accounting(store)


async def test_resume_requeues_groups_generated_by_discarded_weights(make_store) -> None:
    store = await make_store(max_age=2)
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    la, lb, lc = (await store.lease("w", 0, epoch, 3)).leases
    await store.publish_version(2, epoch, 2)
    await store.submit(la.lease_id, scored("a", 0, 2))  # tokens of version 2
    await store.submit(lb.lease_id, scored("b", 0, 1))
    # The trainer resumes from its checkpoint at step 1: version 2 never happened in the new timeline.
    info = await store.begin_run(1, 1)
    assert info.requeued_groups == 1
    await store.workers.put(WorkerRecord("w", "w:1", 1, info.epoch))
    (again,) = (await store.lease("w", 1, info.epoch, 3)).leases
    # Leased again as the prompt it was enqueued as (kept with the header; the scored bytes are gone).
    assert (again.group_id, again.kind, again.payload) == ("a", "prompt", b"prompt:a")
    # "c" was leased in the old epoch and comes back with version-2 tokens too: leased again, not stored.
    res = await store.submit(lc.lease_id, scored("c", 1, 2))
    assert res.requeued and not res.dead_lettered
    assert (await store.submit(lb.lease_id, scored("b", 0))).duplicate
    assert (await store.stats()).counters["requeued"] == 2
    await assert_accounting(store)


async def test_publish_version_refuses_a_stale_trainer(make_store) -> None:
    store = await make_store()
    epoch = await start_run(store)
    await store.publish_version(4, epoch, 4)
    with pytest.raises(FailedPrecondition, match="epoch"):
        await store.publish_version(5, epoch - 1, 5)
    state = await store.run_state()
    assert (state["version"], state["step"]) == (4, 4)


async def test_sample_answer_stays_under_the_message_size(make_store) -> None:
    store = await make_store(max_response_bytes=20)
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    for lease in (await store.lease("w", 0, epoch, 3)).leases:
        await store.submit(lease.lease_id, scored(lease.group_id, 0))
    res = await store.sample(0, 3, 0)
    assert len(await read(store, res)) == 2  # 9 + 9 bytes fit in 20, the third would not
    assert res.starvation is not None and res.starvation.reason == "max_message_size"
    await assert_accounting(store)


async def test_worker_registry_heartbeats_and_liveness(make_store) -> None:
    store = await make_store(worker_timeout_ms=100)
    with pytest.raises(NotFound, match="not registered"):
        await store.workers.put(WorkerRecord("w", "w:1"), must_exist=True)
    await store.workers.put(WorkerRecord("w", "w:1", 3, 1, state="serving"))
    await store.workers.put(WorkerRecord("w", "w:1", 4, 1, state="serving"), must_exist=True)
    (w,) = await store.workers.list()
    assert (w.worker_id, w.weight_version, w.state) == ("w", 4, "serving") and w.last_heartbeat_ms > 0
    await asyncio.sleep(0.15)
    assert await store.workers.list() == []
    assert [x.worker_id for x in await store.workers.list(include_dead=True)] == ["w"]
    assert (await store.stats()).live_workers == 0


async def test_stats_satisfy_the_accounting_invariant(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(*[(f"g{i}", 0) for i in range(6)]))
    epoch = await start_run(store, "w")
    leases = (await store.lease("w", 0, epoch, 4)).leases
    await store.submit(leases[0].lease_id, scored(leases[0].group_id, 0))
    await store.submit(leases[1].lease_id, scored(leases[1].group_id, 1))
    await store.release(leases[2].lease_id, dead_letter=True)
    await store.sample(2, 5, 0)  # one sampled, one too old
    s = await store.stats()
    c = s.counters
    assert c["enqueued"] == c["sampled"] + s.prompts_pending + s.groups_ready + s.validation_ready + c["dead_lettered"]
    assert (c["sampled"], s.prompts_pending, c["dead_lettered"], s.leases_outstanding) == (1, 3, 2, 1)
    await assert_accounting(store)


async def test_lost_consumer_group_is_recreated(make_store) -> None:
    store = await make_store()
    await store.redis.delete(store.keys.prompts)
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    assert [x.group_id for x in (await store.lease("w", 0, epoch, 1)).leases] == ["a"]


async def test_accounting_detects_a_transition_that_updated_one_place_only(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0)))
    await store.redis.hset(store.keys.status, "a", "scored")  # as if a submit had lost its stream write
    acc = await store.accounting()
    assert not acc.ok
    assert any("ready sets" in v for v in acc.violations)
    assert dataclasses.replace(acc, violations=[]).ok


async def test_a_dangling_index_entry_is_skipped_not_served(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    for lease in (await store.lease("w", 0, epoch, 2)).leases:
        await store.submit(lease.lease_id, scored(lease.group_id, 0))
    first = (await store.redis.xrange(store.keys.traj))[0][0]
    await store.redis.xdel(store.keys.traj, first)  # data lost behind the buffer's back
    assert await read(store, await store.sample(0, 2, 0)) == [b"scored:b"]
    acc = await store.accounting()
    assert not acc.ok and any("state scored" in v for v in acc.violations)


async def test_a_retried_sample_gets_the_same_groups_not_more(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    for lease in (await store.lease("w", 0, epoch, 3)).leases:
        await store.submit(lease.lease_id, scored(lease.group_id, 0))
    first = await store.sample(0, 2, 0, request_id="1:0:0")  # ... and the answer is lost in transit
    again = await store.sample(0, 2, 0, request_id="1:0:0")
    assert await read(store, first) == await read(store, again) == [b"scored:a", b"scored:b"]
    assert await read(store, await store.sample(0, 2, 0, request_id="1:0:1")) == [b"scored:c"]
    assert (await store.stats()).counters["sampled"] == 3
    await store.commit_step(0, epoch)
    assert await read(store, await store.sample(0, 2, 0, request_id="1:0:0")) == []  # committed: nothing to replay
    await assert_accounting(store)
