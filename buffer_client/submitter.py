"""`SubmitBatcher`: one rollout worker's scored groups go to the buffer several per call.

A worker generates up to `rollout.max_groups_in_flight` groups at once, and each finishes on its own. Every finished
group joins a queue; one task sends what the queue holds (up to `max_batch` groups) in one call, and while that call
is in flight the groups finishing meanwhile queue up for the next. A lone group goes at once (no waiting to fill a
batch), so batching costs no latency; under load it saves the per-call cost.

If a batch is refused as a whole (the buffer names one group of it), each of its groups is sent again alone, so that
one bad group fails only its own submit: the call is safe to repeat (a group already kept answers duplicate).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from grpc import aio

from fleet.contracts import scored_group
from fleet.contracts.buffer import SubmitOutcome
from grpofleet.v1 import common_pb2, replay_buffer_pb2

log = logging.getLogger(__name__)

MAX_BATCH = 32


@dataclass(frozen=True)
class Encoded:
    """A checked, serialized group with its header, for the lease that produced it."""

    lease_id: str
    header: replay_buffer_pb2.ScoredGroupHeader
    data: bytes


_Send = Callable[[str, list[Encoded]], Awaitable[list[SubmitOutcome]]]


@dataclass(eq=False)
class _Pending:
    worker_id: str
    group: Encoded
    done: asyncio.Future[SubmitOutcome]


class SubmitBatcher:
    def __init__(self, send: _Send, max_batch: int = MAX_BATCH) -> None:
        self._send = send
        self.max_batch = max_batch
        self._queue: list[_Pending] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, worker_id: str, lease_id: str, group: common_pb2.ScoredGroup) -> SubmitOutcome:
        header, data = scored_group.encode(group)  # a group that is not whole fails here, alone
        return await self.submit_encoded(worker_id, Encoded(lease_id, header, data))

    async def submit_encoded(self, worker_id: str, group: Encoded) -> SubmitOutcome:
        """`submit` of a group already checked and serialized (`scored_group.encode`)."""
        done: asyncio.Future[SubmitOutcome] = asyncio.get_running_loop().create_future()
        # Marks a failure as seen even when its caller was cancelled meanwhile (no "never retrieved" warning).
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queue.append(_Pending(worker_id, group, done))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="submit-groups")
        # Shielded: a caller cancelled meanwhile (a drain timing out) does not cancel a call carrying other groups.
        return await asyncio.shield(done)

    async def _drain(self) -> None:
        while self._queue:
            worker_id = self._queue[0].worker_id
            batch = [p for p in self._queue if p.worker_id == worker_id][: self.max_batch]
            taken = {id(p) for p in batch}
            self._queue = [p for p in self._queue if id(p) not in taken]
            await self._send_batch(worker_id, batch)

    async def _send_batch(self, worker_id: str, batch: list[_Pending]) -> None:
        try:
            outcomes = await self._send(worker_id, [p.group for p in batch])
        except aio.AioRpcError as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            log.info("a batch of %d submits was refused (%s); sending each alone", len(batch), exc.details())
            for p in batch:
                await self._send_batch(worker_id, [p])
            return
        except Exception as exc:  # e.g. ServiceDown: the buffer or Redis stayed down past the bound
            _fail(batch, exc)
            return
        if len(outcomes) != len(batch):
            _fail(batch, RuntimeError(f"SubmitGroups answered {len(outcomes)} results for {len(batch)} groups"))
            return
        for p, outcome in zip(batch, outcomes, strict=True):
            if not p.done.done():
                p.done.set_result(outcome)


def _fail(batch: list[_Pending], exc: BaseException) -> None:
    for p in batch:
        if not p.done.done():
            p.done.set_exception(exc)
