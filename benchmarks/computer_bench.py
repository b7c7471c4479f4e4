"""Computer sessions: session start time, screenshot latency per action (p50/p99) and PNG bytes per screenshot,
through the whole path a rollout takes: `ComputerClient` -> HTTP -> executor -> Chromium in bwrap -> PNG.

    .venv/bin/python benchmarks/computer_bench.py                 # 12 episodes (3 per family), 224x224
    .venv/bin/python benchmarks/computer_bench.py --episodes 24 --viewport 280x168

Each episode opens a session (a fresh browser: start + page load + first screenshot), plays the task's reference
solution (`PageTask.solution`, read off the page by a separate bench-side browser) plus two harmless actions (a
Tab and a zero scroll, so every family has actions of each kind), and finishes; episodes run one after another
(the per-action figures are latencies, not throughput). Writes `benchmarks/results/computer.json`, the plot
`docs/img/computer_bench.png` and an episode strip `docs/img/computer_use_episode.png` (docs/computer-use.md).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the checkout, not whatever the editable install maps

from envs.computer_use.actions import Action, Key, Scroll, action_from_json  # noqa: E402
from envs.computer_use.env import ComputerUseEnvironment, make_computer_tasks  # noqa: E402
from envs.computer_use.tasks import FAMILIES, make_tasks  # noqa: E402
from fleet.config.env import ComputerUseEnvConfig  # noqa: E402
from fleet.config.infra import SandboxConfig  # noqa: E402
from sandbox_client.computer import ComputerClient  # noqa: E402
from services.sandbox.computer.renderer import Renderer, RendererSpec, find_chromium  # noqa: E402
from services.sandbox.server import SandboxServer  # noqa: E402

RESULT = ROOT / "benchmarks/results/computer.json"
PLOT, STRIP = ROOT / "docs/img/computer_bench.png", ROOT / "docs/img/computer_use_episode.png"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def plans(cfg: ComputerUseEnvConfig, n: int) -> list[list[Action]]:
    """The reference solution of each task, read off its page by a bench-side browser."""
    w, h = cfg.viewport
    pages = make_tasks(0, "validation", n, tuple(cfg.families), (w, h))
    r = await Renderer.launch(RendererSpec(w, h, "bench-planner"), chromium=find_chromium())
    try:
        out = []
        for page in pages:
            await r.load(page.html, limit_s=30)
            out.append([action_from_json(a) for a in await r.evaluate_isolated(page.solution, limit_s=30)])
        return out
    finally:
        await r.close()


async def episodes(url: str, cfg: ComputerUseEnvConfig, n: int) -> dict[str, Any]:
    env = ComputerUseEnvironment(cfg)
    tasks = make_computer_tasks(cfg, 0, "validation", n)
    solutions = await plans(cfg, n)
    client = ComputerClient([url], owner="computer-bench")
    starts, acts, server_acts, sizes, verdicts, strips = [], [], [], [], [], {}
    try:
        for task, plan in zip(tasks, solutions, strict=True):
            t0 = time.monotonic()
            session = await client.open(env.task_to_payload(task))
            starts.append(time.monotonic() - t0)
            shots = [session.first]
            for action in [Key("Tab"), Scroll(0, 0), *plan] if task.metadata["family"] != "type_submit" \
                    else [Scroll(0, 0), *plan, Key("Tab")]:  # Tab first would move the focus off the field
                t1 = time.monotonic()
                shot = await session.act(action)
                acts.append(time.monotonic() - t1)
                server_acts.append(shot.elapsed_s)
                shots.append(shot)
            sizes += [len(s.png) for s in shots]
            verdict = await session.finish()
            verdicts.append(verdict.passed)
            strips.setdefault(task.metadata["family"], (task.problem_statement, plan, [s.png for s in shots]))
    finally:
        await client.close()
    return {"starts": starts, "acts": acts, "server_acts": server_acts, "sizes": sizes, "passed": verdicts,
            "strips": strips}


def summary(raw: dict[str, Any], viewport: list[int]) -> dict[str, Any]:
    ms = lambda xs: {"p50_ms": round(1000 * pct(xs, 0.5), 1), "p99_ms": round(1000 * pct(xs, 0.99), 1),  # noqa: E731
                     "mean_ms": round(1000 * statistics.fmean(xs), 1), "n": len(xs)}
    return {"viewport": viewport, "episodes": len(raw["starts"]), "session_start": ms(raw["starts"]),
            "action_round_trip": ms(raw["acts"]), "action_in_executor": ms(raw["server_acts"]),
            "png_bytes": {"p50": int(pct(raw["sizes"], 0.5)), "max": max(raw["sizes"]),
                          "mean": round(statistics.fmean(raw["sizes"]))},
            "reference_solutions_passed": f"{sum(raw['passed'])}/{len(raw['passed'])}",
            "host": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2),
                     "python": platform.python_version()}}


def plot(raw: dict[str, Any], result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    for ax, key, title in ((axes[0], "starts", "session start (s)"), (axes[1], "acts", "action + screenshot (ms)")):
        values = sorted(raw[key]) if key == "starts" else sorted(1000 * v for v in raw[key])
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))])
        ax.set_title(title)
        ax.set_ylabel("fraction")
    axes[2].hist([s / 1024 for s in raw["sizes"]], bins=20)
    axes[2].set_title(f"PNG KiB per screenshot ({result['viewport'][0]}x{result['viewport'][1]})")
    fig.tight_layout()
    fig.savefig(PLOT, dpi=90)
    # One episode per family: the first screenshot, then the screenshot after each action of the solution.
    rows = []
    for _instruction, plan, pngs in raw["strips"].values():
        images = [Image.open(io.BytesIO(p)).convert("RGB") for p in pngs[-(len(plan) + 1):]]
        rows.append(images)
    w, h = rows[0][0].size
    strip = Image.new("RGB", (max(len(r) for r in rows) * (w + 8), len(rows) * (h + 8)), "#777")
    for y, images in enumerate(rows):
        for x, im in enumerate(images):
            strip.paste(im, (x * (w + 8), y * (h + 8)))
    strip.save(STRIP)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--viewport", default="224x224")
    args = parser.parse_args()
    viewport = [int(v) for v in args.viewport.split("x")]
    cfg = ComputerUseEnvConfig(viewport=viewport, max_actions=16, families=list(FAMILIES))
    with tempfile.TemporaryDirectory() as work:
        server = SandboxServer(SandboxConfig(pool_size=1, work_root=work))
        await server.start()
        try:
            raw = await episodes(f"http://127.0.0.1:{server.port}", cfg, args.episodes)
        finally:
            await server.stop(0)
    result = summary(raw, viewport)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    plot(raw, result)
    print(json.dumps(result, indent=2))
    print("episode strip:", [(i, [a.to_json() for a in p]) for i, p, _ in raw["strips"].values()])


if __name__ == "__main__":
    asyncio.run(main())
