"""Scoring a completion: the environment named by the prompt group turns text into a verdict (the SWE environment
through the sandbox fleet), and `sandbox_client.reward_from_verdict` — the project's only reward mapping — turns the
verdict into a reward. Infrastructure failures raise `ScoringUnavailable`; they are never scored as a failed patch."""

from __future__ import annotations

from typing import Any

from fleet.config import MasterConfig
from grpofleet.v1 import common_pb2
from services.sandbox.model import Verdict

_STATUS = {
    "completed": common_pb2.VERDICT_STATUS_COMPLETED,
    "format_error": common_pb2.VERDICT_STATUS_FORMAT_ERROR,
    "not_applied": common_pb2.VERDICT_STATUS_PATCH_NOT_APPLIED,
    "refused": common_pb2.VERDICT_STATUS_INTEGRITY_REFUSED,
    "timeout": common_pb2.VERDICT_STATUS_TIMEOUT,
}
_RESOLUTION = {"FULL": common_pb2.RESOLUTION_FULL, "PARTIAL": common_pb2.RESOLUTION_PARTIAL,
               "NO": common_pb2.RESOLUTION_NO}


class ScoringUnavailable(RuntimeError):
    """The scoring infrastructure failed (after retries); the group must be retried, not scored."""


def to_proto_verdict(v: Verdict) -> common_pb2.Verdict:
    return common_pb2.Verdict(
        status=_STATUS.get(v.status, common_pb2.VERDICT_STATUS_UNSPECIFIED),
        resolution=_RESOLUTION.get(v.resolution, common_pb2.RESOLUTION_NO),
        tests_passed=v.tests_passed, tests_failed=v.tests_failed, detail=v.error[:500],
    )


class Scorer:
    def __init__(self, cfg: MasterConfig) -> None:
        from envs.registry import get_environment

        from sandbox_client import SandboxClient

        self.cfg = cfg
        self.sandbox = SandboxClient.from_config(cfg)
        self._get_env = get_environment

    async def close(self) -> None:
        await self.sandbox.close()

    async def score(self, env_name: str, payload: dict[str, Any], text: str, *, truncated: bool) -> tuple[
            Verdict, float, int]:
        """(verdict, reward, infrastructure retries spent)."""
        from sandbox_client import reward_from_verdict

        env = self._get_env(env_name)
        result = await env.score(payload, text, sandbox=self.sandbox, cfg=self.cfg, truncated=truncated)
        if result.infra_error is not None:
            raise ScoringUnavailable(result.infra_error)
        verdict = result.verdict
        code = self.cfg.env.code
        reward = reward_from_verdict(verdict, code.reward_mode, code.format_error_reward)
        return verdict, reward, result.retries
