"""Replay-buffer throughput: scored groups per second through the fleet's path, against raw redis-py XADD -> XREADGROUP
(+XACK) of the same bytes on the same Redis, measured in the same run. The fleet's path (issue 20): the worker
writes a group's bytes to a Redis payload key and submits its header (SubmitGroups), the trainer calls Sample
(headers + payload keys) and reads the bytes with one MGET; the bytes never cross the buffer's gRPC hop.

    .venv/bin/python benchmarks/replay_buffer_bench.py                       # defaults below, writes the JSON
    .venv/bin/python benchmarks/replay_buffer_bench.py --appendfsync everysec,always --groups 2000
    .venv/bin/python benchmarks/replay_buffer_bench.py --tokens 32768 --groups 60 --pin 1,1,0   # agent-mode payload

Payload: a realistic ScoredGroup, 8 samples x 2048 response tokens with per-token log-probs and versions, a
1024-token prompt (~135 KB serialized). Both pipelines run `--submitters` concurrent producers (rollout workers) and
one consumer taking `--batch` groups per call (the trainer); end-to-end latency is per group, from the start of its
payload write/XADD to the return of the Sample + MGET/XREADGROUP that delivered it. Two service variants: `service`
sends pre-serialized bytes and reads group ids off the Sample headers, like the raw pipeline (transport + buffer
only); `service_client_protobuf` also serializes and checks every submitted group and parses every sampled one. Both
go through the fleet's client, `buffer_client.BufferClient`, whose submits of concurrent groups (the submitters are
one worker's groups in flight) share SubmitGroups calls. The two ends are in replay_buffer_ends.py. The service runs
as its own process (`grpo-fleet serve replay-buffer`), as in production; the embedded Redis has AOF on. Pipelines
alternate for `--rounds` rounds; the median round is reported. `--pin CLIENT,SERVICE,REDIS` pins each process (all
threads, `taskset -a`) to cores; the load average at start is recorded. On a shared machine the CPU-bound ratio (CPU
ms per group of the busiest process) is the figure load does not move."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replay_buffer_ends import TIMEOUT_S, ServiceEnds, prepare  # noqa: E402

from buffer_client.wire import from_proto_group  # noqa: E402
from fleet.contracts import scored_group  # noqa: E402
from grpofleet.v1 import common_pb2, replay_buffer_pb2  # noqa: E402
from services.replay_buffer.embedded import start_embedded_redis  # noqa: E402


def make_groups(n: int, samples: int, tokens: int, prompt_tokens: int, seed: int = 0) -> list[common_pb2.ScoredGroup]:
    rng = random.Random(seed)
    template = common_pb2.ScoredGroup(
        prompt=common_pb2.PromptGroup(
            target_step=0, env_name="swe", task_id="bench__task-1", num_generations=samples,
            prompt_token_ids=[rng.randrange(151_000) for _ in range(prompt_tokens)],
        ),
        worker_id="bench-worker", min_version=0, max_version=1,
    )  # fmt: skip
    for _ in range(samples):
        t = template.trajectories.add()
        t.response_token_ids.extend(rng.randrange(151_000) for _ in range(tokens))
        t.generation_logprobs.extend(-3 * rng.random() for _ in range(tokens))
        t.token_versions.extend([0] * (tokens // 2) + [1] * (tokens - tokens // 2))  # an in-flight weight update
        t.reward, t.finish_reason = 1.0, "stop"
        t.verdict.status = common_pb2.VERDICT_STATUS_COMPLETED
    groups = []
    for i in range(n):
        g = common_pb2.ScoredGroup()
        g.CopyFrom(template)
        g.prompt.group_id = f"bench-{i}"
        groups.append(g)
    return groups


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(q * len(s)))], 3) if s else 0.0


class CpuMeter:
    """CPU seconds used by this process and by other processes (by pid) over the timed section. Per-group CPU cost
    does not depend on what else the machine runs, unlike throughput on a shared machine."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = self._now()

    def _now(self) -> dict[str, float]:
        out = {"client": time.process_time()}
        for name, pid in self.pids.items():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        return out

    def per_group_ms(self, n: int) -> dict[str, float]:
        end = self._now()
        return {name: round(1000 * (end[name] - self.start[name]) / n, 3) for name in end}


