"""Payload keys: a scored group's bytes are held once, in a key of their own, for exactly as long as the group needs
them (stored, sampled-but-uncommitted, dead-lettered), and no submit outcome leaves one behind."""

from __future__ import annotations

from rb_store_helpers import assert_accounting, prompts, read, scored, start_run

from services.replay_buffer.store import ReplayStore


async def _payload_keys(store: ReplayStore) -> dict[str, bytes]:
    keys = [k async for k in store.redis.scan_iter(match=store.keys.payload("*"))]
    return {k.decode(): await store.redis.get(k) for k in keys}


async def test_each_stored_group_holds_its_bytes_once_until_its_step_is_committed(make_store) -> None:
    store = await make_store()
    await store.enqueue(prompts(("a", 0), ("b", 0)))
    epoch = await start_run(store, "w")
    la, lb = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(la.lease_id, scored("a", 0))
    assert (await store.submit(la.lease_id, scored("a", 0))).duplicate  # a retried submit
    await store.submit(lb.lease_id, scored("b", 0))
    held = await _payload_keys(store)
    assert sorted(held.values()) == [b"scored:a", b"scored:b"]
    assert [await store.redis.pttl(k) for k in held] == [-1, -1]  # kept: no expiry once stored
    traj = [f for _, f in await store.redis.xrange(store.keys.traj)]
    assert all(b"data" not in f and f[b"pk"].decode() in held for f in traj)  # the stream holds the header only
    assert await read(store, await store.sample(0, 2, 0)) == [b"scored:a", b"scored:b"]
    assert len(await _payload_keys(store)) == 2  # sampled, uncommitted: a resume would return them
    await store.commit_step(0, epoch)
    assert await _payload_keys(store) == {}
    await assert_accounting(store)


async def test_refused_requeued_and_validation_payloads_are_freed_dead_letters_keep_theirs(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(("v", 0), validation=True))
    await store.enqueue(prompts(("old", 0), ("new", 0)))
    epoch = await start_run(store, "w")
    lv, lo, ln = (await store.lease("w", 0, epoch, 3)).leases
    await store.submit(lv.lease_id, scored("v", 0, validation=True))
    assert await read(store, await store.sample(0, 1, 0, validation=True)) == [b"scored:v"]
    await store.submit(lo.lease_id, scored("old", 0))
    await store.publish_version(3, epoch, 3)
    assert (await store.submit(ln.lease_id, scored("new", 0, 3))).dead_lettered  # stale_on_submit
    assert await read(store, await store.sample(3, 1, 0)) == []  # "old" is too old: dead-lettered
    assert sorted(await _payload_keys(store)) == sorted(r["pk"].decode() for r in await store.dead_letters())
    assert sorted(r["data"] for r in await store.dead_letters()) == [b"scored:new", b"scored:old"]
    await assert_accounting(store)


async def test_a_resume_that_requeues_a_group_frees_its_scored_bytes(make_store) -> None:
    store = await make_store(max_age=2)
    await store.enqueue(prompts(("a", 0)))
    epoch = await start_run(store, "w")
    (la,) = (await store.lease("w", 0, epoch, 1)).leases
    await store.publish_version(2, epoch, 2)
    await store.submit(la.lease_id, scored("a", 0, 2))
    assert (await store.begin_run(1, 1)).requeued_groups == 1
    assert await _payload_keys(store) == {}
    await assert_accounting(store)
