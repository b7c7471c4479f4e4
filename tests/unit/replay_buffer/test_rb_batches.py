"""The scripts' per-call batching (issue 20: one command per call for what every group of a call changes alike):
several groups of one SubmitGroups, Sample or CommitStep are judged exactly as if each were a call of its own."""

from __future__ import annotations

from rb_store_helpers import assert_accounting, prompts, read, scored, start_run

from services.runtime.errors import NotFound


async def test_a_group_named_twice_in_one_submit_batch_is_stored_once(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, lb = (await store.lease("w", 0, epoch, 2)).leases
    out = await store.submit_many(
        [(la.lease_id, scored("a", 0)), (la.lease_id, scored("a", 0)), (lb.lease_id, scored("b", 0))]
    )
    assert [(r.duplicate, r.dead_lettered) for r in out if not isinstance(r, Exception)] == [
        (False, False), (True, False), (False, False),
    ]  # fmt: skip
    stats = await store.stats()
    assert (stats.counters["submitted"], stats.groups_ready, stats.leases_outstanding) == (2, 2, 0)
    assert len([k async for k in store.redis.scan_iter(match=f"{{{store.settings.prefix}}}:payload:*")]) == 2
    await assert_accounting(store)


async def test_a_lease_acknowledged_earlier_in_the_batch_is_not_granted_again(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, _ = (await store.lease("w", 0, epoch, 2)).leases
    ok, again = await store.submit_many([(la.lease_id, scored("a", 0)), (la.lease_id, scored("b", 0))])
    assert not isinstance(ok, Exception) and not ok.duplicate
    assert isinstance(again, NotFound) and "never granted" in str(again)
    await assert_accounting(store)


async def test_one_sample_counts_each_groups_age_and_commit_frees_every_payload(make_store) -> None:
    store = await make_store(max_age=3)
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    leases = (await store.lease("w", 0, epoch, 3)).leases
    for lease, (gid, v) in zip(leases, (("a", 0), ("b", 0), ("c", 1)), strict=True):
        await store.submit(lease.lease_id, scored(gid, v))
    res = await store.sample(2, 3, deadline_s=1.0)
    assert len(await read(store, res)) == 3
    stats = await store.stats()
    assert (stats.age_histogram, stats.counters["sampled"], stats.uncommitted) == ({2: 2, 1: 1}, 3, 3)
    await assert_accounting(store)
    assert await store.commit_step(2, epoch) == 3
    assert await store.redis.exists(*res.payload_keys) == 0
    assert (await store.stats()).uncommitted == 0
    await assert_accounting(store)


async def test_commit_frees_the_payload_of_a_trained_entry_written_without_its_key(make_store) -> None:
    """A trained entry of a buffer from before the entries named their payload key: read off the traj entry."""
    store = await make_store()
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    (lease,) = (await store.lease("w", 0, epoch, 1)).leases
    await store.submit(lease.lease_id, scored("a", 0))
    res = await store.sample(0, 1, deadline_s=1.0)
    ((eid, fields),) = await store.redis.xrange(store.keys.trained)
    await store.redis.xdel(store.keys.trained, eid)
    await store.redis.xadd(store.keys.trained, {k: v for k, v in fields.items() if k != b"pk"})
    assert await store.commit_step(0, epoch) == 1
    assert await store.redis.exists(*res.payload_keys) == 0
    await assert_accounting(store)
