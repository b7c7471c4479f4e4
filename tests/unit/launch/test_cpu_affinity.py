"""`cluster.cpu_affinity`: the launcher pins each role's processes (and their children) to the configured cores."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

from fleet.config import ConfigError, parse_config
from launch.supervisor import Supervisor
from launch.topology import Ports, ProcessSpec, check_cpu_affinity, cpu_host_env, fleet_processes


def _cfg(affinity: dict[str, list[int]]):
    return parse_config({"cluster": {"cpu_affinity": affinity}})


def test_each_role_gets_its_configured_cores() -> None:
    cfg = _cfg({"trainer": [0], "rollout": [1]})
    specs = fleet_processes(cfg, None, [], Ports(1, 2, 3, [4, 5]), "redis://x")
    cpus = {s.name: s.cpus for s in specs}
    assert cpus == {"replay-buffer": None, "sandbox": None, "rollout-0": [1], "rollout-1": [1], "trainer": [0]}


def test_a_core_this_machine_lacks_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.cpu_affinity\.trainer: cores \[4096\]"):
        check_cpu_affinity(_cfg({"trainer": [0, 4096]}).cluster, {0, 1})


@pytest.mark.parametrize("bad", [{"trainer": []}, {"trainer": [-1]}, {"gpu": [0]}])
def test_malformed_affinity_is_a_config_error(bad: dict) -> None:
    with pytest.raises(ConfigError, match="cluster.cpu_affinity"):
        _cfg(bad)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell pinned from unpinned")
def test_a_pinned_process_and_its_children_run_only_on_their_cores(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    # The child reports its own affinity and its child's: pinning must be inherited (torchrun ranks, vLLM core).
    code = ("import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), subprocess.run([sys.executable, '-c',"
            " 'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout.strip())")
    spec = ProcessSpec("probe", "trainer", [sys.executable, "-c", code], restartable=False, cpus=[core])
    sup = Supervisor([spec], tmp_path, cwd=tmp_path, echo=False)

    async def run() -> None:
        proc = await sup._spawn(spec)
        await proc.wait()
        await asyncio.gather(*sup._pumps)

    asyncio.run(run())
    assert (tmp_path / "probe.log").read_text().split("\n")[0].endswith(f"[{core}] [{core}]")


def test_on_a_cpu_host_every_process_gets_sleeping_openmp_threads_unless_the_user_chose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    specs = fleet_processes(_cfg({}), None, [], Ports(1, 2, 3, [4]), "redis://x")
    assert all(s.env.get("OMP_WAIT_POLICY") == "PASSIVE" for s in specs), [s.env for s in specs]
    assert cpu_host_env(_cfg({}).cluster, {"OMP_WAIT_POLICY": "ACTIVE"}) == {}
    assert cpu_host_env(parse_config({"cluster": {"gpus_per_node": 1}}).cluster, {}) == {}
