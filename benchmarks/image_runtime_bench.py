"""Image tasks: the daemonless runtime (bwrap over a cached, unpacked image) against Docker, in one run.

    .venv/bin/python benchmarks/image_runtime_bench.py                 # 4 instances, 5 rounds
    .venv/bin/python benchmarks/image_runtime_bench.py --instances 8 --rounds 7

Images: small SWE-bench-style instance images (the Debian base of `envs.swe.images` plus a /testbed layer holding a
git repository with a bug and its pytest suite), built here, pushed to Debian's docker-registry on loopback, pulled
by both runtimes from there. Measured, rounds alternating between the runtimes so that other load hits both:
  start    daemonless: a fresh writable layer over the cached rootfs + `true` in bubblewrap + layer removed;
           docker: `docker run --rm --network none IMAGE true` (the image already in the engine)
  eval     one whole task (history check, gold patch through the apply chain, eval script, swebench grading) through
           the executor with `sandbox.runtime` bwrap-image vs docker (create, start, exec, remove: the harness's way)
  disk     the image cache after pulling N instances of the repository (shared files once) vs N full rootfs
  tasks/s  per core: `cores` tasks at a time on the daemonless runtime
Needs root, bwrap, skopeo, umoci, docker-registry and a Docker engine (`scripts/docker-engine.sh start`).
Writes `benchmarks/results/image_runtime.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "images"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "sandbox"))

from image_helpers import ImageSet, local_registry  # noqa: E402
from sandbox_helpers import make_calc_repo  # noqa: E402

from envs.swe.images import OciBuilder, base_tarball, make_testbed  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402
from services.sandbox.executor import Executor  # noqa: E402
from services.sandbox.images.runtime import BwrapImageRuntime  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "image_runtime.json"


def _build(root: Path, registry: str, n: int) -> tuple[ImageSet, list[str]]:
    repo = make_calc_repo(root / "calc")
    builder = OciBuilder(root / "oci")
    builder.base(base_tarball())
    names = []
    for i in range(n):
        tb = root / f"tb{i}"
        make_testbed(repo.path, repo.base, tb)
        (tb / f"instance_{i}.txt").write_text(f"instance {i}\n")  # a distinct instance layer each
        builder.instance(f"calc{i}", tb)
        builder.push(f"calc{i}", f"{registry}/bench/calc{i}:v1")
        names.append(f"bench/calc{i}:v1")
    return ImageSet(registry, repo, names[0], names[0], "", builder), names


async def _start_bwrap(runtime: BwrapImageRuntime, ref: str) -> float:
    t0 = time.perf_counter()
    async with runtime.environment(ref) as env:
        result = await env.exec(["true"], limit_s=60)
        assert result.exit_code == 0, result.stderr.text()
    return time.perf_counter() - t0


def _start_docker(ref: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", ref, "true"], check=True, capture_output=True)
    return time.perf_counter() - t0


async def _eval(ex: Executor, images: ImageSet) -> float:
    t0 = time.perf_counter()
    verdict = await ex.run(images.spec(images.repo.gold))
    assert verdict.resolution == "FULL", verdict.error
    return time.perf_counter() - t0


async def measure(args: argparse.Namespace, root: Path, registry: str) -> dict[str, Any]:
    images, names = _build(root, registry, args.instances)
    cores = os.cpu_count() or 1
    base = SandboxConfig(pool_size=cores, work_root=str(root / "work"), memory_mb=2048, cpu_s=120,
                         image_cache_dir=str(root / "cache" / "images"), image_registry=registry,
                         image_tls_verify=False)
    refs = [f"{registry}/{n}" for n in names]
    for ref in refs:
        await asyncio.to_thread(subprocess.run, ["docker", "pull", "-q", ref], check=True, capture_output=True)
    async with Executor(base) as bw, Executor(base.model_copy(update={"runtime": "docker"})) as dk:
        assert bw.images is not None and dk.images is not None
        runtime = bw.images.runtime
        assert isinstance(runtime, BwrapImageRuntime)
        t0 = time.perf_counter()
        for ref in refs:
            await bw.images.cache.ensure(ref)
        pull_s = time.perf_counter() - t0
        full = sum(_du(bw.images.cache.root / "images" / p.name / "rootfs") for p in bw.images.cache.images())
        starts: dict[str, list[float]] = {"bwrap-image": [], "docker": []}
        evals: dict[str, list[float]] = {"bwrap-image": [], "docker": []}
        for _ in range(args.rounds):
            starts["bwrap-image"].append(await _start_bwrap(runtime, refs[0]))
            starts["docker"].append(await asyncio.to_thread(_start_docker, refs[0]))
            evals["bwrap-image"].append(await _eval(bw, images))
            evals["docker"].append(await _eval(dk, images))
        t0 = time.perf_counter()
        n_tasks = cores * args.tasks_per_core
        await asyncio.gather(*(_eval(bw, images) for _ in range(n_tasks)))
        throughput = n_tasks / (time.perf_counter() - t0)
        cache_bytes = bw.images.cache.size()
    med = {k: {"start_s": statistics.median(starts[k]), "eval_s": statistics.median(evals[k])} for k in starts}
    return {
        "machine": {"cores": cores, "python": platform.python_version(), "kernel": platform.release()},
        "instances": args.instances, "rounds": args.rounds, "median": med,
        "start_ratio_bwrap_over_docker": med["bwrap-image"]["start_s"] / med["docker"]["start_s"],
        "eval_ratio_bwrap_over_docker": med["bwrap-image"]["eval_s"] / med["docker"]["eval_s"],
        "disk": {"cache_bytes": cache_bytes, "full_rootfs_bytes_each_counted": full,
                 "shared_fraction_saved": 1 - cache_bytes / full if full else 0.0},
        "first_pulls_s": pull_s, "tasks_per_s": throughput, "tasks_per_s_per_core": throughput / cores,
        "raw": {"starts": starts, "evals": evals},
    }


def _du(path: Path) -> int:
    """Disk bytes of one rootfs as if alone (every file counted)."""
    return int(subprocess.run(["du", "-s", "-B1", "--count-links", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tasks-per-core", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="image-bench-") as tmp, local_registry(Path(tmp) / "registry") as reg:
        result = asyncio.run(measure(args, Path(tmp), reg.host))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))


if __name__ == "__main__":
    main()
