"""`Outage`: one process's view of one dependency being down, shared by every call that depends on it.

A dependency that goes away (a restarted replay buffer, a Redis reloading its AOF) is an outage to ride out, not a
failure: callers keep retrying with backoff for up to a bound, then stop with a message that names what is down.
However many calls wait on it at once, an outage logs exactly three kinds of line: when it starts, every
`report_every_s` while it lasts ("still waiting"), and when it ends. Used by the buffer's clients (trainer, rollout
workers: `services.runtime.client.call_through_outage`) and by the buffer itself for its Redis.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class ServiceDown(RuntimeError):
    """A dependency stayed down longer than the configured bound; the message names it and the bound's key."""


class Outage:
    def __init__(
        self,
        what: str,
        tolerance_s: float,
        *,
        report_every_s: float = 30.0,
        bound_key: str = "services.outage_tolerance_s",
        logger: logging.Logger | None = None,
    ) -> None:
        self.what = what
        self.tolerance_s = tolerance_s
        self.report_every_s = report_every_s
        self.bound_key = bound_key
        self.log = logger or log
        self.started: float | None = None
        self.detail = ""
        self.first_detail = ""
        self.last_answer = ""  # the service's own last word during this outage (e.g. "its Redis is down")
        self.outages = 0  # how many outages this process has seen (for tests and summaries)
        self.last_duration_s = 0.0
        self._reported_at = 0.0

    @property
    def active(self) -> bool:
        return self.started is not None

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def failed(self, detail: str, *, answered: bool = False) -> None:
        """A call found the dependency down (`answered`: the service itself said so, e.g. that its backend is down):
        starts the outage (one log line), or continues it (a line every `report_every_s`). Raises `ServiceDown` once
        the outage is older than the bound."""
        now = time.monotonic()
        self.detail = detail
        if answered:
            self.last_answer = detail
        if self.started is None:
            self.started = self._reported_at = now
            self.first_detail = detail
            self.outages += 1
            self.log.warning(
                "%s is unavailable (%s); waiting for it, up to %.0f s (%s)",
                self.what,
                detail,
                self.tolerance_s,
                self.bound_key,
            )
        elif now - self._reported_at >= self.report_every_s:
            self._reported_at = now
            self.log.warning("%s still unavailable after %.0f s (%s)", self.what, now - self.started, detail)
        if now - self.started > self.tolerance_s:
            raise ServiceDown(self.describe_down())

    def recovered(self) -> None:
        """A call succeeded: ends the outage, if there was one (one log line)."""
        if self.started is None:
            return
        self.last_duration_s = time.monotonic() - self.started
        self.started = None
        self.last_answer = ""
        self.log.info("%s is back after %.1f s of outage", self.what, self.last_duration_s)

    def describe_down(self) -> str:
        # The service's own last answer says most (the buffer naming its Redis, before it went away itself too).
        earlier = self.last_answer or self.first_detail
        before = f" (before that: {earlier})" if earlier and earlier != self.detail else ""
        return (
            f"{self.what} has been down for {self.elapsed():.1f} s, longer than {self.bound_key}="
            f"{self.tolerance_s:g}: {self.detail}{before}; giving up"
        )
