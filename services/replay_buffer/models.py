"""Plain data of the replay buffer: settings, Redis key names, and what the store takes and returns.

Payloads (`PromptGroup` / `ScoredGroup` protobuf bytes) travel opaquely; the fields the logic needs (group id,
target step, versions, validation flag) travel beside them, so the store never imports generated protobuf code and
never decodes a payload. A scored group's bytes do not pass through the store at all on the fleet's path: the
worker writes them to a payload key, the store's scripts keep or delete that key, and the trainer reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.config.schema import MasterConfig
from fleet.contracts.buffer import Starvation, WorkerInfo

# Stream consumer group of the prompt queue, and the pseudo-consumer that holds reclaimed and released leases until a
# worker takes them (its name cannot collide with a worker id: `~` is refused in worker ids).
WORKERS_GROUP = "workers"
POOL_CONSUMER = "~pool"


@dataclass(frozen=True)
class StoreSettings:
    prefix: str = "gf"
    max_age: int = 1
    lease_timeout_ms: int = 600_000
    max_deliveries: int = 5
    heartbeat_interval_ms: int = 2_000
    worker_timeout_ms: int = 15_000
    retry_after_ms: int = 200
    # Largest Sample answer: the service's max message size, less room for the envelope.
    max_response_bytes: int = 64 * 1024 * 1024 - 64 * 1024

    @classmethod
    def from_config(cls, cfg: MasterConfig) -> StoreSettings:
        rb, a = cfg.replay_buffer, cfg.grpo.async_grpo
        return cls(
            prefix=cfg.redis.key_prefix,
            max_age=a.age_bound,
            lease_timeout_ms=int(rb.lease_timeout_s * 1000),
            max_deliveries=rb.max_deliveries,
            heartbeat_interval_ms=int(rb.heartbeat_interval_s * 1000),
            worker_timeout_ms=int(rb.worker_timeout_s * 1000),
            retry_after_ms=rb.retry_after_ms,
            max_response_bytes=cfg.services.max_message_mb * 1024 * 1024 - 64 * 1024,
        )


@dataclass(frozen=True)
class Keys:
    """Every key the buffer owns. The `{prefix}` hash tag puts them all in one Redis Cluster slot, which multi-key
    Lua scripts require."""

    prefix: str

    def _k(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

    @property
    def all(self) -> list[str]:
        """In the order every Lua script receives them as KEYS (see scripts.PRELUDE)."""
        names = ["prompts", "status", "traj", "ready", "ready_val", "trained", "dead", "counters", "age_hist", "run"]
        return [self._k(n) for n in names]

    @property
    def prompts(self) -> str:
        return self._k("prompts")

    @property
    def status(self) -> str:
        return self._k("status")

    @property
    def traj(self) -> str:
        return self._k("traj")

    @property
    def ready(self) -> str:
        return self._k("ready")

    @property
    def ready_val(self) -> str:
        return self._k("ready_val")

    @property
    def trained(self) -> str:
        return self._k("trained")

    @property
    def dead(self) -> str:
        return self._k("dead")

    @property
    def counters(self) -> str:
        return self._k("counters")

    @property
    def age_hist(self) -> str:
        return self._k("age_hist")

    @property
    def run(self) -> str:
        return self._k("run")

    @property
    def workers(self) -> str:
        return self._k("workers")

    def payload(self, name: str) -> str:
        """The bytes of one submitted ScoredGroup, `name` = GROUP_ID:NONCE (fleet.contracts.buffer.payload_key: one key
        per write, so a retry never overwrites them)."""
        return self._k(f"payload:{name}")


@dataclass(frozen=True)
class PromptIn:
    group_id: str
    target_step: int
    payload: bytes
    validation: bool = False


@dataclass(frozen=True)
class LeasedGroup:
    lease_id: str
    group_id: str
    # "prompt": PromptGroup bytes (also for a group a resume re-queued); "scored": ScoredGroup bytes whose `prompt`
    # is the group, in entries re-queued by a buffer older than issue 20.
    kind: str
    payload: bytes
    delivery_count: int


@dataclass(frozen=True)
class LeaseResult:
    leases: list[LeasedGroup]
    reason: str = ""  # "" | "queue_empty" | "age_bound"
    retry_after_ms: int = 0


@dataclass(frozen=True)
class ScoredIn:
    """A submitted group's header, and either the key its writer put its bytes under (`payload_key`, `size` bytes)
    or the bytes themselves (`payload`: an inline submit, which the store writes to a key of its own)."""

    group_id: str
    target_step: int
    min_version: int
    max_version: int
    payload: bytes = b""
    validation: bool = False
    payload_key: str = ""
    size: int = 0


@dataclass(frozen=True)
class SubmitResult:
    duplicate: bool = False
    dead_lettered: bool = False
    requeued: bool = False


@dataclass(frozen=True)
class SampledRef:
    """A sampled group's header and the key of its bytes (read by the trainer, not the store)."""

    group_id: str
    target_step: int
    min_version: int
    max_version: int
    validation: bool
    size: int
    payload_key: str


@dataclass(frozen=True)
class SampleResult:
    groups: list[SampledRef]
    starvation: Starvation | None = None

    @property
    def payload_keys(self) -> list[str]:
        return [g.payload_key for g in self.groups]


@dataclass(frozen=True)
class RunInfo:
    epoch: int
    returned_groups: int = 0
    retargeted_groups: int = 0
    committed_groups: int = 0
    requeued_groups: int = 0


WorkerRecord = WorkerInfo  # the registry's record is the contract's type (one definition, fleet/contracts/buffer.py)


@dataclass
class StoreStats:
    counters: dict[str, int]
    dead_by_reason: dict[str, int]
    age_histogram: dict[int, int]
    prompts_pending: int
    leases_outstanding: int
    groups_ready: int
    validation_ready: int
    uncommitted: int
    epoch: int
    current_version: int
    current_step: int
    min_target_step: int
    committed_step: int
    live_workers: int


@dataclass
class Accounting:
    """Group counts by state (from the status hash) beside the sizes of the structures that hold them."""

    by_state: dict[str, int]
    structures: dict[str, int]
    violations: list[str] = field(default_factory=list)

    @property
    def enqueued(self) -> int:
        return sum(self.by_state.values())

    @property
    def pending(self) -> int:
        return self.by_state["enqueued"] + self.by_state["leased"] + self.by_state["scored"]

    @property
    def ok(self) -> bool:
        return not self.violations
