"""One test run per tree (`sandbox.tree_cache_size`): verdicts keyed by the tree their tests ran on, so that answers
whose diffs differ but leave the same files share one run (docs/services/sandbox.md, step 10). With
`sandbox.tree_cache_path` the kept verdicts also go to a JSON-lines file, read back when an executor starts: a
resumed run or a restarted service does not grade a tree again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec, Verdict
from fleet.singleflight import SingleFlight

log = logging.getLogger(__name__)

FILE_TAIL_CHARS = 8192
"""The end of each output tail that a verdict keeps in the file (the grade is in its other fields)."""

# Settings that never change a verdict: a file written under other values of these still answers.
_NOT_IN_FINGERPRINT = {"pool_size", "work_root", "tree_cache_size", "tree_cache_path", "max_pending", "auth_token",
                       "result_ttl_s", "sessions", "uid_base", "image_cache_dir", "image_cache_gb",
                       "image_pulls_in_flight", "image_pulls_per_min"}


def tree_key(spec: TaskSpec, tree_id: str) -> str:
    """A run's cache key: the tree its tests run on and everything else of the spec but the agent's patch (tests,
    command, time limit), whose effect the tree already holds."""
    rest = {k: v for k, v in dataclasses.asdict(spec).items() if k != "patch"}
    return hashlib.sha256(json.dumps([tree_id, rest], sort_keys=True).encode()).hexdigest()


def environment_fingerprint(settings: dict[str, object], test_runner: dict[str, str], sources: Iterable[Path]) -> str:
    """What a verdict depends on besides the tree and the spec: the sandbox's settings (those that can change a
    verdict), the versions the tests run with, and the sandbox's own code (a grading fix must not be answered by
    verdicts graded before it)."""
    digest = hashlib.sha256()
    kept = {k: v for k, v in settings.items() if k not in _NOT_IN_FINGERPRINT}
    digest.update(json.dumps([kept, test_runner], sort_keys=True, default=str).encode())
    for path in sorted(sources):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:32]


def sandbox_sources() -> list[Path]:
    """The code that grades: this package and the task/verdict contract."""
    here = Path(__file__).resolve().parent
    contract = here.parents[1] / "fleet" / "contracts" / "sandbox.py"
    return [*here.rglob("*.py"), contract]


class TreeCache(SingleFlight[Verdict]):
    """`size` verdicts by tree key; only completed runs are kept (a timeout depends on the executor's load, an
    infrastructure failure on nothing the patch did)."""

    def __init__(self, size: int) -> None:
        super().__init__(size, keep=lambda v: v.status == "completed")
        self.path: Path | None = None
        self.fingerprint = ""
        self.loaded = 0
        self._transient: set[str] = set()
        self._write_failed = False

    def attach_file(self, cfg: SandboxConfig, test_runner: dict[str, str]) -> None:
        """`attach` to `sandbox.tree_cache_path` under this executor's environment."""
        assert cfg.tree_cache_path is not None
        self.attach(Path(cfg.tree_cache_path), environment_fingerprint(cfg.model_dump(), test_runner,
                                                                        sandbox_sources()))

    def attach(self, path: Path, fingerprint: str) -> None:
        """Read the verdicts `path` holds for this environment (the last `size` of them), then append every verdict
        kept from now on. Lines of another environment, or that do not parse, are skipped; the file is rewritten
        with the ones kept once it holds more than twice `size` lines."""
        self.path, self.fingerprint = path, fingerprint
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text().splitlines() if path.exists() else []
        skipped = 0
        for line in lines:
            try:
                entry = json.loads(line)
                if entry["env"] != fingerprint:
                    skipped += 1
                    continue
                self.put(str(entry["key"]), Verdict.from_json(entry["verdict"]))
            except (ValueError, KeyError, TypeError):
                skipped += 1
        self.loaded = len(self._done)
        if len(lines) > 2 * self.size:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(self._line(k, v) for k, v in self._done.items()))
            os.replace(tmp, path)
        log.info("tree cache: %d verdicts read from %s (%d lines of another environment or unreadable)",
                 self.loaded, path, skipped)

    async def get_or_run(self, key: str, run: Callable[[], Awaitable[Verdict]], *, durable: bool = True) -> Verdict:
        """`durable=False`: the verdict is kept in memory only (an image named by a tag, which may move)."""
        if not durable:
            self._transient.add(key)
        try:
            return await super().get_or_run(key, run)
        finally:
            self._transient.discard(key)

    def on_kept(self, key: str, result: Verdict) -> None:
        if self.path is None or key in self._transient:
            return
        try:
            with open(self.path, "a") as f:
                f.write(self._line(key, result))
        except OSError as exc:  # the verdict stands: only a later restart loses it
            if not self._write_failed:
                log.warning("tree cache: cannot append to %s (%s); verdicts stay in memory only", self.path, exc)
            self._write_failed = True

    def _line(self, key: str, verdict: Verdict) -> str:
        data = verdict.to_json()
        for tail in ("stdout_tail", "stderr_tail"):  # up to max_output_kb each: the file keeps the end of them
            data[tail] = data[tail][-FILE_TAIL_CHARS:]
        return json.dumps({"env": self.fingerprint, "key": key, "verdict": data}) + "\n"

    def stats(self) -> dict[str, int]:
        return {**super().stats(), **({"loaded": self.loaded} if self.path is not None else {})}
