"""Image tasks through a real executor: pulled from a loopback registry, run in bubblewrap over the image's rootfs."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

from image_helpers import ImageSet, tree_digest

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor


async def test_gold_patch_resolves_full_and_empty_patch_no(images: ImageSet, image_cfg: SandboxConfig) -> None:
    async with Executor(image_cfg) as ex:
        gold = await ex.run(images.spec(images.repo.gold))
        empty = await ex.run(images.spec(""))
    assert gold.status == "completed", gold.error + gold.stdout_tail[-2000:]
    assert gold.resolution == "FULL", gold.test_status
    assert gold.exit_code == 0
    assert empty.status == "completed" and empty.resolution == "NO", empty.error
    assert empty.exit_code not in (None, 0)


async def test_image_unchanged_after_a_task_that_deletes_files(images: ImageSet, image_cfg: SandboxConfig) -> None:
    async with Executor(image_cfg) as ex:
        assert ex.images is not None
        image = await ex.images.cache.ensure(ex.images.ref(images.image))
        before = tree_digest(image.rootfs)
        spec = images.spec("", eval_script="#!/bin/bash\nrm -rf /testbed /usr/lib/python3* /etc\n"
                                          ": '>>>>> Start Test Output'\n: '>>>>> End Test Output'\n")
        verdict = await ex.run(spec)
        again = await ex.run(images.spec(images.repo.gold))
    assert verdict.status == "completed" and verdict.resolution == "NO"
    assert tree_digest(image.rootfs) == before
    assert again.resolution == "FULL", again.error


async def test_missing_image_is_an_infra_error_naming_it(images: ImageSet, image_cfg: SandboxConfig) -> None:
    async with Executor(image_cfg) as ex:
        verdict = await ex.run(images.spec(images.repo.gold, image="swe/no-such-image:v1"))
    assert verdict.status == "infra_error"
    assert "swe/no-such-image:v1" in verdict.error and "not found" in verdict.error


async def test_future_commits_are_gone_before_the_patch_applies(images: ImageSet, image_cfg: SandboxConfig) -> None:
    probe = ("#!/bin/bash\ncd /testbed\n: '>>>>> Start Test Output'\n"
             f"git -c safe.directory='*' cat-file -e {images.future_commit} && echo 'FAILED leak::found' "
             "|| echo 'PASSED leak::found'\n"
             "git -c safe.directory='*' log --all --format=%s | grep -q 'THE FIX' && echo 'FAILED leak::log' "
             "|| echo 'PASSED leak::log'\n: '>>>>> End Test Output'\n")
    async with Executor(image_cfg) as ex:
        verdict = await ex.run(images.spec("", image=images.future_image, eval_script=probe,
                                           fail_to_pass=["leak::found", "leak::log"], pass_to_pass=[]))
    assert verdict.status == "completed", verdict.error
    assert verdict.test_status == {"leak::found": "PASSED", "leak::log": "PASSED"}, verdict.stdout_tail[-1500:]
    assert "scrubbed 1 commit(s)" in verdict.error


def _mess_of_a_killed_executor(cache: Path) -> tuple[Path, Path]:
    """What a SIGKILLed executor leaves: a run layer still mounted, its folder, a half-done pull."""
    dead = cache.parent / "runs" / "dead-executor"
    run = dead / "run1"
    for sub in ("lower", "upper", "work", "merged"):
        (run / sub).mkdir(parents=True)
    opts = f"lowerdir={run / 'lower'},upperdir={run / 'upper'},workdir={run / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(run / "merged")], check=True)
    (cache.parent / "runs" / "dead-executor.lock").write_text("")
    (cache / "tmp" / "half-pull" / "rootfs").mkdir(parents=True)  # its lock died with its puller
    return dead, run / "merged"


def _mounted(path: Path) -> bool:
    return f" {path} " in Path("/proc/self/mountinfo").read_text()


async def test_executor_restart_removes_what_a_killed_one_left(images: ImageSet, image_cfg: SandboxConfig) -> None:
    cache = Path(str(image_cfg.image_cache_dir))
    dead, merged = _mess_of_a_killed_executor(cache)
    assert _mounted(merged)
    async with Executor(image_cfg) as ex:
        assert ex.images is not None
        assert not dead.exists() and not (cache / "tmp" / "half-pull").exists()
        assert not _mounted(merged)
        health = ex.health()
    assert health["pulls_in_flight"] == 0 and health["image_layers"] == "overlay"


async def test_image_runs_have_no_network_and_a_process_limit(images: ImageSet, image_cfg: SandboxConfig) -> None:
    probe = ("#!/bin/bash\n: '>>>>> Start Test Output'\n"
             "python3 -c \"import socket; socket.create_connection(('10.0.0.1', 80), 2)\" 2>/dev/null "
             "&& echo 'FAILED limits::network' || echo 'PASSED limits::network'\n"
             "python3 - <<'EOF'\nimport os, time\nn = 0\nfor _ in range(300):\n    try:\n        pid = os.fork()\n"
             "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
             "    n += 1\nprint('PASSED' if n < 300 else 'FAILED', 'limits::pids', flush=True)\nEOF\n"
             ": '>>>>> End Test Output'\n")
    async with Executor(image_cfg) as ex:
        assert ex.health()["image_cgroups"] is True
        verdict = await ex.run(images.spec("", eval_script=probe, fail_to_pass=["limits::network", "limits::pids"],
                                           pass_to_pass=[]))
    assert verdict.test_status == {"limits::network": "PASSED", "limits::pids": "PASSED"}, verdict.stdout_tail[-1500:]


STAGED_CHECK = """#!/bin/bash
set -uxo pipefail
cd /testbed
mkdir -p tests/fixtures
curl -o tests/fixtures/expected.png https://example.invalid/expected.png
: '>>>>> Start Test Output'
if [ "$(cat tests/fixtures/expected.png)" = "reference screenshot" ]; then r=PASSED; else r=FAILED; fi
echo "$r tests/test_core.py::test_add"
: '>>>>> End Test Output'
"""


async def test_eval_files_are_in_the_tree_when_the_eval_script_runs_offline(images: ImageSet,
                                                                            image_cfg: SandboxConfig) -> None:
    # SWE-bench Multimodal's test-patch assets: the harness's script curls them, which no sandbox here can; the
    # staged bytes are in /testbed before it runs, and a failed curl leaves them alone.
    staged = {"tests/fixtures/expected.png": base64.b64encode(b"reference screenshot").decode()}
    kw: dict[str, object] = {"eval_script": STAGED_CHECK, "fail_to_pass": ["tests/test_core.py::test_add"],
                             "pass_to_pass": []}
    async with Executor(image_cfg) as ex:
        with_files = await ex.run(images.spec("", eval_files=staged, **kw))
        without = await ex.run(images.spec("", **kw))
    assert (with_files.status, with_files.resolution) == ("completed", "FULL"), with_files.error
    assert (without.status, without.resolution) == ("completed", "NO"), without.error
