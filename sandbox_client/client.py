"""Async client of the sandbox executors (`env.code.sandbox_urls`), used by rollout workers.

Per task: pick the up executor with the fewest outstanding tasks, submit, long-poll the result. Transport errors and
5xx answers are retried with exponential backoff, preferring another executor; a 401 (wrong token) or 400 (bad task)
raises at once, since retrying cannot fix configuration. Every task has a deadline (`task_timeout` + slack), moved out
by the time the task waits queued at an executor; when retries or the deadline run out the result says `infra_error`,
never a failed patch.

Tasks in flight: `max_concurrency` if given, else as many as the executors that are up have runners (the `pool_size`
their /healthz reports, probed once before the first task, then by the prober every `probe_interval_s`). Several
clients (rollout workers) may then each fill the whole pool; the extra tasks wait in the executors' queues, which is
why queued time does not count against the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp

from fleet.contracts.sandbox import DEFAULT_TASK_TIMEOUT_S, TOKEN_ENV, TaskSpec, Verdict
from sandbox_client.endpoints import EndpointPool, EndpointState, Gate, http_session, stop_task
from sandbox_client.health import runner_of
from sandbox_client.results import SandboxAuthError, SandboxRequestError, SandboxResult, SandboxUnavailable

if TYPE_CHECKING:
    from fleet.config.env import CodeEnvConfig

log = logging.getLogger(__name__)
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# Queueing at executors may stretch a task's deadline to at most (1 + this) times its length. With every client
# filling the executors' whole capacity, a task waits behind at most (clients - 1) rounds of others, each ended by its
# timeout at the latest: 4 rounds cover five rollout workers whose every task runs to its timeout (real tasks are far
# shorter). A task queued longer than that is behind a wedged queue, and ends as an infra_error like any other.
_QUEUED_DEADLINES = 4


class _Retryable(Exception):
    def __init__(self, message: str, *, down: bool) -> None:
        super().__init__(message)
        self.down = down
        """The executor looks dead (mark it down until /healthz answers) rather than just failing this task."""


class _DeadlineExceeded(Exception):
    pass


class _Deadline:
    """When a task must have its verdict: `length_s` after it started, plus the time it waited queued at an executor
    for a runner that other tasks held (a shared pool at work, not a failure), at most `_QUEUED_DEADLINES` x
    `length_s` of it."""

    def __init__(self, length_s: float) -> None:
        now = asyncio.get_running_loop().time()
        self.length_s, self.queued_s = length_s, 0.0
        self.at, self._latest = now + length_s, now + length_s * (1 + _QUEUED_DEADLINES)

    def left(self) -> float:
        return self.at - asyncio.get_running_loop().time()

    def queued(self, seconds: float) -> None:
        moved = max(0.0, min(seconds, self._latest - self.at))
        self.at += moved
        self.queued_s += moved

    def __str__(self) -> str:
        queued = f" (+{self.queued_s:.1f} s queued at executors)" if self.queued_s else ""
        return f"deadline of {self.length_s:g} s{queued}"


class SandboxClient:
    """`result = await client.evaluate(spec)`; `client.run` is a `Scorer` (returns the Verdict or raises)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None = None,
        task_timeout: float = DEFAULT_TASK_TIMEOUT_S,
        max_retries: int = 5,
        max_concurrency: int | None = None,
        integrity_check: bool = True,
        deadline_slack_s: float = 60.0,
        request_timeout_s: float = 30.0,
        poll_wait_s: float = 10.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        probe_interval_s: float = 1.0,
    ) -> None:
        self.pool = EndpointPool(list(urls))
        self.token = token or os.environ.get(TOKEN_ENV) or None
        self.task_timeout, self.max_retries, self.integrity_check = task_timeout, max_retries, integrity_check
        self.deadline_slack_s, self.request_timeout_s = deadline_slack_s, request_timeout_s
        self.poll_wait_s, self.backoff_s, self.max_backoff_s = poll_wait_s, backoff_s, max_backoff_s
        self.probe_interval_s = probe_interval_s
        self.max_concurrency = max_concurrency
        """Tasks in flight at most; None: the executors' capacity (`EndpointPool.capacity`)."""
        self._gate = Gate(self.pool.capacity() if max_concurrency is None else max_concurrency)
        self._sized = max_concurrency is not None
        self._sizing = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        self._prober: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, code: CodeEnvConfig, **overrides: Any) -> SandboxClient:
        """From the config's `env.code` section; keyword overrides win."""
        kwargs: dict[str, Any] = {
            "token": code.auth_token, "task_timeout": code.task_timeout, "max_retries": code.max_retries,
            "max_concurrency": code.num_workers, "integrity_check": code.integrity_check, **overrides}
        return cls(code.sandbox_urls, **kwargs)

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await stop_task(self._prober)
        self._prober = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = http_session(self.token)
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_loop(), name="sandbox-client-prober")
        return self._session

    # -- public API ----------------------------------------------------------------------------------------------
    async def run(self, spec: TaskSpec) -> Verdict:
        """The verdict of `spec`; raises SandboxUnavailable when there is none (infrastructure failure)."""
        result = await self.evaluate(spec)
        if result.infra_error is not None:
            raise SandboxUnavailable(result.infra_error)
        assert result.verdict is not None
        return result.verdict

    async def evaluate_many(self, specs: Sequence[TaskSpec]) -> list[SandboxResult]:
        return list(await asyncio.gather(*(self.evaluate(s) for s in specs)))

    async def evaluate(self, spec: TaskSpec, *, deadline_s: float | None = None) -> SandboxResult:
        """Run `spec` on some executor. Raises only SandboxAuthError / SandboxRequestError (configuration bugs)."""
        await self._size_gate()
        async with self._gate:
            return await self._evaluate(spec, deadline_s or self.task_timeout + self.deadline_slack_s)

    async def _size_gate(self) -> None:
        """Before the first task: ask the executors their capacity once, rather than admit the first batch by a
        guess (too few idles runners until the prober's next round, too many queues where a pool is small)."""
        if self._sized:
            return
        async with self._sizing:
            if not self._sized:
                await self.health()
                self._sized = True

    async def health(self) -> dict[str, bool]:
        """Probe every executor's /healthz now (also updates which are up)."""
        states = self.pool.states
        return dict(zip([s.url for s in states], await asyncio.gather(*(self._probe(s) for s in states)),
                        strict=True))

    async def prefetch(self, image: str) -> int:
        """Ask every executor that is up to start pulling `image` now (a task leased, its answer not yet generated);
        best effort: returns how many accepted. A failed pull surfaces as the task's infra_error, naming the image."""
        session = self._ensure_session()

        async def one(state: EndpointState) -> bool:
            try:
                async with session.post(f"{state.url}/image/prefetch", json={"image": image},
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    return resp.status == 202
            except _TRANSPORT_ERRORS:
                return False

        return sum(await asyncio.gather(*(one(s) for s in self.pool.states if s.up)))

    @property
    def in_flight_limit(self) -> int:
        """Tasks this client runs at once now: `max_concurrency`, or the executors' capacity as last probed."""
        return self._gate.limit

    def endpoint_states(self) -> list[EndpointState]:
        return [replace(s) for s in self.pool.states]

    # -- one task ------------------------------------------------------------------------------------------------
    def _body(self, spec: TaskSpec) -> dict[str, Any]:
        body = spec.to_json()
        body["integrity_check"] = spec.integrity_check and self.integrity_check
        return body

    async def _evaluate(self, spec: TaskSpec, deadline_s: float) -> SandboxResult:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = _Deadline(deadline_s)
        body, attempts = self._body(spec), 0
        errors: list[str] = []
        avoid: set[str] = set()

        def failure(why: str) -> SandboxResult:
            detail = "; ".join(errors[-3:])
            return SandboxResult(None, infra_error=f"{why}{': ' + detail if detail else ''}", attempts=attempts,
                                 elapsed_s=loop.time() - t0)

        while True:
            state = self._choose(avoid, attempts)
            if state is None:  # no fresh executor up: back off, waking early if one comes back
                await self.pool.wait_up(min(self._backoff(attempts), deadline.left()))
                state = self.pool.pick(avoid) or self.pool.fallback()
            if deadline.left() <= 0:
                return failure(f"{deadline} exceeded after {attempts} attempts")
            attempts += 1
            try:
                verdict = await self._attempt(state, body, deadline)
            except _Retryable as exc:
                errors.append(f"{state.url}: {exc}")
                (self.pool.mark_down if exc.down else self.pool.record_failure)(state, str(exc))
                avoid.add(state.url)
                log.warning("sandbox attempt %d on %s failed: %s", attempts, state.url, exc)
                if attempts > self.max_retries:
                    return failure(f"gave up after {attempts} attempts (env.code.max_retries={self.max_retries})")
                continue
            except _DeadlineExceeded:
                errors.append(f"{state.url}: no verdict yet")
                return failure(f"{deadline} exceeded")
            self.pool.mark_up(state)
            state.verdicts += 1
            elapsed = loop.time() - t0
            if verdict.is_infra_failure:
                return SandboxResult(verdict, infra_error=f"{state.url}: {verdict.error}", executor=state.url,
                                     attempts=attempts, elapsed_s=elapsed)
            return SandboxResult(verdict, executor=state.url, attempts=attempts, elapsed_s=elapsed)

    def _choose(self, avoid: set[str], attempts: int) -> EndpointState | None:
        """First try: the best up executor, else any (all down: it may be back). Retries: a fresh up one or None."""
        if attempts == 0:
            return self.pool.pick(set()) or self.pool.fallback()
        return self.pool.pick(avoid, fresh_only=True)

    def _backoff(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jitter: retries of many tasks do not arrive in lockstep

    async def _attempt(self, state: EndpointState, body: dict[str, Any], deadline: _Deadline) -> Verdict:
        async with self.pool.track(state):
            task_id = await self._submit(state, body, deadline)
            try:
                verdict = await self._poll(state, task_id, deadline)
            except (_DeadlineExceeded, asyncio.CancelledError):
                # Free the executor's slot: nobody will read this result.
                await asyncio.shield(self._forget(state, task_id))
                raise
            # The result is ours now: the executor need not keep its output tails until result_ttl_s.
            await self._forget(state, task_id)
            return verdict

    def _timeout(self, deadline: _Deadline, extra: float = 0.0) -> aiohttp.ClientTimeout:
        remaining = deadline.left()
        if remaining <= 0:
            raise _DeadlineExceeded()
        return aiohttp.ClientTimeout(total=min(self.request_timeout_s + extra, remaining))

    @staticmethod
    async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
        try:
            data = await resp.json(content_type=None)
        except ValueError:
            data = None
        return data if isinstance(data, dict) else {"error": f"HTTP {resp.status} without a JSON body"}

    def _raise_for(self, state: EndpointState, status: int, data: dict[str, Any]) -> None:
        """Map an error answer: 401/400 raise for the caller, 5xx and the rest are retryable."""
        message = str(data.get("error", f"HTTP {status}"))
        if status == 401:
            raise SandboxAuthError(f"sandbox executor {state.url} rejected the token: {message} "
                                   f"(set env.code.auth_token or {TOKEN_ENV} to the executor's sandbox.auth_token)")
        if status == 400:
            raise SandboxRequestError(f"sandbox executor {state.url} rejected the task: {message}", data.get("field"))
        # Down: a draining executor (until its /healthz is 200 again) or a URL that is no executor at all (404 on
        # submit). A lost task id (executor restarted) or a full queue only send this task elsewhere.
        lost = status == 404 and "unknown task" in message
        down = bool(data.get("draining")) or (status == 404 and not lost)
        raise _Retryable(f"HTTP {status}: {message}", down=down)

    async def _submit(self, state: EndpointState, body: dict[str, Any], deadline: _Deadline) -> str:
        session = self._ensure_session()
        try:
            async with session.post(f"{state.url}/task/submit", json=body, timeout=self._timeout(deadline)) as resp:
                data = await self._json(resp)
                if resp.status == 200 and isinstance(data.get("task_id"), str):
                    return str(data["task_id"])
                self._raise_for(state, resp.status, data)
        except _TRANSPORT_ERRORS as exc:
            raise _Retryable(f"submit failed: {type(exc).__name__}: {exc}", down=True) from exc
        raise AssertionError("unreachable")

    async def _poll(self, state: EndpointState, task_id: str, deadline: _Deadline) -> Verdict:
        session = self._ensure_session()
        loop = asyncio.get_running_loop()
        transient, answered = 0, loop.time()
        while True:
            wait = max(0.0, min(self.poll_wait_s, deadline.left() - 0.5))
            url = f"{state.url}/task/{task_id}/result?wait={wait:.2f}"
            try:
                async with session.get(url, timeout=self._timeout(deadline, extra=wait)) as resp:
                    data = await self._json(resp)
                    if resp.status == 200:
                        data.pop("task_id", None)
                        return Verdict.from_json(data)
                    if resp.status != 202:
                        self._raise_for(state, resp.status, data)
                # A task goes pending -> running, never back: pending now means pending since the last answer. The
                # interval in which it started is not counted, so up to one poll (poll_wait_s) of queueing still is.
                if data.get("status") == "pending":
                    deadline.queued(loop.time() - answered)
                answered = loop.time()
                transient = 0
            except aiohttp.ClientConnectorError as exc:  # connection refused: the executor is gone
                raise _Retryable(f"executor unreachable: {exc}", down=True) from exc
            except _TRANSPORT_ERRORS as exc:
                transient += 1
                if transient >= 3:
                    raise _Retryable(f"polling failed: {type(exc).__name__}: {exc}", down=True) from exc
                await asyncio.sleep(min(1.0, self.backoff_s * transient))
            except TypeError as exc:  # a result that is not a Verdict
                raise _Retryable(f"malformed result: {exc}", down=False) from exc

    async def _forget(self, state: EndpointState, task_id: str) -> None:
        if self._session is None:
            return
        with contextlib.suppress(*_TRANSPORT_ERRORS):
            async with self._session.delete(f"{state.url}/task/{task_id}", timeout=aiohttp.ClientTimeout(total=5)):
                pass

    # -- health probing ------------------------------------------------------------------------------------------
    async def _probe(self, state: EndpointState) -> bool:
        session = self._ensure_session()
        try:
            async with session.get(f"{state.url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                ok = resp.status == 200
                if ok:
                    health = await self._json(resp)
                    size = health.get("pool_size")
                    state.pool_size = size if isinstance(size, int) and size > 0 else None
                    state.test_runner = runner_of(health)
        except _TRANSPORT_ERRORS as exc:
            ok, state.last_error = False, f"healthz: {type(exc).__name__}: {exc}"
        if ok:
            if not state.up:
                log.info("sandbox executor %s is up again", state.url)
            self.pool.mark_up(state)
        elif state.up:
            self.pool.mark_down(state, state.last_error or "healthz not ok")
        if self.max_concurrency is None:
            self._gate.set_limit(self.pool.capacity())
        return ok

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            # Every executor, not only those marked down: a killed one that answered its last requests with errors
            # (or got none since) would otherwise stay "up" until a task reached it.
            try:
                await asyncio.gather(*(self._probe(s) for s in self.pool.states))
            except Exception:  # a probe must never kill the loop that brings executors back
                log.exception("sandbox health probe failed")
