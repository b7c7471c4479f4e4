"""Random operation sequences against a real Redis (hypothesis stateful testing): whatever trainers and workers do,
no lease is granted and no group sampled beyond the age bound, no group trains twice, and the accounting holds."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from rb_store_helpers import read
from redis.asyncio import Redis

from services.replay_buffer import rules
from services.replay_buffer.embedded import EmbeddedRedis
from services.replay_buffer.models import PromptIn, ScoredIn, StoreSettings, WorkerRecord
from services.replay_buffer.store import ReplayStore

_machines = itertools.count()
MAX_AGE = 1


class BufferMachine(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = Redis.from_url(self.url)
        prefix = f"prop{next(_machines)}"
        self.store = ReplayStore(self.redis, StoreSettings(prefix=prefix, max_age=MAX_AGE, lease_timeout_ms=20))
        self.run(self.store.init())
        self.epoch = self.run(self.store.begin_run(0, 0)).epoch
        for w in ("w1", "w2"):
            self.run(self.store.workers.put(WorkerRecord(w, f"{w}:1", 0, self.epoch)))
        self.step = self.floor = self.last_target = 0
        self.resume_version = 0
        self.next_id = 0
        self.targets: dict[str, int] = {}
        self.leases: list[tuple[str, str, int]] = []  # (lease_id, group id, version of the worker)
        self.trained: dict[str, int] = {}  # group id -> step it was sampled for, until a resume returns it

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    @rule(n=st.integers(1, 4), ahead=st.integers(0, 3))
    def enqueue(self, n: int, ahead: int) -> None:
        # The trainer enqueues in target-step order.
        self.last_target = max(self.last_target, self.step + ahead)
        groups = []
        for _ in range(n):
            gid = f"g{self.next_id}"
            self.next_id += 1
            self.targets[gid] = self.last_target
            groups.append(PromptIn(gid, self.last_target, gid.encode()))
        assert self.run(self.store.enqueue(groups)) == (n, 0)

    @rule(worker=st.sampled_from(["w1", "w2"]), behind=st.integers(0, 3), n=st.integers(1, 3))
    def lease(self, worker: str, behind: int, n: int) -> None:
        version = max(0, self.step - behind)
        res = self.run(self.store.lease(worker, version, self.epoch, n))
        for x in res.leases:
            target = self.targets[x.group_id]
            assert rules.lease_eligible(target, self.floor, self.step, version, MAX_AGE), (x, version, self.step)
            self.leases.append((x.lease_id, x.group_id, version))

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100), drift=st.integers(0, 1))
    def submit(self, pick: int, drift: int) -> None:
        lease_id, gid, version = self.leases.pop(pick % len(self.leases))
        max_version = min(version + drift, self.step)  # an in-flight update may move later tokens forward
        payload = f"{gid}|{version}".encode()
        self.run(self.store.submit(lease_id, ScoredIn(gid, self.targets[gid], version, max_version, payload)))

    @precondition(lambda self: self.leases)
    @rule(pick=st.integers(0, 100), dead=st.booleans())
    def release(self, pick: int, dead: bool) -> None:
        lease_id, _, _ = self.leases.pop(pick % len(self.leases))
        try:
            self.run(self.store.release(lease_id, dead_letter=dead))
        except Exception as exc:  # reclaimed meanwhile (and perhaps leased again): no longer this lease's
            assert type(exc).__name__ == "NotFound"

    @rule()
    def workers_die(self) -> None:
        """Every outstanding lease expires: its holder crashed (or is just slow and submits later)."""
        self.run(asyncio.sleep(0.03))
        self.run(self.store.reclaim_expired())

    @rule(n=st.integers(1, 4), min_groups=st.integers(0, 2))
    def sample(self, n: int, min_groups: int) -> None:
        res = self.run(self.store.sample(self.step, n, 0, min(min_groups, n)))
        for payload in self.run(read(self.store, res)):
            gid, version = payload.decode().split("|")
            assert rules.within_age(self.step, int(version), MAX_AGE), (gid, version, self.step)
            assert gid not in self.trained, f"{gid} trained twice (steps {self.trained[gid]} and {self.step})"
            self.trained[gid] = self.step

    @rule()
    def optimizer_step(self) -> None:
        self.step += 1
        self.run(self.store.publish_version(self.step, self.epoch, self.step))

    @rule(back=st.integers(0, 2))
    def trainer_crash_and_resume(self, back: int) -> None:
        resume = max(self.floor, self.step - back)
        self.epoch = self.run(self.store.begin_run(resume, resume)).epoch
        self.step = self.floor = self.resume_version = resume
        # Groups sampled for steps >= resume were never checkpointed: they may (and must) train again.
        self.trained = {g: s for g, s in self.trained.items() if s < resume}

    @invariant()
    def accounting_holds(self) -> None:
        acc = self.run(self.store.accounting())
        assert acc.ok, acc.violations
        assert acc.enqueued == self.next_id == acc.by_state["sampled"] + acc.pending + acc.by_state["dead"]


def test_random_operations_keep_every_invariant(redis_server: EmbeddedRedis) -> None:
    BufferMachine.url = redis_server.url
    run_state_machine_as_test(
        BufferMachine,
        settings=settings(
            max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
