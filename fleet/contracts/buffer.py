"""The replay buffer's plain answers, shared by the buffer (which makes them) and its clients (which read them).

`Starvation` says why a Sample came back short: the store builds it, the servicer puts it on the wire, the client
reads it back, and the trainer's coordinator logs, counts and raises with it. One type for all four."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Starvation:
    reason: str = ""
    prompts_pending: int = 0
    leases_outstanding: int = 0
    live_workers: int = 0
    evicted_now: int = 0
    waited_s: float = 0.0

    def describe(self) -> str:
        return (
            f"{self.reason}: {self.prompts_pending} prompts pending, {self.leases_outstanding} leases out, "
            f"{self.live_workers} live workers, {self.evicted_now} evicted, waited {self.waited_s:.1f}s"
        )
