"""The whole fleet for a few steps on the image path: the task slice's instance images, built by
`grpo-fleet data build --images`, pushed to a registry on loopback, pulled and run by the sandbox executor. The
rollout worker runs the in-process `hf` engine: the image path is the sandbox's, and a vLLM engine's start (about
20 CPU-seconds of imports) would only cost the suite time."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import ROOT, fleet_cmd, metrics

sys.path.insert(0, str(ROOT / "tests" / "integration" / "images"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "sandbox"))

from image_helpers import local_registry  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
_TOOLS = ("bwrap", "skopeo", "umoci", "docker-registry")


@pytest.mark.skipif(any(shutil.which(t) is None for t in _TOOLS), reason=f"needs {', '.join(_TOOLS)}")
def test_fleet_trains_on_image_tasks(task_slice: Path, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(task_slice, tasks)
    cache = tmp_path / "cache" / "images"
    with local_registry(tmp_path / "registry") as reg:
        built = subprocess.run([sys.executable, "-m", "launch.cli", "data", "build", "--images", "--out", str(tasks),
                                "--registry", reg.host, "--insecure-registry"], cwd=ROOT, capture_output=True,
                               text=True, timeout=900)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        assert '"image": "grpo-fleet/sweb.eval.x86_64.' in (tasks / "train.jsonl").read_text()
        run_dir = tmp_path / "run"
        cmd = fleet_cmd(run_dir, tasks, "grpo.async_grpo.enabled=false",
                        "grpo.async_grpo.in_flight_weight_updates=false", "grpo.max_num_steps=2",
                        "policy.generation.backend=hf",
                        f"sandbox.image_registry={reg.host}", "sandbox.image_tls_verify=false",
                        f"sandbox.image_cache_dir={cache}")
        output = tmp_path / "fleet.out"
        with output.open("w") as sink:  # a file, not a pipe: nobody reads it while the test waits for a verdict
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            # The tiny random policy's answers hold no patch (format errors never reach the sandbox), so the
            # fleet's own executor is also given a task's gold patch while the run goes on.
            verdict, health = _gold_through_fleet_executor(run_dir, tasks)
            proc.wait(timeout=1500)
            out = output.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, out[-6000:]
    assert (verdict["status"], verdict["resolution"]) == ("completed", "FULL"), verdict
    assert "image_s" in verdict["timings"] and health["images_held"] >= 1, health
    steps = sorted({int(r["step"]) for r in metrics(run_dir) if any(k.startswith("loss/") for k in r)})
    assert steps == [0, 1]
    held = [p for p in (cache / "images").iterdir() if (p / "meta.json").is_file()]
    assert held, "the executor pulled no image: the tasks did not run on the image path"


def _gold_through_fleet_executor(run_dir: Path, tasks: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from envs.swe.loaders import load_swebench_file
    from envs.swe.payload import payload_to_spec, task_to_payload

    log = run_dir / "logs" / "processes" / "sandbox.log"
    deadline = time.monotonic() + 600
    while not (log.exists() and (found := re.search(r"listening on ([\d.]+:\d+)", log.read_text()))):
        assert time.monotonic() < deadline, "the fleet's sandbox executor never listened"
        time.sleep(0.5)
    url = f"http://{found.group(1)}"
    task = load_swebench_file(tasks / "train.jsonl")[0]
    body = json.dumps(payload_to_spec(task_to_payload(task), task.patch).to_json()).encode()
    request = urllib.request.Request(f"{url}/task/submit", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        task_id = json.load(resp)["task_id"]
    while True:
        with urllib.request.urlopen(f"{url}/task/{task_id}/result?wait=30", timeout=60) as resp:
            if resp.status == 200:
                verdict = json.load(resp)
                break
        assert time.monotonic() < deadline + 600, "no verdict"
    with urllib.request.urlopen(f"{url}/healthz", timeout=30) as resp:
        return verdict, json.load(resp)
