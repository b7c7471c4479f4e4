"""`grpo-fleet data validate` on image tasks: a row whose eval log the grader cannot read is reported as not
gradable (a silent zero in training), not as a gold patch that failed its tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from image_helpers import IMAGE_F2P, ImageSet, eval_script
from sandbox_helpers import P2P

from fleet.config.infra import SandboxConfig
from launch.cli import main


def _row(images: ImageSet, instance_id: str, script: str) -> dict[str, object]:
    repo = images.repo
    return {"instance_id": instance_id, "repo": "calc/calc", "base_commit": repo.base, "patch": repo.gold,
            "test_patch": repo.test_patch, "problem_statement": "add and mul are wrong", "FAIL_TO_PASS": IMAGE_F2P,
            "PASS_TO_PASS": P2P, "image": images.image, "eval_script": script, "log_parser": "parse_log_pytest"}


def test_an_unreadable_eval_log_is_counted_not_gradable_and_fails_the_dataset(
        images: ImageSet, image_cfg: SandboxConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted({t.split("::", 1)[0] for t in [*IMAGE_F2P, *P2P]})
    script = eval_script(images.repo.base, files, images.repo.test_patch)
    no_markers = "\n".join(line for line in script.splitlines() if ">>>>>" not in line) + "\n"
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [_row(images, "calc__calc-1", script),
                                                             _row(images, "calc__calc-nomarkers", no_markers)]))
    rc = main(["data", "validate", "--gold", "2", "data.train.dataset_name=swebench", f"data.train.data_path={data}",
               f"sandbox.work_root={image_cfg.work_root}", f"sandbox.image_cache_dir={image_cfg.image_cache_dir}",
               f"sandbox.image_registry={images.registry}", "sandbox.image_tls_verify=false"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert out.splitlines()[1].split() == ["calc/calc", "2", "1", "1", "2", "0", "50%"]
    assert "calc__calc-nomarkers [calc/calc]: gold not_gradable (eval log not gradable" in out
