"""Client of the sandbox executors: `SandboxClient` spreads tasks over `env.code.sandbox_urls` and returns a
`SandboxResult` in which an infrastructure failure (`infra_error`) can never be mistaken for a failed patch.
`reward_from_verdict` is the project's only verdict -> reward mapping."""

from fleet.contracts.sandbox import RewardMode, TaskSpec, Verdict
from sandbox_client.client import SandboxClient
from sandbox_client.endpoints import EndpointState
from sandbox_client.results import (
    SandboxAuthError,
    SandboxError,
    SandboxRequestError,
    SandboxResult,
    SandboxUnavailable,
)
from sandbox_client.reward import reward_from_verdict

__all__ = [
    "EndpointState",
    "RewardMode",
    "SandboxAuthError",
    "SandboxClient",
    "SandboxError",
    "SandboxRequestError",
    "SandboxResult",
    "SandboxUnavailable",
    "TaskSpec",
    "Verdict",
    "reward_from_verdict",
]
