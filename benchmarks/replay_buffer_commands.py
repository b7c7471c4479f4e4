"""Redis commands per group on each path of the replay buffer (issue 20): `INFO commandstats` deltas around each
phase of N groups driven through the service (`grpo-fleet serve replay-buffer`) and the fleet's client, as in
benchmarks/replay_buffer_bench.py. Commands run inside a Lua script are counted by name (and the script call itself
as `evalsha`), so the table shows what the scripts cost as well as the round trips.

    .venv/bin/python benchmarks/replay_buffer_commands.py --groups 64 [--tokens 256]

Phases: enqueue + lease (EnqueuePrompts, LeasePrompts), submit (payload SET + SubmitGroups, 8 concurrent submitters,
as a worker's groups in flight), sample (Sample + MGET, 16 per call), commit (CommitStep). The service's background
work (lease reclaim, Redis watch) runs meanwhile and is counted where it falls; `--idle-s` measures it alone."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replay_buffer_bench import make_groups, start_service  # noqa: E402
from replay_buffer_ends import TIMEOUT_S, ServiceEnds, prepare  # noqa: E402

from fleet.contracts import scored_group  # noqa: E402
from grpofleet.v1 import replay_buffer_pb2  # noqa: E402
from services.replay_buffer.embedded import start_embedded_redis  # noqa: E402


async def _counts(r: Redis) -> dict[str, int]:
    info: Any = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


def _delta(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    names = sorted(set(after) - {"info"}, key=lambda k: -(after[k] - before.get(k, 0)))
    out = {k: round((after[k] - before.get(k, 0)) / n, 3) for k in names if after[k] != before.get(k, 0)}
    out["total"] = round(sum(out.values()), 3)
    return out


async def measure(url: str, address: str, prefix: str, n: int, batch: int, idle_s: float) -> dict[str, Any]:
    r = Redis.from_url(url)
    ends = ServiceEnds(address, url, prefix, client_protobuf=False)
    groups = make_groups(n, 8, ARGS.tokens, 256)
    out: dict[str, Any] = {}
    c = await _counts(r)
    await asyncio.sleep(idle_s)
    c2 = await _counts(r)
    out["idle (per second)"] = _delta(c, c2, max(1, round(idle_s)))
    leased = await prepare(ends.stub, groups)
    c3 = await _counts(r)
    out["enqueue + lease"] = _delta(c2, c3, n)
    items = [(lease_id, scored_group.encode(g)) for lease_id, g in leased]
    await asyncio.gather(*(_submit_all(ends, items[i::8]) for i in range(8)))
    c4 = await _counts(r)
    out["submit"] = _delta(c3, c4, n)
    got = 0
    for step in range(n // batch + 1):
        got += len(await ends.sample(step, min(batch, n - got))) if got < n else 0
    c5 = await _counts(r)
    out["sample"] = _delta(c4, c5, n)
    req = replay_buffer_pb2.CommitStepRequest(step=n // batch + 1, epoch=1)
    await ends.stub.CommitStep(req, timeout=TIMEOUT_S)
    out["commit"] = _delta(c5, await _counts(r), n)
    await ends.close()
    await r.aclose()
    return out


async def _submit_all(ends: ServiceEnds, items: list[tuple[str, Any]]) -> None:
    for item in items:
        await ends.submit(item)


ARGS = argparse.Namespace()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=64)
    p.add_argument("--tokens", type=int, default=256, help="response tokens per trajectory")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--idle-s", type=float, default=2.0)
    p.add_argument("--out", default="")
    p.parse_args(namespace=ARGS)
    with tempfile.TemporaryDirectory(prefix="rb-cmds-") as tmp:
        url, redis = start_embedded_redis(Path(tmp) / "redis", appendfsync="everysec")
        proc, address = start_service(url, "cmds", Path(tmp) / "run")
        try:
            res = asyncio.run(measure(url, address, "cmds", ARGS.groups, ARGS.batch, ARGS.idle_s))
        finally:
            proc.terminate()
            proc.wait(30)
            redis.stop()
    text = json.dumps({"groups": ARGS.groups, "per_group": res}, indent=2)
    print(text)
    if ARGS.out:
        Path(ARGS.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
