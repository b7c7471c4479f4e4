"""The first run's task slice: what it builds when no task set is there, and that an existing one is used as it is."""

import io
import tarfile
from pathlib import Path

import pytest

from envs.swe import taskset
from fleet.config import load_config
from launch.data import prepare
from launch.data.recipe import load_recipe
from launch.data.sdist import SdistError, _check_members

ROOT = Path(__file__).resolve().parents[4]
TINY = ROOT / "examples" / "configs" / "grpo_swe_tiny.yaml"


def test_the_default_slice_is_a_few_repositories_and_enough_tasks_for_the_tiny_run():
    cfg = load_config(TINY)
    repos, per_repo = prepare.first_run_plan(cfg.grpo, cfg.data.train)
    assert repos and len(repos) <= 3
    assert len(repos) * per_repo == 16  # 4 prompts x 6 steps, kept at most 16


def test_the_slice_follows_the_config_keys():
    cfg = load_config(TINY, ["data.train.first_run_repos=[toolz]", "data.train.first_run_tasks=5"])
    assert prepare.first_run_plan(cfg.grpo, cfg.data.train) == (["toolz"], 5)
    cfg = load_config(TINY, ["data.train.first_run_repos=null", "grpo.max_num_steps=1"])
    repos, per_repo = prepare.first_run_plan(cfg.grpo, cfg.data.train)
    assert repos is None and per_repo == -(-8 // len(load_recipe().repos))  # every repository, at least 8 tasks


def test_a_task_set_already_there_is_used_without_building(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text("")
    cfg = load_config(TINY, [f"data.train.data_path={tmp_path}"])
    # would fail without a network/sandbox if it built
    prepare.prepare_embedded_dataset(cfg.data.train, grpo=cfg.grpo, sandbox=cfg.sandbox)
    assert "task set ready" in capsys.readouterr().out


def test_the_task_set_module_does_not_import_the_builder():
    assert "builder" not in Path(taskset.__file__).read_text()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("member", [_member("/etc/passwd"), _member("pkg/../../x"), _member("pkg/dev", tarfile.CHRTYPE),
                                    _member("pkg/l", tarfile.SYMTYPE, "/etc"),
                                    _member("pkg/l", tarfile.SYMTYPE, "../../x")])
def test_sdist_extraction_without_the_data_filter_refuses_what_the_filter_refuses(member):
    with pytest.raises(SdistError):
        _check_members(Path("x.tar.gz"), [_member("pkg/ok.py"), member])


def test_sdist_extraction_without_the_data_filter_accepts_a_plain_tree():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.addfile(_member("pkg/a.py"), io.BytesIO(b""))
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tf:
        _check_members(Path("x.tar"), tf.getmembers())
