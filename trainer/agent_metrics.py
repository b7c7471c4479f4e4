"""Per-step metrics of agent-mode trajectories (`env.code.mode: agent`); nothing for single-shot ones.

An agent trajectory interleaves generated tokens with observation tokens (tool results the chat template renders
between turns). The contract (`protos/grpofleet/v1/common.proto`, `Trajectory.observation_spans`): observation
tokens have token version -1 and generation log-prob 0, and the loss masks them out. A turn is a run of
generated tokens; `finish_reason` says how the episode ended.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.contracts.groups import Trajectory

OBSERVATION_VERSION = -1
END_REASONS = ("submitted", "max_turns", "context_full", "timeout")


def is_agent(t: Trajectory) -> bool:
    return t.finish_reason in END_REASONS or OBSERVATION_VERSION in t.token_versions


def turns(versions: Sequence[int]) -> int:
    """Runs of generated tokens."""
    runs, inside = 0, False
    for v in versions:
        generated = v != OBSERVATION_VERSION
        runs += int(generated and not inside)
        inside = generated
    return runs


def agent_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """`agent/*` metrics over the step's agent trajectories: turns per episode, tokens generated vs observed, how
    the episodes ended, and the tool-call error rate (when the episodes carry tool-call counts)."""
    agent = [t for t in trajectories if is_agent(t)]
    if not agent:
        return {}
    n = len(agent)
    observed = [sum(v == OBSERVATION_VERSION for v in t.token_versions) for t in agent]
    stats = {
        "agent/episodes": float(n),
        "agent/turns_mean": sum(turns(t.token_versions) for t in agent) / n,
        "agent/turns_max": float(max(turns(t.token_versions) for t in agent)),
        "agent/generated_tokens_mean": sum(len(t.token_versions) - o for t, o in zip(agent, observed, strict=True))
        / n,
        "agent/observation_tokens_mean": sum(observed) / n,
    }
    for reason in END_REASONS:
        stats[f"agent/end_{reason}_frac"] = sum(t.finish_reason == reason for t in agent) / n
    episodes = [t.episode for t in agent if t.episode is not None]
    calls = sum(e.tool_calls for e in episodes)
    if calls:
        stats["agent/tool_error_rate"] = sum(e.tool_errors for e in episodes) / calls
    return stats
