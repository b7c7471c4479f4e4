"""Sandbox executor: verdict latency and throughput on a real repository's test suite, against the same pytest
command run bare (no sandbox, no HTTP, no checkout) in the same run.

    .venv/bin/python benchmarks/sandbox_bench.py                  # pools 1..cores, 4 tasks per slot, 2 rounds
    .venv/bin/python benchmarks/sandbox_bench.py --pools 1,2,4 --tasks-per-slot 6 --rounds 3
    .venv/bin/python benchmarks/sandbox_bench.py --executors 1,2   # scale out: executors of pool 1 behind one client
    .venv/bin/python benchmarks/sandbox_bench.py --pools 1,2 --baseline /tmp/before  # two versions in one run

Repository: inflection 0.5.1 from PyPI (sdist, 455 tests in `test_inflection.py`), made into a git repository; the
download is cached under `fleet.paths.cache_dir()/sdists`. Each sandboxed task is the full path a rollout takes:
`SandboxClient` -> HTTP -> executor (fresh tree from git, patch, bwrap + limits, junit, swebench grading), with every
test listed in PASS_TO_PASS so the verdict is FULL. The bare run is the exact pytest command the executor runs, with
the same environment switches, in a prepared checkout. Both run `pool` at a time; bare and sandboxed batches
alternate for `--rounds` rounds and medians are reported, so that load from other processes hits both alike.
Writes `benchmarks/results/sandbox.json`.

`--baseline TREE` compares two versions of the executor in one run: this checkout's and the one in TREE (e.g.
`git archive OLD | tar -x -C TREE`), each as its own server process (`grpo-fleet serve sandbox`'s `serve`), with
bare, this and the baseline batches alternating in every round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, the checkout is not on sys.path: the editable install's package map may predate sandbox_client.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.config.infra import SandboxConfig  # noqa: E402
from fleet.contracts.sandbox import TaskSpec  # noqa: E402
from fleet.paths import cache_dir  # noqa: E402
from sandbox_client import SandboxClient  # noqa: E402
from services.sandbox.bwrap import SandboxPolicy, UidRange, probe_interpreter  # noqa: E402
from services.sandbox.process import run_limited  # noqa: E402
from services.sandbox.server import SandboxServer  # noqa: E402

PACKAGE, VERSION, SUITE = "inflection", "0.5.1", "test_inflection.py"
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sandbox.json"
log = logging.getLogger("sandbox_bench")


def fetch_repository(work: Path) -> tuple[Path, str]:
    """inflection's sdist as a git repository with one commit; returns (repo, commit)."""
    sdists = cache_dir() / "sdists"
    archive = sdists / f"{PACKAGE}-{VERSION}.tar.gz"
    if not archive.exists():
        sdists.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        f"{PACKAGE}=={VERSION}", "-d", str(sdists)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    repo = work / f"{PACKAGE}-{VERSION}"
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b", "GIT_CONFIG_GLOBAL": os.devnull}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"{PACKAGE} {VERSION}"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    return repo, commit


def pytest_env() -> dict[str, str]:
    return {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def collect_ids(repo: Path) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", SUITE],
                         cwd=repo, capture_output=True, text=True, env=pytest_env(), check=True).stdout
    return [line for line in out.splitlines() if "::" in line]


async def bare_batch(repo: Path, n: int, pool: int) -> list[float]:
    """`n` runs of the executor's own pytest command, `pool` at a time; per-run wall seconds."""
    sem = asyncio.Semaphore(pool)

    async def one(i: int) -> float:
        async with sem:
            junit = repo / f".bench-junit-{i}.xml"
            t0 = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short",
                f"--junitxml={junit}", "-o", "junit_family=xunit1", SUITE, cwd=repo, env=pytest_env(),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            if await proc.wait() != 0:
                raise RuntimeError("the bare test run failed")
            elapsed = time.monotonic() - t0
            junit.unlink()
            return elapsed

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def sandbox_batch(client: SandboxClient, spec: TaskSpec, n: int) -> list[dict[str, float]]:
    """`n` tasks at once through the client (the executor's pool bounds concurrency); per-task timings."""

    async def one() -> dict[str, float]:
        t0 = time.monotonic()
        verdict = await client.run(spec)
        if verdict.resolution != "FULL":
            raise RuntimeError(f"unexpected verdict {verdict.status}/{verdict.resolution}: {verdict.error}")
        latency = time.monotonic() - t0
        # end_to_end_s: the task's latency minus its wait for a pool slot (client, HTTP, polling included).
        return {"latency_s": latency, "end_to_end_s": latency - verdict.timings.get("queued_s", 0.0),
                **verdict.timings}

    return list(await asyncio.gather(*(one() for _ in range(n))))