def summary(
    n: int, elapsed: float, e2e: list[float], nbytes: int, cpu: dict[str, float], **ops: list[float]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "groups": n,
        "seconds": round(elapsed, 3),
        "groups_per_s": round(n / elapsed, 1),
        "mb_per_s": round(nbytes / elapsed / 1e6, 1),
        "e2e_latency_ms": {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99)},
    }
    for name, lat in ops.items():
        out[f"{name}_latency_ms"] = {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99)}
    out["cpu_ms_per_group"] = cpu
    # What the busiest process allows when each has a core of its own.
    out["cpu_bound_groups_per_s"] = round(1000 / max(cpu.values()), 1)
    return out


async def run_raw(
    url: str, redis_pid: int, payloads: list[tuple[str, bytes]], submitters: int, batch: int
) -> dict[str, Any]:
    client = Redis.from_url(url)
    stream = f"bench-raw-{time.monotonic_ns()}"
    await client.xgroup_create(stream, "trainer", id="0", mkstream=True)
    started: dict[str, float] = {}
    e2e: list[float] = []
    xadd_lat: list[float] = []

    async def producer(items: list[tuple[str, bytes]]) -> None:
        for gid, data in items:
            t = time.perf_counter()
            started[gid] = t
            await client.xadd(stream, {"gid": gid, "data": data})
            xadd_lat.append(time.perf_counter() - t)

    async def consumer() -> None:
        while len(e2e) < len(payloads):
            reply: Any = await client.xreadgroup("trainer", "t0", {stream: ">"}, count=batch, block=1000)
            now = time.perf_counter()
            # RESP3 answers {stream: [entries]}, RESP2 [[stream, entries]].
            entries: list[Any] = (
                list(reply.values())[0][0] if isinstance(reply, dict) else (reply[0][1] if reply else [])
            )
            for _, fields in entries:
                e2e.append(now - started[fields[b"gid"].decode()])
            if entries:
                await client.xack(stream, "trainer", *[eid for eid, _ in entries])

    meter, t0 = CpuMeter({"redis": redis_pid}), time.perf_counter()
    await asyncio.gather(consumer(), *(producer(payloads[i::submitters]) for i in range(submitters)))
    elapsed = time.perf_counter() - t0
    cpu = meter.per_group_ms(len(payloads))
    await client.delete(stream)
    await client.aclose()
    return summary(len(payloads), elapsed, e2e, sum(len(d) for _, d in payloads), cpu, xadd=xadd_lat)


PINS: dict[str, str] = {}  # "client" | "service" | "redis" -> core list, from --pin


def pin(role: str, pid: int) -> None:  # all threads of `pid` onto the cores given for `role`, if any
    if role in PINS:
        subprocess.run(["taskset", "-a", "-p", "-c", PINS[role], str(pid)], check=True, capture_output=True)


