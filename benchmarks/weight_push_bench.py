"""Weight push end to end: the trainer's gRPC push to real rollout-worker servers, against a loopback socket copy.

Run: `python benchmarks/weight_push_bench.py [--sizes tiny,50m,0.5b] [--backends hf,vllm] [--workers 1,2]
[--transports tcp,grpc] [--skip vllm:0.5b:2] [--gen-duration 10]`. Writes `benchmarks/results/weight_push.json`
(rows merged by (transport, backend, size, workers), so runs of a few configurations update it) and, where
matplotlib is installed, `benchmarks/results/weight_push.png`.

What runs, per (backend, size, number of workers):
- Workers: one process each (`python benchmarks/weight_push_bench.py worker ...`), serving the real
  `grpofleet.v1.RolloutWorker` servicer (`rollout.servicer`, behind `services.runtime.server.GrpcService`, i.e. the
  production interceptors and channel options) over a real `rollout.worker.RolloutWorker` and engine
  (`engine_bench.make`; backend `vllm-plain`: the same vLLM engine with `cpu_weight_layout="plain"`), in-flight
  updates on (`grpo.async_grpo.in_flight_weight_updates`). What is left out: the
  lease loop, scoring and the replay buffer; the worker's post-load heartbeat to the buffer goes to a stub.
- Push: the trainer's own code, `trainer.weights.WeightPusher.publish` over `weightsync.tcp.TcpSender` (header over
  gRPC, bytes over one TCP stream per worker, received into the engine's staging memory) or
  `weightsync.grpc.GrpcSender` (4 MiB slices), all workers concurrently. `push_s` is the wall time from the
  `publish()` call until every worker's `GetStatus` reports the pushed version. The first push of a run (a warm-up)
  is not counted; `push_s` is the median of the rest.
- Loopback: in the same run, `bytes` (model bytes x workers) sent over one plain TCP socket on 127.0.0.1 from this
  process to a receiver process that `recv_into`s a preallocated buffer (best of 3): the floor the issue's target
  is stated against (`push_s <= 1.5 x bytes / loopback bandwidth`).
- Generation (one worker only): `engine_bench.throughput` runs inside the worker process (4 clients of 32-token
  answers, no pushes of its own) for `--gen-duration` s, once alone and once while this process pushes through
  gRPC every `--step-s` seconds after the previous push returned (a "training step" of that length, then a
  push). `pause_s` per push is what the worker reported (`PushWeightsResponse.pause_s`: generation stood still
  from pause to resume).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

log = logging.getLogger("weight_push_bench")
RESULTS = ROOT / "benchmarks" / "results" / "weight_push.json"
EPOCH = 1


def worker_config(model: Path) -> Any:
    from fleet.config import parse_config

    return parse_config({}, [
        f"policy.model_name={model}", "policy.precision=float32", "grpo.async_grpo.enabled=true",
        "grpo.async_grpo.in_flight_weight_updates=true", "loss_fn.use_importance_sampling_correction=true",
        "services.rollout.host=127.0.0.1", "services.rollout.port=0",
    ])  # fmt: skip


# -- worker process ---------------------------------------------------------------------------------------------
class _NoBuffer:
    """The replay-buffer client the worker tells about a new version right after loading; not measured here."""

    async def heartbeat(self, info: Any) -> None:
        return None


async def worker_main(args: argparse.Namespace) -> None:
    import engine_bench

    from grpofleet.v1 import rollout_worker_pb2_grpc
    from rollout.servicer import RolloutWorkerServicer
    from rollout.worker import RolloutWorker
    from services.runtime.server import GrpcService

    proto = os.fdopen(args.proto_fd, "w", buffering=1)  # not stdout: vLLM logs there

    def say(**kw: Any) -> None:
        proto.write(json.dumps(kw) + "\n")

    path = Path(args.model)
    cfg = worker_config(path)
    if args.backend == "vllm-plain":  # engine_bench.make's vLLM engine, GEMM weights unpacked
        from fleet.config.policy import VllmConfig
        from rollout.engine.vllm_engine import VllmEngine

        engine = VllmEngine(path, VllmConfig(max_num_seqs=16, cpu_kvcache_space_gb=1.0, cpu_weight_layout="plain"),
                            max_model_len=1024)
    else:
        engine = engine_bench.make(args.backend, path)
    await engine.start()
    service = GrpcService("rollout", cfg.services.rollout, cfg.services)
    port = service.bind()
    worker = RolloutWorker(cfg, args.worker_id, f"127.0.0.1:{port}", engine, None, _NoBuffer(), None)  # type: ignore[arg-type]
    service.add(rollout_worker_pb2_grpc.add_RolloutWorkerServicer_to_server,
                RolloutWorkerServicer(worker, args.backend), "grpofleet.v1.RolloutWorker")
    await service.start()
    await service.set_serving(True)
    say(port=port, pid=os.getpid())
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or json.loads(line)["cmd"] == "quit":
                break
            cmd = json.loads(line)
            u0, p0 = worker.stats.weight_updates, worker.stats.total_pause_s
            out = await engine_bench.throughput(engine, {}, duration=cmd["duration"], push_every=None,
                                                concurrency=cmd["concurrency"], max_new=cmd["max_new"])
            out["updates"] = worker.stats.weight_updates - u0
            out["pause_s_total"] = worker.stats.total_pause_s - p0
            say(**out)
    finally:
        await service.stop(0)
        await engine.stop()


class WorkerProc:
    def __init__(self, backend: str, model: Path, worker_id: str, log_path: Path) -> None:
        r, w = os.pipe()
        self.log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "worker", "--backend", backend, "--model", str(model), "--worker-id", worker_id,
             "--proto-fd", str(w)],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(w,), cwd=ROOT,
        )  # fmt: skip
        os.close(w)
        self.answers = os.fdopen(r, "r")
        self.worker_id = worker_id
        self.address = ""

    async def read(self) -> dict[str, Any]:
        line = await asyncio.to_thread(self.answers.readline)
        if not line:
            raise RuntimeError(f"worker {self.worker_id} exited (rc={self.proc.poll()}); see its log")
        return json.loads(line)

    async def ready(self) -> None:
        self.address = f"127.0.0.1:{(await self.read())['port']}"

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.send(cmd="quit")
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# -- loopback floor ---------------------------------------------------------------------------------------------
RECEIVER = r"""
import socket, sys
n = int(sys.argv[1]); chunk = 4 << 20
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
buf = bytearray(n); view = memoryview(buf)
while True:
    conn, _ = srv.accept()
    if conn.recv(1) != b"g":
        break
    got = 0
    while got < n:
        got += conn.recv_into(view[got:got + chunk])
    conn.sendall(b"k"); conn.close()