_SERVER = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from fleet.config.infra import SandboxConfig
from services.sandbox.server import serve
cfg = SandboxConfig(pool_size=int(sys.argv[2]), work_root=sys.argv[3], uid_base=int(sys.argv[5]))
sys.exit(asyncio.run(serve(cfg, "127.0.0.1", int(sys.argv[4]), 0.0)))
"""


async def server_process(tree: Path, pool: int, work: Path, uid_base: int) -> tuple[asyncio.subprocess.Process, str]:
    """A sandbox server of the executor in `tree`, in its own process; (process, url) once it answers /healthz."""
    import socket

    import aiohttp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SERVER, str(tree), str(pool), str(work),
                                                str(port), str(uid_base), cwd=str(tree),
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(f"{url}/healthz") as resp:
                    if resp.status == 200:
                        return proc, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the sandbox server of {tree} did not start")


async def measure_versions(repo: Path, spec: TaskSpec, pool: int, n: int, rounds: int, work: Path,
                           baseline: Path) -> dict[str, Any]:
    """Bare, this checkout's executor and the baseline's, alternating; each executor in a server process."""
    servers = [await server_process(tree, pool, work / f"{name}-{pool}", uid) for name, tree, uid in
               (("current", ROOT, 64000), ("baseline", baseline, 65000))]
    out: dict[str, Any] = {"pool": pool}
    rows: dict[str, list[dict[str, float]]] = {"bare": [], "current": [], "baseline": []}
    parts: dict[str, list[dict[str, float]]] = {"current": [], "baseline": []}
    try:
        clients = [SandboxClient([url], max_concurrency=n, task_timeout=600) for _, url in servers]
        for client in clients:
            await sandbox_batch(client, spec, pool)  # warm-up
        for _ in range(rounds):
            t0 = time.monotonic()
            rows["bare"].append(summary(await bare_batch(repo, n, pool), time.monotonic() - t0))
            for name, client in zip(("current", "baseline"), clients, strict=True):
                t0 = time.monotonic()
                tasks = await sandbox_batch(client, spec, n)
                rows[name].append(summary([t["latency_s"] for t in tasks], time.monotonic() - t0))
                parts[name].append(_round_means(tasks))
        for client in clients:
            await client.close()
    finally:
        for proc, _ in servers:
            proc.terminate()
            await proc.wait()
    for name, values in rows.items():
        out[name] = _median_round(values)
    for name in ("current", "baseline"):
        breakdown = _median_of_rounds(parts[name])
        out[f"{name}_breakdown_mean_s"] = breakdown
        out[f"{name}_overhead"] = overheads({"bare": out["bare"], "sandbox_breakdown_mean_s": breakdown})
    return out


async def startup_cost(work: Path, runs: int = 20) -> dict[str, float]:
    """Median wall time of `python -c pass`, bare and through the executor's own sandbox command line."""
    cfg = SandboxConfig(work_root=str(work / "startup"))
    tools = {name: shutil.which(name) or name for name in ("prlimit", "bwrap", "setpriv")}
    uids = UidRange(cfg.uid_base, 1)
    policy = SandboxPolicy(cfg, await probe_interpreter(None), work / "startup", 1, tools, uids.base)
    tree = work / "startup" / "x" / "tree"
    tree.mkdir(parents=True)
    for path in (tree.parent.parent, tree.parent):
        path.chmod(0o711)
    uid = policy.uid_for_slot(0)
    if uid is not None:
        os.chown(tree, uid, uid)
    command = [sys.executable, "-c", "pass"]
    timings: dict[str, list[float]] = {"bare_ms": [], "sandboxed_ms": []}
    for _ in range(runs):
        bare = await run_limited(command, env=policy.env({}), cwd=str(tree), limit_s=60, output_cap=1024)
        pipe = os.pipe()
        argv = policy.argv(tree, command, slot=0, hide=[], status_fd=pipe[1], cpu_s=60)
        boxed = await run_limited(argv, env=policy.env({}), cwd=str(tree), limit_s=60, output_cap=1024,
                                  status_pipe=pipe)
        if not boxed.started or boxed.exit_code != 0:
            raise RuntimeError(f"sandboxed python failed: {boxed.stderr.text()[-300:]}")
        timings["bare_ms"].append(1000 * bare.wall_s)
        timings["sandboxed_ms"].append(1000 * boxed.wall_s)
    uids.release()
    return {key: round(statistics.median(values), 1) for key, values in timings.items()}