def start_service(url: str, prefix: str, run_dir: Path) -> tuple[subprocess.Popen[str], str]:
    overrides = [
        f"redis.url={url}", f"redis.key_prefix={prefix}", "services.replay_buffer.port=0", f"run.dir={run_dir}",
        "grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1000000",
        "loss_fn.use_importance_sampling_correction=true",
    ]  # fmt: skip
    # Started under taskset so that every thread it creates inherits the pin.
    prefix_cmd = ["taskset", "-c", PINS["service"]] if "service" in PINS else []
    proc = subprocess.Popen(
        [*prefix_cmd, sys.executable, "-m", "launch.cli", "serve", "replay-buffer", *overrides],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on (\S+:\d+)", line)
        if m:
            # Keep draining the log, or a full pipe would block the service.
            threading.Thread(target=lambda: [sys.stderr.write(x) for x in proc.stderr or ()], daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError(f"replay buffer exited with {proc.wait()} before listening")


async def run_service(
    address: str,
    url: str,
    prefix: str,
    pids: dict[str, int],
    groups: list[common_pb2.ScoredGroup],
    submitters: int,
    batch: int,
    client_protobuf: bool,
) -> dict[str, Any]:
    """With `client_protobuf` False the client writes pre-serialized bytes and reads group ids off the Sample headers,
    like the raw pipeline, which sends and receives bytes: the comparison is then transport + buffer only. With True
    it is `BufferClient` (serialize every submit, parse every sampled group) as the fleet's workers and trainer are."""
    ends = ServiceEnds(address, url, prefix, client_protobuf)
    leased = await prepare(ends.stub, groups)
    epoch = (await ends.stub.Stats(replay_buffer_pb2.StatsRequest(), timeout=TIMEOUT_S)).epoch
    # Protobuf clients convert and serialize each group when they submit it (timed: the client takes the plain
    # ScoredGroup a worker makes); bytes ones send pre-serialized groups.
    items = [(g.prompt.group_id, (lease_id, from_proto_group(g) if client_protobuf else scored_group.encode(g)))
             for lease_id, g in leased]  # fmt: skip
    nbytes = sum(g.ByteSize() for _, g in leased)
    started: dict[str, float] = {}
    e2e: list[float] = []
    submit_lat: list[float] = []
    sample_lat: list[float] = []

    async def submitter(mine: list[tuple[str, Any]]) -> None:
        for gid, item in mine:
            t = time.perf_counter()
            started[gid] = t
            await ends.submit(item)
            submit_lat.append(time.perf_counter() - t)

    async def sampler() -> None:
        step = 0
        while len(e2e) < len(leased):
            t = time.perf_counter()
            want = min(batch, len(leased) - len(e2e))  # the last step takes the remainder, without waiting
            ids = await ends.sample(step, want)
            now = time.perf_counter()
            sample_lat.append(now - t)
            e2e.extend(now - started[gid] for gid in ids)
            if step % 10 == 9:  # the trainer commits after each checkpoint; this bounds Redis memory here too
                await ends.stub.CommitStep(replay_buffer_pb2.CommitStepRequest(step=step, epoch=epoch),
                                           timeout=TIMEOUT_S)
            step += 1

    meter, t0 = CpuMeter(pids), time.perf_counter()
    await asyncio.gather(sampler(), *(submitter(items[i::submitters]) for i in range(submitters)))
    elapsed = time.perf_counter() - t0
    cpu = meter.per_group_ms(len(leased))
    await ends.close()
    return summary(len(leased), elapsed, e2e, nbytes, cpu, submit=submit_lat, sample_mget=sample_lat)


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rounds, key=lambda r: r["groups_per_s"])[len(rounds) // 2]


async def _service_round(
    url: str, redis_pid: int, workdir: Path, prefix: str, args: argparse.Namespace, seed: int, pb: bool
) -> Any:
    groups = make_groups(args.groups, args.samples, args.tokens, args.prompt_tokens, seed=seed)
    for g in groups:
        g.prompt.group_id += f"-{prefix}"
    proc, address = start_service(url, prefix, workdir / "run")
    try:
        pids = {"server": proc.pid, "redis": redis_pid}
        return await run_service(address, url, prefix, pids, groups, args.submitters, args.batch, client_protobuf=pb)
    finally:
        proc.terminate()
        proc.wait(30)
        await _flush(url, prefix)


async def bench_one(args: argparse.Namespace, appendfsync: str, workdir: Path) -> dict[str, Any]:
    url, redis = start_embedded_redis(workdir / f"redis-{appendfsync}", appendfsync=appendfsync)
    pin("redis", redis.pid)
    rounds: dict[str, list[dict[str, Any]]] = {"raw_redis": [], "service": [], "service_client_protobuf": []}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up every pipeline and is not reported
            groups = make_groups(args.groups, args.samples, args.tokens, args.prompt_tokens, seed=r)
            payloads = [(f"raw-{r}-{i}", g.SerializeToString()) for i, g in enumerate(groups)]
            raw = await run_raw(url, redis.pid, payloads, args.submitters, args.batch)
            svc = await _service_round(url, redis.pid, workdir, f"bench{r}a", args, r, pb=False)
            svc_pb = await _service_round(url, redis.pid, workdir, f"bench{r}b", args, r, pb=True)
            print(
                f"[{appendfsync}] round {r}: raw {raw['groups_per_s']} groups/s, service {svc['groups_per_s']}, "
                f"service+client protobuf {svc_pb['groups_per_s']}",
                flush=True,
            )
            if r:
                for name, res in (("raw_redis", raw), ("service", svc), ("service_client_protobuf", svc_pb)):
                    rounds[name].append(res)
    finally:
        redis.stop()
    out: dict[str, Any] = {name: median_round(rs) for name, rs in rounds.items()}
    base = out["raw_redis"]["groups_per_s"]
    out["ratio"] = round(out["service"]["groups_per_s"] / base, 3)
    out["ratio_client_protobuf"] = round(out["service_client_protobuf"]["groups_per_s"] / base, 3)
    out["all_rounds_groups_per_s"] = {name: [x["groups_per_s"] for x in rs] for name, rs in rounds.items()}
    # Raw and service run back to back within a round, so a round's ratio sees the same machine load: on a shared
    # machine the median of per-round ratios is the steadier figure.
    paired = [
        s["groups_per_s"] / r["groups_per_s"] for r, s in zip(rounds["raw_redis"], rounds["service"], strict=True)
    ]
    out["ratio_per_round"] = [round(x, 3) for x in paired]
    out["ratio_median_of_rounds"] = round(statistics.median(paired), 3)
    raw, svc = out["raw_redis"], out["service"]
    out["cpu_bound_ratio"] = round(svc["cpu_bound_groups_per_s"] / raw["cpu_bound_groups_per_s"], 3)
    # Targets of issue 20: p99 end-to-end latency within 1.5x raw, CPU per group (all processes) within 2x raw.
    out["p99_latency_ratio"] = round(svc["e2e_latency_ms"]["p99"] / raw["e2e_latency_ms"]["p99"], 3)
    out["cpu_per_group_ratio"] = round(sum(svc["cpu_ms_per_group"].values()) / sum(raw["cpu_ms_per_group"].values()), 3)
    return out


async def _flush(url: str, prefix: str) -> None:
    client = Redis.from_url(url)
    keys = [k async for k in client.scan_iter(match=f"{{{prefix}}}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=1500, help="groups per round and pipeline")
    p.add_argument("--samples", type=int, default=8, help="trajectories per group")
    p.add_argument("--tokens", type=int, default=2048, help="response tokens per trajectory")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--submitters", type=int, default=8, help="concurrent producers (rollout workers)")
    p.add_argument("--batch", type=int, default=16, help="groups per Sample / XREADGROUP (num_prompts_per_step)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--appendfsync", default="everysec", help="comma-separated: everysec,always")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "replay_buffer.json"))
    p.add_argument("--pin", default="", help="CLIENT,SERVICE,REDIS core lists for taskset, e.g. 1,1,0 (default: none)")
    args = p.parse_args()
    load_at_start = os.getloadavg()
    if args.pin:
        PINS.update(zip(("client", "service", "redis"), args.pin.split(","), strict=True))
        pin("client", os.getpid())
    payload_bytes = make_groups(1, args.samples, args.tokens, args.prompt_tokens)[0].ByteSize()
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_average_at_start": load_at_start, "pinned_cores": PINS},
        "payload": {"samples": args.samples, "tokens": args.tokens, "prompt_tokens": args.prompt_tokens,
                    "bytes": payload_bytes},
        "submitters": args.submitters, "batch": args.batch, "groups_per_round": args.groups, "rounds": args.rounds,
        "target_ratio": 0.8 if args.tokens >= 32768 else 0.7, "results": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rb-bench-") as tmp:
        for mode in args.appendfsync.split(","):
            results["results"][f"appendfsync_{mode}"] = asyncio.run(bench_one(args, mode, Path(tmp)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    for mode, r in results["results"].items():
        raw, svc = r["raw_redis"], r["service"]
        print(
            f"{mode}: raw {raw['groups_per_s']} groups/s (e2e p50 {raw['e2e_latency_ms']['p50']} ms, p99 "
            f"{raw['e2e_latency_ms']['p99']} ms); service {svc['groups_per_s']} groups/s (e2e p50 "
            f"{svc['e2e_latency_ms']['p50']} ms, p99 {svc['e2e_latency_ms']['p99']} ms); ratio {r['ratio']} "
            f"(median of per-round ratios {r['ratio_median_of_rounds']}, CPU-bound ratio {r['cpu_bound_ratio']}, "
            f"p99 ratio {r['p99_latency_ratio']}, CPU per group ratio {r['cpu_per_group_ratio']})"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
