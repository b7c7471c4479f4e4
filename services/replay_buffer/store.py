"""`ReplayStore`: every Redis operation of the replay buffer. Works on bytes and plain dataclasses; the servicer
(servicer.py) converts protobuf at the edge.

Wiring: the store owns a redis-py asyncio client (from server.py) and a `WorkerRegistry`. Each state transition of a
group is one Lua script (scripts.py), so the store keeps no state of its own that a restart could lose, and needs no
in-process lock: Redis runs scripts one at a time, which serializes leases even across buffer instances.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from fleet.contracts.buffer import Starvation, payload_key
from services.replay_buffer import rules, scripts
from services.replay_buffer.models import (
    POOL_CONSUMER,
    WORKERS_GROUP,
    Accounting,
    Keys,
    LeasedGroup,
    LeaseResult,
    PromptIn,
    RunInfo,
    SampledRef,
    SampleResult,
    ScoredIn,
    StoreSettings,
    StoreStats,
    SubmitResult,
)
from services.replay_buffer.workers import WorkerRegistry, now_ms
from services.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

log = logging.getLogger(__name__)

# How many reclaimed/released entries one lease call inspects for eligibility.
_POOL_WINDOW = 256
_RECLAIM_PAGE = 256
# A Sample waiting for groups wakes on every local submit; this bounds the wait for changes made elsewhere.
_SAMPLE_POLL_S = 0.5
# An inline payload is written before the submit script decides its fate (kept, or deleted); the expiry frees it
# should this process die in between (a worker's own writes use fleet.contracts.buffer.payload_ttl_ms).
_PAYLOAD_TTL_MS = 600_000

_SCRIPTS = (
    *("enqueue", "lease", "reclaim", "renew", "release", "submit"),
    *("sample", "begin_run", "commit", "publish", "accounting"),
)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _ints(mapping: dict[Any, Any]) -> dict[str, int]:
    return {_s(k): int(v) for k, v in mapping.items()}


class ReplayStore:
    def __init__(self, redis: Redis, settings: StoreSettings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.workers = WorkerRegistry(redis, self.keys.workers, settings.worker_timeout_ms)
        self._scripts = {n: redis.register_script(scripts.PRELUDE + getattr(scripts, n.upper())) for n in _SCRIPTS}
        # Groups stored by this process (submits, and groups a resume returned), and an event set on each.
        self._arrivals = 0
        self._arrived = asyncio.Event()

    async def init(self) -> None:
        """Create the prompt stream's consumer group (idempotent). Everything else is created on first write."""
        try:
            await self.redis.xgroup_create(self.keys.prompts, WORKERS_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _run(self, name: str, *args: Any) -> Any:
        try:
            return await self._scripts[name](keys=self.keys.all, args=list(args))
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream was deleted behind our back (FLUSHALL, a Redis without persistence restarted): recreate the
            # group so the service keeps working; the accounting check reports what was lost.
            log.error("prompt stream consumer group missing; recreating it: %s", exc)
            await self.init()
            return await self._scripts[name](keys=self.keys.all, args=list(args))

    def _notify(self, groups: int = 1) -> None:
        """Wake Sample calls waiting for groups."""
        self._arrivals += groups
        self._arrived.set()
        self._arrived = asyncio.Event()

    # -- prompt queue --------------------------------------------------------------------------------------------

    async def enqueue(self, groups: list[PromptIn]) -> tuple[int, int]:
        """Returns (added, duplicates). A group id already known in any state is a duplicate."""
        args: list[Any] = [now_ms()]
        for g in groups:
            args += [g.group_id, g.target_step, int(g.validation), g.payload]
        added, dup = await self._run("enqueue", *args)
        return int(added), int(dup)

    async def lease(self, worker_id: str, version: int, epoch: int, max_groups: int) -> LeaseResult:
        """Lease up to `max_groups` groups the worker can finish in time (join handshake checked first)."""
        if await self.workers.get(worker_id) is None:
            raise FailedPrecondition(f"worker {worker_id!r} is not registered: call RegisterWorker before LeasePrompts")
        state = await self.run_state()
        if state["epoch"] == 0:
            raise FailedPrecondition("no run has started: the trainer calls BeginRun before workers can lease")
        if epoch != state["epoch"]:
            raise FailedPrecondition(
                f"worker {worker_id!r} holds weights of run epoch {epoch}, the run is at epoch {state['epoch']}: "
                "it must receive this epoch's weights before leasing (join handshake)"
            )
        reason, rows = await self._run(
            "lease", WORKERS_GROUP, worker_id, POOL_CONSUMER, max_groups, version, self.settings.max_age, _POOL_WINDOW
        )
        leases = [
            LeasedGroup(rules.format_lease_id(_s(eid), epoch), _s(gid), _s(kind), bytes(data), int(count))
            for eid, gid, kind, data, count in rows
        ]
        if leases:
            return LeaseResult(leases)
        return LeaseResult([], _s(reason), self.settings.retry_after_ms)

    async def reclaim_expired(self) -> tuple[int, int]:
        """Leases idle longer than the lease timeout go back to the pool, or to the dead-letter stream once a group
        has been delivered max_deliveries times. Returns (reclaimed, dead_lettered)."""
        s = self.settings
        reclaimed, dead = await self._run(
            "reclaim", WORKERS_GROUP, POOL_CONSUMER, s.lease_timeout_ms, s.max_deliveries, now_ms(), _RECLAIM_PAGE
        )
        if reclaimed or dead:
            log.info("reclaimed %d expired leases, dead-lettered %d groups (max_deliveries)", reclaimed, dead)
        return int(reclaimed), int(dead)

    async def renew_leases(self, worker_id: str) -> int:
        """Renew every lease `worker_id` holds (its heartbeat does): a live worker's leases never expire, a dead one's
        expire `lease_timeout_ms` after its last heartbeat. Returns how many it holds."""
        return int(await self._run("renew", WORKERS_GROUP, worker_id, _RECLAIM_PAGE))

    async def release(self, lease_id: str, *, dead_letter: bool, detail: str = "") -> str:
        """Give a lease back: "released" (leased again next), or "dead" (dead-lettered, also when the group has
        reached max_deliveries)."""
        entry_id, _ = self._lease(lease_id)
        out = _s(
            await self._run(
                "release", WORKERS_GROUP, POOL_CONSUMER, entry_id, int(dead_letter), detail, now_ms(),
                self.settings.max_deliveries,
            )
        )  # fmt: skip
        if out == "not_found":
            raise NotFound(f"lease {lease_id!r} is not outstanding (never granted, already submitted or released)")
        return out

    async def submit(self, lease_id: str, group: ScoredIn) -> SubmitResult:
        """Submit one group (its payload key written by the caller, or its bytes inline); raises its refusal."""
        (out,) = await self.submit_many([(lease_id, group)])
        if isinstance(out, Exception):
            raise out
        return out

    async def submit_many(self, items: list[tuple[str, ScoredIn]]) -> list[SubmitResult | Exception]:
        """Submit several groups in one script call (one Redis round trip), each judged alone: a refusal is returned
        in its place (NotFound / InvalidArgument / FailedPrecondition), the others are applied."""
        parsed = [self._lease(lease_id) for lease_id, _ in items]
        keys = await self._payload_keys([g for _, g in items])
        args: list[Any] = [WORKERS_GROUP, POOL_CONSUMER, self.settings.max_age, now_ms()]
        for (entry_id, lease_epoch), (_, g), key in zip(parsed, items, keys, strict=True):
            args += [entry_id, lease_epoch, g.group_id, g.target_step, g.min_version, g.max_version,
                     int(g.validation), key, g.size or len(g.payload)]
        flat = await self._run("submit", *args)
        outcomes = [(_s(flat[i]), _s(flat[i + 1])) for i in range(0, len(flat), 2)]
        stored = sum(outcome == "ok" for outcome, _ in outcomes)
        if stored:
            self._notify(stored)
        return [self._submit_outcome(lease_id, g, *o) for (lease_id, g), o in zip(items, outcomes, strict=True)]

    async def _payload_keys(self, groups: list[ScoredIn]) -> list[str]:
        """The payload key of each group. An inline submit's bytes go to Redis here, once, as a plain string under a
        key of the store's own (no Lua copy), with an expiry; the submit script then keeps or deletes the key."""
        keys = [payload_key(self.settings.prefix, g.group_id) if g.payload else g.payload_key for g in groups]
        inline = [(k, g.payload) for k, g in zip(keys, groups, strict=True) if g.payload]
        if inline:
            pipe = self.redis.pipeline(transaction=False)
            for k, data in inline:
                pipe.set(k, data, px=_PAYLOAD_TTL_MS)
            await pipe.execute()
        return keys

    @staticmethod
    def _submit_outcome(lease_id: str, g: ScoredIn, outcome: str, detail: str) -> SubmitResult | Exception:
        if outcome == "unknown_group":
            return NotFound(f"group {g.group_id!r} was never enqueued")
        if outcome == "unknown_lease":
            return NotFound(f"lease {lease_id!r} was never granted for group {g.group_id!r}")
        if outcome == "mismatch":
            return InvalidArgument(f"lease {lease_id!r} is for group {detail!r}, not {g.group_id!r}")
        if outcome == "payload_missing":
            return FailedPrecondition(f"payload key {g.payload_key!r} of group {g.group_id!r} holds nothing (never "
                                      "written, or expired before this submit): write it again and resubmit")
        if outcome == "payload_size":
            return InvalidArgument(f"payload key {g.payload_key!r} holds {detail} bytes, header.payload_bytes says "
                                   f"{g.size}")
        if outcome == "dead":
            log.info("group %s dead-lettered on submit (stale_on_submit, min_version %d)", g.group_id, g.min_version)
        return SubmitResult(
            duplicate=outcome == "duplicate", dead_lettered=outcome == "dead", requeued=outcome == "requeued"
        )

    @staticmethod
    def _lease(lease_id: str) -> tuple[str, int]:
        try:
            return rules.parse_lease_id(lease_id)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None

    # -- trajectory store ----------------------------------------------------------------------------------------

    async def sample(
        self,
        step: int,
        num_groups: int,
        deadline_s: float,
        min_groups: int = 0,
        validation: bool = False,
        request_id: str = "",
    ) -> SampleResult:
        """Up to `num_groups` whole groups for `step`, oldest weights first. Waits until `num_groups` are ready or the
        deadline passes, then takes what is there if that is at least max(min_groups, 1). A `request_id` seen before
        (for this step, not yet committed) returns the groups that call took."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        evicted, available, taken = 0, 0, list[SampledRef]()
        while True:
            seen = self._arrivals  # read before looking, so a submit landing meanwhile is counted
            left = start + deadline_s - loop.time()
            need = num_groups if left > 0 else max(min_groups, 1)
            out = await self._run(
                "sample", step, num_groups, self.settings.max_age, need, int(validation), now_ms(),
                self.settings.max_response_bytes, request_id,
            )  # fmt: skip
            evicted += int(out[0])
            available, taken = int(out[1]), [_ref(row) for row in out[2:]]
            if taken or left <= 0:
                break
            await self._wait_for_arrivals(seen + num_groups - available, start + deadline_s)
        if evicted:
            log.info("step %d: dead-lettered %d groups older than %d steps", step, evicted, self.settings.max_age)
        if len(taken) >= num_groups:
            return SampleResult(taken)
        starving = await self._starvation(evicted, loop.time() - start)
        if taken and available >= num_groups:  # enough were ready; the answer hit the message size limit
            starving = dataclasses.replace(starving, reason="max_message_size")
        return SampleResult(taken, starving)

    async def _wait_for_arrivals(self, target: int, deadline: float) -> None:
        """Sleep until this process has stored `target` groups in all (so that enough could be ready: looking earlier
        would cost a Redis round trip per submit), the deadline, or the poll interval for changes made elsewhere."""
        loop = asyncio.get_running_loop()
        until = min(deadline, loop.time() + _SAMPLE_POLL_S)
        while self._arrivals < target and (left := until - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=left)
            except TimeoutError:
                return

    async def _starvation(self, evicted: int, waited_s: float) -> Starvation:
        pending = await self.redis.xlen(self.keys.prompts)
        outstanding = await self._leases_outstanding()
        live = await self.workers.live_count()
        reason = rules.starvation_reason(
            prompts_pending=pending, leases_outstanding=outstanding, live_workers=live, evicted_now=evicted
        )
        return Starvation(reason, pending, outstanding, live, evicted, round(waited_s, 3))

    async def _leases_outstanding(self) -> int:
        summary = await self.redis.xpending(self.keys.prompts, WORKERS_GROUP)
        return _outstanding(summary)

    async def dead_letters(self, count: int = 100) -> list[dict[str, bytes]]:
        """The oldest `count` dead letters, each with its group's bytes under `data` (a scored group's are read from
        its payload key)."""
        entries: Any = await self.redis.xrange(self.keys.dead, count=count)
        rows: list[dict[str, bytes]] = [{_s(k): v for k, v in fields.items()} for _, fields in entries]
        refs = [r["pk"].decode() for r in rows if r.get("pk")]
        found: dict[str, Any] = dict(zip(refs, await self.redis.mget(refs), strict=True)) if refs else {}
        for r in rows:
            if r.get("pk"):
                r["data"] = found.get(r["pk"].decode()) or b""
        return rows

    # -- run lifecycle -------------------------------------------------------------------------------------------

    async def begin_run(self, resume_step: int, weight_version: int) -> RunInfo:
        epoch, returned, retargeted, committed, requeued = await self._run("begin_run", resume_step, weight_version)
        info = RunInfo(int(epoch), int(returned), int(retargeted), int(committed), int(requeued))
        log.info(
            "run epoch %d begins at step %d (weights v%d): %d groups returned, %d committed, %d re-queued, "
            "%d re-targeted",
            info.epoch, resume_step, weight_version, returned, committed, requeued, retargeted,
        )  # fmt: skip
        self._notify(max(1, info.returned_groups))
        return info

    async def commit_step(self, step: int, epoch: int) -> int:
        n = int(await self._run("commit", step, epoch))
        if n < 0:
            raise FailedPrecondition(f"CommitStep for epoch {epoch}, but the run is at epoch {await self._epoch()}")
        return n

    async def publish_version(self, version: int, epoch: int, step: int) -> None:
        current = int(await self._run("publish", version, epoch, step))
        if current != epoch:
            raise FailedPrecondition(f"PublishVersion for epoch {epoch}, but the run is at epoch {current}")

    async def run_state(self) -> dict[str, int]:
        raw = _ints(await self.redis.hgetall(self.keys.run))
        names = ("epoch", "version", "step", "floor", "resume_version", "committed_step")
        return {n: raw.get(n, 0) for n in names}

    async def _epoch(self) -> int:
        return (await self.run_state())["epoch"]

    # -- observability -------------------------------------------------------------------------------------------

    async def stats(self) -> StoreStats:
        k = self.keys
        pipe = self.redis.pipeline(transaction=True)  # one consistent snapshot
        for name in (k.counters, k.age_hist, k.run):
            pipe.hgetall(name)
        pipe.xlen(k.prompts)
        pipe.xpending(k.prompts, WORKERS_GROUP)
        pipe.zcard(k.ready)
        pipe.zcard(k.ready_val)
        pipe.xlen(k.trained)
        counters, ages, run, pending, summary, ready, ready_val, trained = await pipe.execute()
        c, r = _ints(counters), _ints(run)
        return StoreStats(
            counters=c,
            dead_by_reason={n[5:]: v for n, v in c.items() if n.startswith("dead:")},
            age_histogram={int(a): n for a, n in _ints(ages).items()},
            prompts_pending=int(pending),
            leases_outstanding=_outstanding(summary),
            groups_ready=int(ready),
            validation_ready=int(ready_val),
            uncommitted=int(trained),
            epoch=r.get("epoch", 0),
            current_version=r.get("version", 0),
            current_step=r.get("step", 0),
            min_target_step=r.get("floor", 0),
            committed_step=r.get("committed_step", 0),
            live_workers=await self.workers.live_count(),
        )

    async def accounting(self) -> Accounting:
        """Count groups by state and check the counts against the structures that hold them. The invariant
        enqueued = sampled + pending + dead_lettered holds by construction of the status hash; the structure checks
        are what catch a transition that updated one place and not the other."""
        flat = await self._run("accounting", WORKERS_GROUP, POOL_CONSUMER)
        values = {_s(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        st = {n[6:]: v for n, v in values.items() if n.startswith("state:")}
        sz = {n: v for n, v in values.items() if not n.startswith("state:")}
        checks = [
            (st["other"] == 0, f"{st['other']} groups in an unknown state"),
            (sz["prompts"] == st["enqueued"] + st["leased"], "prompt stream length != enqueued + leased"),
            (sz["pel"] - sz["pool"] == st["leased"], "leases held by workers != groups in state leased"),
            (sz["ready"] + sz["ready_val"] == st["scored"], "ready sets != groups in state scored"),
            (sz["traj"] == sz["ready"] + sz["ready_val"] + sz["trained"], "trajectory stream != ready + uncommitted"),
            (sz["trained"] <= st["sampled"], "more uncommitted trained entries than sampled groups"),
            (sz["c_dead"] == st["dead"] and sz["dead"] <= st["dead"], "dead-letter counter/stream != dead groups"),
            (sz["c_sampled"] == st["sampled"], "sampled counter != groups in state sampled"),
            (sz["c_enqueued"] == sum(st.values()), "enqueued counter != unique groups"),
        ]
        acc = Accounting(by_state=st, structures=sz)
        acc.violations = [f"{msg}: states={st} sizes={sz}" for ok, msg in checks if not ok]
        return acc


def _ref(row: list[Any]) -> SampledRef:
    pk, gid, target, minv, maxv, val, size = (_s(v) for v in row)
    return SampledRef(gid, int(target), int(minv), int(maxv), val == "1", int(size), pk)


def _outstanding(summary: Any) -> int:
    """Leases held by workers: the pending entries list minus what sits in the reclaim pool."""
    if not summary or not summary.get("pending"):
        return 0
    pool = sum(int(c["pending"]) for c in summary.get("consumers") or [] if _s(c["name"]) == POOL_CONSUMER)
    return int(summary["pending"]) - pool