def summary(latencies: list[float], wall_s: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"tasks": len(ordered), "wall_s": round(wall_s, 3), "throughput_per_s": round(len(ordered) / wall_s, 3),
            "latency_mean_s": round(statistics.fmean(ordered), 3),
            "latency_p50_s": round(statistics.median(ordered), 3),
            "latency_p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3)}


async def measure_pool(repo: Path, spec: TaskSpec, pool: int, n: int, rounds: int, work: Path) -> dict[str, Any]:
    cfg = SandboxConfig(pool_size=pool, work_root=str(work / f"work-{pool}"))
    server = SandboxServer(cfg)
    await server.start()
    bare_rounds: list[dict[str, float]] = []
    sandbox_rounds: list[dict[str, float]] = []
    breakdown: list[dict[str, float]] = []
    try:
        async with SandboxClient([f"http://127.0.0.1:{server.port}"], max_concurrency=n, task_timeout=600) as client:
            await sandbox_batch(client, spec, pool)  # warm-up: page cache, first imports
            for _ in range(rounds):
                t0 = time.monotonic()
                bare = await bare_batch(repo, n, pool)
                bare_rounds.append(summary(bare, time.monotonic() - t0))
                t0 = time.monotonic()
                tasks = await sandbox_batch(client, spec, n)
                sandbox_rounds.append(summary([t["latency_s"] for t in tasks], time.monotonic() - t0))
                breakdown.append(_round_means(tasks))
    finally:
        await server.stop(0)
    return {"pool": pool, "bare": _median_round(bare_rounds), "sandbox": _median_round(sandbox_rounds),
            "sandbox_breakdown_mean_s": _median_of_rounds(breakdown)}


async def measure_executors(spec: TaskSpec, counts: list[int], per_executor: int, rounds: int,
                            work: Path) -> list[dict[str, Any]]:
    """Scale-out as a rollout worker sees it: `k` executors (pool 1 each) behind one SandboxClient, which spreads
    tasks least-outstanding first; `k * per_executor` tasks at once, throughput per round (median reported)."""
    rows: list[dict[str, Any]] = []
    for k in counts:
        servers = [SandboxServer(SandboxConfig(pool_size=1, work_root=str(work / f"exec-{k}-{i}"))) for i in range(k)]
        for server in servers:
            await server.start()
        rounds_out: list[dict[str, float]] = []
        try:
            urls = [f"http://127.0.0.1:{server.port}" for server in servers]
            async with SandboxClient(urls, max_concurrency=k * per_executor, task_timeout=600) as client:
                await sandbox_batch(client, spec, k)  # warm-up
                for _ in range(rounds):
                    t0 = time.monotonic()
                    tasks = await sandbox_batch(client, spec, k * per_executor)
                    rounds_out.append(summary([t["latency_s"] for t in tasks], time.monotonic() - t0))
        finally:
            for server in servers:
                await server.stop(0)
        median = _median_round(rounds_out)
        rows.append({"executors": k, "sandbox": median, "throughput_per_s": median["throughput_per_s"]})
        log.info("executors %d: %s", k, json.dumps(rows[-1]))
    for row in rows:
        row["speedup_vs_1"] = round(row["throughput_per_s"] / rows[0]["throughput_per_s"], 2)
    return rows


def _median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}


def _round_means(tasks: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.fmean(t.get(key, 0.0) for t in tasks) for key in tasks[0]}


def _median_of_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's per-round mean, median over rounds: the statistic the bare runs get (`_median_round` of their
    per-round mean latency). A mean over every task let one loaded round weigh on the executor's side only."""
    return {key: round(statistics.median(r[key] for r in rounds), 4) for key in sorted(rounds[0])}


