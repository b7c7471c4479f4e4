"""`MasterConfig`: the root of the config tree, and the rules that span sections."""

from pydantic import Field, model_validator

from fleet.config.algorithm import GrpoConfig, LossConfig
from fleet.config.base import Section
from fleet.config.env import DataConfig, EnvConfig
from fleet.config.infra import (
    CheckpointingConfig,
    ClusterConfig,
    LoggerConfig,
    RedisConfig,
    ReplayBufferConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
    ServicesConfig,
)
from fleet.config.policy import PolicyConfig
from fleet.config.vision import check_computer_use


class MasterConfig(Section):
    """Everything a run needs. Seed sections keep their names; ours are services, redis, replay_buffer, rollout,
    sandbox and run."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The model, its training and its generation."""
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    """The GRPO algorithm and its loops."""
    loss_fn: LossConfig = Field(default_factory=LossConfig)
    """The clipped policy-gradient loss."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """Environments that score answers."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Task sources."""
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoints."""
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    """Metrics and logs."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Topology."""
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    """gRPC/HTTP endpoints, auth and transport limits."""
    redis: RedisConfig = Field(default_factory=RedisConfig)
    """Where durable state lives."""
    replay_buffer: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    """Leases, heartbeats and metrics of the replay buffer."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The rollout fleet."""
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    """The sandbox executor."""
    run: RunConfig = Field(default_factory=RunConfig)
    """Run directory and name."""

    @model_validator(mode="after")
    def _async_constraints(self) -> "MasterConfig":
        a = self.grpo.async_grpo
        if a.enabled:
            if not self.loss_fn.use_importance_sampling_correction:
                raise ValueError(
                    "grpo.async_grpo.enabled=true requires loss_fn.use_importance_sampling_correction=true: "
                    "off-policy trajectories must be importance-weighted"
                )
            if a.max_trajectory_age_steps < 1:
                raise ValueError(
                    "grpo.async_grpo.max_trajectory_age_steps must be >= 1 when grpo.async_grpo.enabled=true "
                    "(0 would make the asynchronous loop synchronous)"
                )
        elif a.in_flight_weight_updates:
            raise ValueError(
                "grpo.async_grpo.in_flight_weight_updates=true requires grpo.async_grpo.enabled=true "
                "(the synchronous loop never generates while weights change)"
            )
        if self.policy.generation.colocated.enabled:
            raise ValueError(
                "policy.generation.colocated.enabled=true is not supported: grpo-fleet always generates in a "
                "separate rollout fleet; set it to false"
            )
        if a.enabled and not self.policy.generation.vllm_cfg.async_engine and self.policy.generation.backend == "vllm":
            raise ValueError(
                "grpo.async_grpo.enabled=true with policy.generation.backend=vllm requires "
                "policy.generation.vllm_cfg.async_engine=true"
            )
        return self

    @model_validator(mode="after")
    def _batch_constraints(self) -> "MasterConfig":
        p, g = self.policy, self.grpo
        samples = g.num_prompts_per_step * g.num_generations_per_prompt
        if samples % p.train_global_batch_size:
            raise ValueError(
                f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({samples}) must be a multiple of "
                f"policy.train_global_batch_size ({p.train_global_batch_size}): each step's samples split into "
                "whole optimizer batches"
            )
        if p.train_global_batch_size % p.train_micro_batch_size:
            raise ValueError(
                f"policy.train_global_batch_size ({p.train_global_batch_size}) must be a multiple of "
                f"policy.train_micro_batch_size ({p.train_micro_batch_size})"
            )
        if p.generation.max_new_tokens >= p.max_total_sequence_length:
            raise ValueError(
                "policy.generation.max_new_tokens must be smaller than policy.max_total_sequence_length "
                "(prompt and answer share it)"
            )
        return self

    @model_validator(mode="after")
    def _computer_use_needs_a_vlm(self) -> "MasterConfig":
        check_computer_use(self.policy, self.data)
        return self
