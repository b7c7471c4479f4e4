"""SWE-bench Multimodal rows: statement images staged from a local folder, refused at load time when missing, and
only the issue's images (never the patch-side ones) named in a prompt."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.registry import Task, load_dataset
from envs.swe.assets import MissingImageAssets, asset_stem, fetch_assets, stage_assets
from envs.swe.loaders import read_rows
from envs.swe.payload import task_to_payload
from envs.swe.prompt import build_prompt
from envs.swe_agent import SweAgentEnvironment
from fleet.config.env import DatasetConfig

SHOT = "https://user-images.githubusercontent.com/1019208/148695345-aa9d2c0f-8d8b-4a5b-9f7b-6c2b1e6a3f11.png"
SHOT2 = "https://github.com/user-attachments/assets/3b1c2f9e-0f5e-4c1e-9d2a-7e8c6b5a4d21"  # no extension
GOLD_ASSET = "https://raw.githubusercontent.com/chartjs/Chart.js/3a5f1e2/test/fixtures/plugin.legend/expected.png"
COLUMNS = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "hints_text",
           "created_at", "image_assets", "version", "FAIL_TO_PASS", "PASS_TO_PASS")


def mm_row(instance_id: str, statement_urls: list[str]) -> dict[str, str]:
    shots = "\n".join(f"![image]({u})" for u in statement_urls)
    return {
        "repo": "chartjs/Chart.js", "instance_id": instance_id,
        "base_commit": "7c8f2ae1e1f0bb3d11cd7d1b8c5a7f1b8e7a6d43",
        "patch": "diff --git a/src/plugins/plugin.legend.js b/src/plugins/plugin.legend.js\n"
                 "--- a/src/plugins/plugin.legend.js\n+++ b/src/plugins/plugin.legend.js\n@@ -1 +1 @@\n-x\n+y\n",
        "test_patch": "diff --git a/test/specs/plugin.legend.tests.js b/test/specs/plugin.legend.tests.js\n",
        "problem_statement": f"Legend labels overlap when the chart is narrow\n\n{shots}\n\nExpected them to wrap.",
        "hints_text": "", "created_at": "2021-01-12T10:00:00Z",
        # As on the hub: a JSON string; swebench 5 writes patch-side entries as {"url", "path"} objects.
        "image_assets": json.dumps({"problem_statement": statement_urls, "patch": [],
                                    "test_patch": [{"url": GOLD_ASSET, "path": "test/fixtures/expected.png"}]}),
        "version": "3.7", "FAIL_TO_PASS": json.dumps(["test/specs/plugin.legend.tests.js | Legend wraps labels"]),
        "PASS_TO_PASS": "[]",
    }


def mm_folder(root: Path, rows: list[dict[str, str]]) -> Path:
    (root / "data").mkdir(parents=True)
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.string()) for c in COLUMNS]))
    pq.write_table(table, root / "data" / "dev-00000-of-00001.parquet")
    return root


def stage(folder: Path, *urls: str) -> None:
    (folder / "assets").mkdir(exist_ok=True)
    for url in urls:
        (folder / "assets" / f"{asset_stem(url)}.png").write_bytes(b"\x89PNG\r\n\x1a\n")


def cfg(folder: Path, **over: object) -> DatasetConfig:
    return DatasetConfig(dataset_name="swebench", data_path=str(folder), split="dev", **over)  # type: ignore[arg-type]


def test_rows_with_unstaged_statement_images_are_refused_with_counts(tmp_path):
    folder = mm_folder(tmp_path / "mm", [mm_row("chartjs__Chart.js-8650", [SHOT, SHOT2]),
                                         mm_row("chartjs__Chart.js-8710", [SHOT2])])
    stage(folder, SHOT, GOLD_ASSET)
    with pytest.raises(MissingImageAssets, match=r"2 image asset\(s\) \(problem statement or test patch\) of 2 "
                                                 r"row\(s\) are not staged") as e:
        load_dataset(cfg(folder))
    assert e.value.missing == [("chartjs__Chart.js-8650", SHOT2), ("chartjs__Chart.js-8710", SHOT2)]
    assert "allow_missing_assets" in str(e.value) and "fetch_image_assets.py" in str(e.value)


def test_staged_images_become_placeholders_and_gold_assets_never_reach_a_prompt(tmp_path, chat_tokenizer):
    folder = mm_folder(tmp_path / "mm", [mm_row("chartjs__Chart.js-8650", [SHOT])])
    stage(folder, SHOT, GOLD_ASSET)
    task = load_dataset(cfg(folder))[0]
    # The test patch's asset rides to the sandbox in the payload (written into /testbed before the eval script).
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    assert task.metadata["eval_files"] == {"test/fixtures/expected.png": png}
    assert task_to_payload(task)["eval_files"] == task.metadata["eval_files"]
    assert task.metadata["statement_images"] == [{"url": SHOT, "file": str(folder / "assets" /
                                                                           f"{asset_stem(SHOT)}.png")}]
    single = build_prompt(task, chat_tokenizer, 100_000, "bm25").text
    agent = SweAgentEnvironment(system_prompt="Fix it.").build_prompt(task, chat_tokenizer, 100_000).text
    for text in (single, agent):
        assert f"[image 1 of 1, not shown (this prompt is text only): {SHOT}]" in text
        assert GOLD_ASSET not in text and "expected.png" not in text


def test_opting_in_loads_rows_with_missing_images_named_in_the_prompt(tmp_path, chat_tokenizer):
    folder = mm_folder(tmp_path / "mm", [mm_row("chartjs__Chart.js-8650", [SHOT, SHOT2])])
    stage(folder, SHOT)
    task = load_dataset(cfg(folder, allow_missing_assets=True))[0]
    text = build_prompt(task, chat_tokenizer, 100_000, "none").text
    assert f"[image 2 of 2, missing (not staged locally): {SHOT2}]" in text


def test_fetched_assets_are_what_the_loader_finds(tmp_path):
    folder = mm_folder(tmp_path / "mm", [mm_row("chartjs__Chart.js-8650", [SHOT, SHOT2]),
                                         mm_row("chartjs__Chart.js-8710", [SHOT])])
    calls: list[str] = []

    def opener(url: str) -> tuple[bytes, str]:
        calls.append(url)
        return b"\x89PNG\r\n\x1a\n", "image/png"

    rows = [row for _, row in read_rows(folder / "data" / "dev-00000-of-00001.parquet")]
    assert fetch_assets(rows, folder / "assets", opener=opener) == (3, 0, [])
    assert calls == [SHOT, SHOT2, GOLD_ASSET]  # each URL once, the test patch's asset too (grading needs it)
    assert (folder / "assets" / f"{asset_stem(SHOT2)}.png").is_file()  # extension from the content type
    assert fetch_assets(rows, folder / "assets", opener=opener) == (0, 3, [])
    assert len(load_dataset(cfg(folder))) == 2


def test_a_failed_download_is_reported_and_not_staged(tmp_path):
    def offline(url: str) -> tuple[bytes, str]:
        raise OSError("Network is unreachable")

    assert fetch_assets([mm_row("chartjs__Chart.js-8650", [SHOT])], tmp_path / "a", opener=offline) == \
        (0, 0, [f"{SHOT}: Network is unreachable", f"{GOLD_ASSET}: Network is unreachable"])
    assert list((tmp_path / "a").iterdir()) == []


def test_assets_dir_points_elsewhere(tmp_path):
    folder = mm_folder(tmp_path / "mm", [mm_row("chartjs__Chart.js-8650", [SHOT])])
    elsewhere = tmp_path / "shared-assets"
    elsewhere.mkdir()
    for url in (SHOT, GOLD_ASSET):
        (elsewhere / f"{asset_stem(url)}.png").write_bytes(b"png")
    assert len(load_dataset(cfg(folder, assets_dir=str(elsewhere)))) == 1


def test_a_malformed_image_assets_field_names_its_row(tmp_path):
    task = Task("chartjs__Chart.js-8650", "swe", "Legend overlaps", metadata={"image_assets": "{not json"})
    with pytest.raises(ValueError, match=r"chartjs__Chart.js-8650: field image_assets: Expecting"):
        stage_assets([task], tmp_path)