def overheads(row: dict[str, Any]) -> dict[str, float]:
    """Per-task overhead vs the bare run at the same concurrency, in % of the bare time.

    Both sides are medians over rounds of a round's mean. service: what the executor adds around the tests (fresh
    tree, patches, sandbox start, grading), from its own timings; tests_in_sandbox: bwrap + limits around the same
    pytest; end_to_end: also HTTP, polling and the client (queueing for a pool slot excluded: bare runs wait for their
    semaphore outside the timer too).
    """
    bare = row["bare"]["latency_mean_s"]
    parts = row["sandbox_breakdown_mean_s"]
    return {name: round(100 * (parts[key] - bare) / bare, 1)
            for name, key in (("service_pct", "total_s"), ("tests_in_sandbox_pct", "tests_s"),
                              ("end_to_end_pct", "end_to_end_s"))}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        work = Path(tmp)
        repo, commit = fetch_repository(work)
        ids = collect_ids(repo)
        spec = TaskSpec(repo_url=str(repo), base_commit=commit, patch="", pass_to_pass=ids, timeout=600)
        load_before = os.getloadavg()
        if args.executors:
            rows = await measure_executors(spec, args.executors, args.tasks_per_slot, args.rounds, work)
            return {"benchmark": "sandbox executors behind one client", "command": " ".join(
                        [Path(sys.executable).name, *sys.argv]),
                    "repository": f"{PACKAGE} {VERSION} ({len(ids)} tests in {SUITE})",
                    "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                                "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
                    "tasks_per_executor": args.tasks_per_slot, "rounds": args.rounds, "results": rows}
        if args.baseline:
            rows = [await measure_versions(repo, spec, pool, pool * args.tasks_per_slot, args.rounds, work,
                                           args.baseline) for pool in args.pools]
            return {"benchmark": "sandbox executor, this checkout vs a baseline, vs bare pytest",
                    "command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "repository": f"{PACKAGE} {VERSION} ({len(ids)} tests in {SUITE})",
                    "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                                "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
                    "tasks_per_slot": args.tasks_per_slot, "rounds": args.rounds, "results": rows}
        startup = await startup_cost(work)
        log.info("python -c pass: %s", startup)
        rows = []
        for pool in args.pools:
            log.info("pool %d: %d tasks x %d rounds", pool, pool * args.tasks_per_slot, args.rounds)
            row = await measure_pool(repo, spec, pool, pool * args.tasks_per_slot, args.rounds, work)
            row["overhead"] = overheads(row)
            rows.append(row)
            log.info("pool %d: %s", pool, json.dumps(row))
    base = rows[0]["sandbox"]["throughput_per_s"]
    for row in rows:
        row["sandbox_speedup_vs_pool1"] = round(row["sandbox"]["throughput_per_s"] / base, 2)
        row["bare_speedup_vs_pool1"] = round(row["bare"]["throughput_per_s"] / rows[0]["bare"]["throughput_per_s"], 2)
    return {
        "benchmark": "sandbox executor vs bare pytest",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "repository": f"{PACKAGE} {VERSION} ({len(ids)} tests in {SUITE})",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "tasks_per_slot": args.tasks_per_slot, "rounds": args.rounds,
        "target": "service overhead <= 15% of the bare test time per task; throughput scales with pool up to cores",
        "python_startup_median_ms": startup,
        "results": rows,
    }


def parse_args() -> argparse.Namespace:
    cores = os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=lambda s: [int(x) for x in s.split(",")],
                        default=sorted({1, *range(2, cores + 1, max(1, cores // 4))}),
                        help="pool sizes to measure (default: 1..cores)")
    parser.add_argument("--tasks-per-slot", type=int, default=4, help="tasks per pool slot in one batch")
    parser.add_argument("--rounds", type=int, default=2, help="alternating bare/sandbox rounds (median reported)")
    parser.add_argument("--executors", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="instead of pools: executor counts (pool 1 each) behind one client, e.g. 1,2")
    parser.add_argument("--out", type=Path, default=None, help="default: results/sandbox.json "
                        "(sandbox_executors.json with --executors, sandbox_versions.json with --baseline)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another version: both executors measured in one run")
    args = parser.parse_args()
    if args.out is None:
        args.out = RESULTS.with_name("sandbox_executors.json") if args.executors else \
            RESULTS.with_name("sandbox_versions.json") if args.baseline else RESULTS
    return args


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    arguments = parse_args()
    report = asyncio.run(main(arguments))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(report, indent=2) + "\n")
    if arguments.executors or arguments.baseline:
        print(json.dumps(report["results"], indent=1))
    else:
        print(json.dumps({r["pool"]: {"bare_s": r["bare"]["latency_mean_s"], "overhead": r["overhead"],
                                      "sandbox_per_s": r["sandbox"]["throughput_per_s"],
                                      "bare_per_s": r["bare"]["throughput_per_s"]} for r in report["results"]},
                         indent=1))
    print(f"wrote {arguments.out}")