"""


def loopback_gbps(nbytes: int, repeats: int = 3) -> dict[str, Any]:
    """Bytes/s of a plain TCP copy of `nbytes` over 127.0.0.1 to another process (receiver preallocated), best of
    `repeats`, timed from connect to the receiver's acknowledgement of the last byte."""
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER, str(nbytes)], stdout=subprocess.PIPE)
    assert rx.stdout is not None
    port = int(rx.stdout.readline())
    payload = memoryview(bytearray(os.urandom(1 << 20)) * max(1, -(-nbytes // (1 << 20))))[:nbytes]
    times = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"g")
                s.sendall(payload)
                assert s.recv(1) == b"k"
            times.append(time.perf_counter() - t0)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"q")
    finally:
        rx.wait(10)
    best = min(times)
    return {"loopback_s_best": best, "loopback_s_all": [round(t, 4) for t in times],
            "loopback_GBps": nbytes / best / 1e9}


# -- driver -----------------------------------------------------------------------------------------------------
async def push_once(pusher: Any, tensors: dict[str, torch.Tensor], version: int, workers: list[WorkerProc],
                    stubs: list[Any]) -> dict[str, Any]:  # fmt: skip
    """One trainer push; wall time from the call until every worker's GetStatus reports `version`."""
    from fleet.contracts.weights import WeightsId
    from grpofleet.v1 import rollout_worker_pb2
    from weightsync.header import WeightSnapshot

    snap = WeightSnapshot(WeightsId(EPOCH, version), tensors)
    t0 = time.perf_counter()
    results = await pusher.publish(snap)
    t_answered = time.perf_counter() - t0
    for r in results:
        if not r.ok:
            raise RuntimeError(f"push v{version} to {r.worker_id} failed: {r.error}")
    pending = set(range(len(stubs)))
    while pending:
        for i in list(pending):
            st = await stubs[i].GetStatus(rollout_worker_pb2.WorkerStatusRequest(), timeout=30)
            if (st.weight_epoch, st.weight_version) == (EPOCH, version):
                pending.discard(i)
        if pending:
            await asyncio.sleep(0.005)
    return {
        "push_s": time.perf_counter() - t0, "answered_s": t_answered,
        "receive_s": [r.receive_s for r in results], "pause_s": [r.pause_s for r in results],
        "load_s": [r.load_s for r in results], "call_s": [r.seconds for r in results],
    }  # fmt: skip


async def bench_config(transport_name: str, backend: str, size: str, n_workers: int,
                       args: argparse.Namespace) -> dict[str, Any]:
    import engine_bench
    from safetensors.torch import load_file

    from fleet.config.policy import GrpcWeightSyncConfig
    from fleet.contracts.weights import WorkerRef
    from grpofleet.v1 import rollout_worker_pb2_grpc
    from services.runtime.client import make_channel
    from trainer.weights import WeightPusher
    from weightsync.base import WeightSender
    from weightsync.grpc import GrpcSender
    from weightsync.tcp import TcpSender

    path = engine_bench.model_for(size)
    base = load_file(path / "model.safetensors")
    model_bytes = sum(t.numel() * t.element_size() for t in base.values())
    log.info("%s %s %s x%d: %.1f MB per worker", transport_name, backend, size, n_workers, model_bytes / 1e6)
    logs = RESULTS.parent / "weight_push_logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    workers = [WorkerProc(backend, path, f"{backend}-{size}-{i}", logs / f"{backend}-{size}-{n_workers}-{i}.log")
               for i in range(n_workers)]  # fmt: skip
    cfg = worker_config(path)
    transport: WeightSender = (TcpSender(cfg.policy.weight_sync, cfg.services) if transport_name == "tcp"
                               else GrpcSender(GrpcWeightSyncConfig(), cfg.services))
    row: dict[str, Any] = {"transport": transport_name, "backend": backend, "size": size, "workers": n_workers,
                           "model_bytes": model_bytes,
                           "bytes": model_bytes * n_workers, "params": sum(t.numel() for t in base.values())}
    try:
        for w in workers:
            await w.ready()
        row["workers_start_s"] = time.perf_counter() - t0
        refs = [WorkerRef(w.worker_id, w.address) for w in workers]

        async def list_workers() -> list[WorkerRef]:
            return refs

        pusher = WeightPusher(cfg.policy.weight_sync.join_poll_s, list_workers, transport, transport)
        channels = [make_channel(w.address, cfg.services) for w in workers]
        stubs = [rollout_worker_pb2_grpc.RolloutWorkerStub(c) for c in channels]
        # Distinct values per push (the engines must really load them); made before timing, like a trainer's snapshot.
        # Both in anonymous memory, like `gather_snapshot`'s copies (`load_file`'s tensors map the file: the first
        # push that reads them would also time the page cache).
        variants = [{k: v.clone() for k, v in base.items()}, {k: v + 0.01 for k, v in base.items()}]
        repeats = args.repeats_big if size == "0.5b" else args.repeats
        version = 0
        warm = await push_once(pusher, variants[1], version := version + 1, workers, stubs)
        pushes = []
        for i in range(repeats):
            pushes.append(await push_once(pusher, variants[i % 2], version := version + 1, workers, stubs))
        row["warmup_push_s"] = warm["push_s"]
        row["pushes"] = pushes
        row["push_s_median"] = statistics.median(p["push_s"] for p in pushes)
        row["pause_s_median"] = statistics.median(x for p in pushes for x in p["pause_s"])
        row["receive_s_median"] = statistics.median(x for p in pushes for x in p["receive_s"])
        row["load_s_median"] = statistics.median(x for p in pushes for x in p["load_s"])
        row |= loopback_gbps(row["bytes"])
        row["push_over_loopback"] = row["push_s_median"] / (row["bytes"] / (row["loopback_GBps"] * 1e9))
        row["meets_1_5x"] = row["push_over_loopback"] <= 1.5
        if n_workers == 1 and args.gen_duration > 0 and f"{backend}:{size}" not in args.no_gen.split(","):
            # Short answers: `throughput` lets every client finish the request it is in, so long ones on a slow
            # model would stretch each run far past its duration.
            gen = dict(duration=args.gen_duration, concurrency=args.gen_concurrency, max_new=args.gen_max_new)
            w = workers[0]
            w.send(cmd="gen", **gen)
            row["gen_no_push"] = await w.read()
            w.send(cmd="gen", **gen)
            stop_at = time.monotonic() + args.gen_duration
            during = []
            while time.monotonic() + args.step_s < stop_at:
                await asyncio.sleep(args.step_s)  # the training step
                during.append(await push_once(pusher, variants[version % 2], version := version + 1, workers, stubs))
            row["gen_push"] = await w.read()
            row["gen_push"]["step_s"] = args.step_s
            row["gen_push"]["pushes"] = len(during)
            row["gen_push"]["pause_s_per_push"] = [p["pause_s"][0] for p in during]
            row["gen_push"]["push_s_per_push"] = [p["push_s"] for p in during]
            row["gen_push_slowdown"] = 1 - row["gen_push"]["tokens_per_s"] / row["gen_no_push"]["tokens_per_s"]
        for c in channels:
            await c.close()
    finally:
        await transport.close()
        for w in workers:
            w.stop()
    row["loadavg_1m_at_end"] = os.getloadavg()[0]
    log.info("%s", json.dumps({k: v for k, v in row.items() if k != "pushes"}, indent=1))
    return row


