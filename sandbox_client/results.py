"""What the client returns: a verdict, or an infrastructure failure -- two fields that are never both set."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.contracts.sandbox import Verdict


class SandboxError(Exception):
    """Base of the client's errors."""


class SandboxAuthError(SandboxError):
    """An executor rejected the bearer token (401): a configuration error, not retried."""


class SandboxRequestError(SandboxError):
    """An executor rejected the task itself (400): a bug in the caller's TaskSpec, not retried."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SandboxUnavailable(SandboxError):
    """No verdict could be had (every retry failed, or the deadline passed). Never a statement about the patch."""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one task. Exactly one of: `infra_error` is None and `verdict` says what the patch did; or
    `infra_error` says why there is no verdict (`verdict` may then hold an executor's `infra_error` verdict)."""

    verdict: Verdict | None
    infra_error: str | None = None
    executor: str | None = None
    """URL of the executor that gave the verdict."""
    attempts: int = 0
    """Submissions made (1 = no retry)."""
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        if self.infra_error is None and (self.verdict is None or self.verdict.is_infra_failure):
            raise ValueError("a SandboxResult without infra_error needs a non-infra verdict")

    @property
    def ok(self) -> bool:
        return self.infra_error is None

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)
