"""The `grpofleet.v1.ReplayBuffer` servicer: validates requests and converts protobuf to the store's plain types.
Scored groups do not pass through: a submit names the payload key its worker wrote (checked to be that group's,
fleet/contracts/buffer.py), a sample answers with headers and payload keys. Only an inline submit carries bytes,
checked against its header at the payload's top level (fleet/contracts/scored_group.py).

Proto messages stop here; the rules live in store.py / rules.py. Errors are domain errors (services.runtime), which
the runtime's interceptor maps to status codes.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import message_factory
from grpc import aio

from fleet.contracts import scored_group
from fleet.contracts.buffer import check_payload_key
from grpofleet.v1 import replay_buffer_pb2 as pb
from services.replay_buffer.models import PromptIn, ScoredIn, StoreStats, SubmitResult, WorkerRecord
from services.replay_buffer.store import ReplayStore
from services.runtime.errors import InvalidArgument

SERVICE_NAME = "grpofleet.v1.ReplayBuffer"
_MAX_ID_LEN = 256


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidArgument(message)


def _check_id(value: str, name: str) -> None:
    _require(bool(value), f"{name} must not be empty")
    _require(len(value) <= _MAX_ID_LEN, f"{name} is longer than {_MAX_ID_LEN} characters")


def _check_worker_id(value: str, name: str) -> None:
    _check_id(value, name)
    _require("~" not in value, f"{name} must not contain '~' (reserved for the buffer's own consumers)")


def _check_non_negative(value: int, name: str) -> None:
    _require(value >= 0, f"{name} must be >= 0, got {value}")


def _check_header(h: pb.ScoredGroupHeader, where: str = "header") -> None:
    _check_id(h.group_id, f"{where}.group_id")
    _check_non_negative(h.target_step, f"{where}.target_step")
    _check_non_negative(h.min_version, f"{where}.min_version")
    _require(h.max_version >= h.min_version, f"{where}.max_version must be >= {where}.min_version")


def _check_inline(h: pb.ScoredGroupHeader, payload: bytes) -> None:
    """An inline payload is checked against its header at its top level only (fleet/contracts/scored_group.py), so
    the trajectories are never decoded here."""
    try:
        scored_group.check_payload(h, payload)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _by_key(h: pb.ScoredGroupHeader, key: str, prefix: str, where: str = "") -> ScoredIn:
    """A submit that names its payload key: the key must be one of this group's (a client never names another
    key the buffer keeps), and the header says how many bytes it holds (the submit script checks)."""
    try:
        check_payload_key(prefix, h.group_id, key)
    except ValueError as exc:
        raise InvalidArgument(f"{where}{exc}") from None
    _require(h.payload_bytes > 0, f"{where}header.payload_bytes must be > 0 with a payload_key")
    return ScoredIn(h.group_id, h.target_step, h.min_version, h.max_version, b"", h.validation, key, h.payload_bytes)


def _worker_record(w: pb.WorkerInfo) -> WorkerRecord:
    _check_worker_id(w.worker_id, "worker.worker_id")
    _check_id(w.address, "worker.address")
    # -1 = the worker holds no weights of any run yet (it has just started: join handshake pending).
    _require(w.weight_version >= -1, f"worker.weight_version must be >= -1, got {w.weight_version}")
    _require(w.weight_epoch >= -1, f"worker.weight_epoch must be >= -1, got {w.weight_epoch}")
    return WorkerRecord(
        w.worker_id, w.address, w.weight_version, w.weight_epoch, 0, w.state or "starting", w.groups_in_flight
    )


def _worker_info(r: WorkerRecord) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        worker_id=r.worker_id,
        address=r.address,
        weight_version=r.weight_version,
        weight_epoch=r.weight_epoch,
        last_heartbeat_ms=r.last_heartbeat_ms,
        state=r.state,
        groups_in_flight=r.groups_in_flight,
    )


class ReplayBufferServicer:
    def __init__(self, store: ReplayStore) -> None:
        self.store = store

    async def EnqueuePrompts(self, request: pb.EnqueuePromptsRequest, context: Any) -> pb.EnqueuePromptsResponse:
        now = int(time.time() * 1000)
        groups = []
        for i, g in enumerate(request.groups):
            _check_id(g.group_id, f"groups[{i}].group_id")
            _check_non_negative(g.target_step, f"groups[{i}].target_step")
            _require(g.num_generations >= 1, f"groups[{i}].num_generations must be >= 1")
            if not g.enqueued_at_ms:
                g.enqueued_at_ms = now
            groups.append(PromptIn(g.group_id, g.target_step, g.SerializeToString(), g.validation))
        if not groups:
            return pb.EnqueuePromptsResponse()
        added, dup = await self.store.enqueue(groups)
        return pb.EnqueuePromptsResponse(enqueued=added, duplicates=dup)

    async def LeasePrompts(self, request: pb.LeasePromptsRequest, context: Any) -> pb.LeasePromptsResponse:
        _check_worker_id(request.worker_id, "worker_id")
        _check_non_negative(request.weight_version, "weight_version")
        _check_non_negative(request.weight_epoch, "weight_epoch")
        _require(request.max_groups >= 1, f"max_groups must be >= 1, got {request.max_groups}")
        r = request
        res = await self.store.lease(r.worker_id, r.weight_version, r.weight_epoch, r.max_groups)
        leases = [
            pb.Lease(lease_id=x.lease_id, group=scored_group.prompt_of(x.kind, x.payload),
                     delivery_count=x.delivery_count)
            for x in res.leases
        ]
        return pb.LeasePromptsResponse(leases=leases, retry_after_ms=res.retry_after_ms, reason=res.reason)

    async def SubmitGroup(self, request: pb.SubmitGroupRequest, context: Any) -> pb.SubmitGroupResponse:
        _check_worker_id(request.worker_id, "worker_id")
        _check_id(request.lease_id, "lease_id")
        which = request.WhichOneof("payload")
        _require(request.HasField("header") and which is not None,
                 "header must be set, and payload_key or scored_group must be set")
        h = request.header
        _check_header(h)
        if which == "scored_group":
            _check_inline(h, request.scored_group)
            scored = ScoredIn(h.group_id, h.target_step, h.min_version, h.max_version, request.scored_group,
                              h.validation)
        else:
            scored = _by_key(h, request.payload_key, self.store.settings.prefix)
        return _submit_response(await self.store.submit(request.lease_id, scored))

    async def SubmitGroups(self, request: pb.SubmitGroupsRequest, context: Any) -> pb.SubmitGroupsResponse:
        _check_worker_id(request.worker_id, "worker_id")
        items: list[tuple[str, ScoredIn]] = []
        for i, g in enumerate(request.groups):  # every header checked before any group is applied
            _check_id(g.lease_id, f"groups[{i}].lease_id")
            _require(g.HasField("header"), f"groups[{i}].header must be set")
            _check_header(g.header, f"groups[{i}].header")
            items.append((g.lease_id, _by_key(g.header, g.payload_key, self.store.settings.prefix, f"groups[{i}]: ")))
        results = await self.store.submit_many(items) if items else []
        for i, r in enumerate(results):
            if isinstance(r, Exception):  # the others were applied: a retry of this call answers them duplicate
                raise type(r)(f"groups[{i}] (group {items[i][1].group_id}): {r}")
        return pb.SubmitGroupsResponse(results=[_submit_response(r) for r in results if isinstance(r, SubmitResult)])

    async def ReleaseLease(self, request: pb.ReleaseLeaseRequest, context: Any) -> pb.ReleaseLeaseResponse:
        _check_worker_id(request.worker_id, "worker_id")
        _check_id(request.lease_id, "lease_id")
        _require(len(request.reason) <= 1024, "reason is longer than 1024 characters")
        await self.store.release(request.lease_id, dead_letter=request.dead_letter, detail=request.reason)
        return pb.ReleaseLeaseResponse()

    async def Sample(self, request: pb.SampleRequest, context: Any) -> pb.SampleResponse:
        _check_non_negative(request.step, "step")
        _require(request.num_groups >= 1, f"num_groups must be >= 1, got {request.num_groups}")
        _check_non_negative(request.deadline_ms, "deadline_ms")
        _require(0 <= request.min_groups <= request.num_groups, "min_groups must be between 0 and num_groups")
        deadline_s = request.deadline_ms / 1000
        remaining = context.time_remaining() if context is not None else None
        if remaining is not None:  # answer before the caller gives up, or the groups taken would be lost in transit
            deadline_s = max(0.0, min(deadline_s, remaining - 0.5))
        _require(len(request.request_id) <= _MAX_ID_LEN, f"request_id is longer than {_MAX_ID_LEN} characters")
        r = request
        res = await self.store.sample(r.step, r.num_groups, deadline_s, r.min_groups, r.validation, r.request_id)
        starvation = None
        if res.starvation is not None:
            s = res.starvation
            starvation = pb.Starvation(
                reason=s.reason, prompts_pending=s.prompts_pending, leases_outstanding=s.leases_outstanding,
                live_workers=s.live_workers, evicted_now=s.evicted_now, waited_s=s.waited_s,
            )  # fmt: skip
        groups = [
            pb.SampledGroup(group_id=g.group_id, target_step=g.target_step, min_version=g.min_version,
                            max_version=g.max_version, validation=g.validation, payload_bytes=g.size,
                            payload_key=g.payload_key)
            for g in res.groups
        ]
        return pb.SampleResponse(groups=groups, starvation=starvation)

    async def BeginRun(self, request: pb.BeginRunRequest, context: Any) -> pb.BeginRunResponse:
        _check_non_negative(request.resume_step, "resume_step")
        _check_non_negative(request.weight_version, "weight_version")
        info = await self.store.begin_run(request.resume_step, request.weight_version)
        return pb.BeginRunResponse(
            epoch=info.epoch, returned_groups=info.returned_groups, retargeted_groups=info.retargeted_groups,
            committed_groups=info.committed_groups, requeued_groups=info.requeued_groups,
        )  # fmt: skip

    async def CommitStep(self, request: pb.CommitStepRequest, context: Any) -> pb.CommitStepResponse:
        _check_non_negative(request.step, "step")
        n = await self.store.commit_step(request.step, request.epoch)
        return pb.CommitStepResponse(committed_groups=n)

    async def PublishVersion(self, request: pb.PublishVersionRequest, context: Any) -> pb.PublishVersionResponse:
        _check_non_negative(request.version, "version")
        _check_non_negative(request.step, "step")
        await self.store.publish_version(request.version, request.epoch, request.step)
        return pb.PublishVersionResponse()

    async def RegisterWorker(self, request: pb.RegisterWorkerRequest, context: Any) -> pb.RegisterWorkerResponse:
        await self.store.workers.put(_worker_record(request.worker))
        run = await self.store.run_state()
        return pb.RegisterWorkerResponse(
            heartbeat_interval_ms=self.store.settings.heartbeat_interval_ms,
            epoch=run["epoch"],
            current_version=run["version"],
        )

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        await self.store.workers.put(_worker_record(request.worker), must_exist=True)
        await self.store.renew_leases(request.worker.worker_id)  # leases last while their worker heartbeats
        run = await self.store.run_state()
        return pb.HeartbeatResponse(epoch=run["epoch"], current_version=run["version"])

    async def ListWorkers(self, request: pb.ListWorkersRequest, context: Any) -> pb.ListWorkersResponse:
        workers = await self.store.workers.list(include_dead=request.include_dead)
        return pb.ListWorkersResponse(workers=[_worker_info(w) for w in workers])

    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        return stats_message(await self.store.stats(), self.store.settings.max_age)


def _submit_response(r: SubmitResult) -> pb.SubmitGroupResponse:
    return pb.SubmitGroupResponse(duplicate=r.duplicate, dead_lettered=r.dead_lettered, requeued=r.requeued)


def stats_message(s: StoreStats, max_age: int) -> pb.StatsResponse:
    c = s.counters
    return pb.StatsResponse(
        **{n: c.get(n, 0) for n in ("enqueued", "duplicates", "leased", "reclaimed", "submitted", "sampled")},
        dead_lettered=c.get("dead_lettered", 0),
        dead_lettered_by_reason=s.dead_by_reason,
        prompts_pending=s.prompts_pending,
        leases_outstanding=s.leases_outstanding,
        groups_ready=s.groups_ready,
        age_histogram=s.age_histogram,
        epoch=s.epoch,
        current_version=s.current_version,
        current_step=s.current_step,
        live_workers=s.live_workers,
        returned_on_resume=c.get("returned_on_resume", 0),
        released=c.get("released", 0),
        requeued=c.get("requeued", 0),
        validation_ready=s.validation_ready,
        uncommitted_groups=s.uncommitted,
        committed_step=s.committed_step,
        min_target_step=s.min_target_step,
        max_age=max_age,
    )


def add_to_server(servicer: ReplayBufferServicer, server: aio.Server) -> None:
    """Register every RPC of the service descriptor (a method missing from the servicer fails here, at start-up)."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["ReplayBuffer"].methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name), request_deserializer=request_cls.FromString,
            response_serializer=response_cls.SerializeToString,
        )  # fmt: skip
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