def write_results(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    key = lambda r: (r.get("transport", "grpc"), r["backend"], r["size"], r["workers"])  # noqa: E731
    results = Path(args.results)
    previous = json.loads(results.read_text())["results"] if results.is_file() else []
    fresh = {key(r) for r in rows}
    merged = [r for r in previous if key(r) not in fresh] + rows
    env = {
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "dtype": "float32", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "chunk_mb": 4.0,
        "note": "rows without 'transport' are grpc rows from an earlier run (see docs/performance.md)",
        "gen_duration_s": args.gen_duration, "step_s": args.step_s, "gen_concurrency": args.gen_concurrency,
        "gen_max_new": args.gen_max_new, "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }  # fmt: skip
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"env": env, "results": merged}, indent=2) + "\n")
    plot(merged, results.with_suffix(".png"))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = sorted({(r.get("transport", "grpc"), r["backend"], r["workers"]) for r in rows})
    for (transport, backend, n), marker in zip(series, "osD^v<>ph*Xd", strict=False):
        pts = sorted((r["bytes"], r["push_s_median"]) for r in rows
                     if (r.get("transport", "grpc"), r["backend"], r["workers"]) == (transport, backend, n))
        ax.plot([p[0] / 1e9 for p in pts], [p[1] for p in pts], marker=marker,
                linestyle="-" if transport == "tcp" else ":", label=f"{transport}: {backend}, {n} worker(s)")
    lb = sorted((r["bytes"], r["bytes"] / r["loopback_GBps"] / 1e9) for r in rows)
    ax.plot([p[0] / 1e9 for p in lb], [1.5 * p[1] for p in lb], "k--", label="1.5 x bytes / loopback (target)")
    ax.set(xscale="log", yscale="log", xlabel="bytes pushed (GB, all workers)", ylabel="push to served (s)",
           title="Weight push, CPU fp32: trainer call -> every worker serves v")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main(args: argparse.Namespace) -> None:
    skip = set(args.skip.split(",")) if args.skip else set()
    rows: list[dict[str, Any]] = []
    for transport in args.transports.split(","):
        for backend in args.backends.split(","):
            for size in args.sizes.split(","):
                for n in (int(x) for x in args.workers.split(",")):
                    if f"{backend}:{size}:{n}" in skip:
                        continue
                    rows.append(await bench_config(transport, backend, size, n, args))
                    write_results(rows, args)
    print(f"wrote {args.results}")


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from re-running the benchmark
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode")
    wp = sub.add_parser("worker", help="(internal) one rollout-worker server")
    wp.add_argument("--backend", required=True)
    wp.add_argument("--model", required=True)
    wp.add_argument("--worker-id", required=True)
    wp.add_argument("--proto-fd", type=int, required=True, help="pipe to answer the driver on")
    p.add_argument("--sizes", default="tiny,50m,0.5b")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--transports", default="tcp", help="tcp (the default transport) and/or grpc")
    p.add_argument("--results", default=str(RESULTS), help="JSON to merge rows into (the plot goes next to it)")
    p.add_argument("--skip", default="vllm:0.5b:2", help="backend:size:workers triples to leave out, comma-separated")
    p.add_argument("--repeats", type=int, default=4, help="timed pushes per configuration (after one warm-up)")
    p.add_argument("--repeats-big", type=int, default=2, help="timed pushes for 0.5b")
    p.add_argument("--gen-duration", type=float, default=10.0, help="seconds per throughput run (0 = skip)")
    p.add_argument("--gen-concurrency", type=int, default=4, help="requests generating at once")
    p.add_argument("--gen-max-new", type=int, default=32, help="tokens per request")
    p.add_argument("--no-gen", default="hf:0.5b", help="backend:size pairs measured without the generation runs")
    p.add_argument("--step-s", type=float, default=2.0, help="training-step time between pushes during generation")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(worker_main(a) if a.mode == "worker" else main(a))
