"""SWE-bench Multimodal's `image_assets`: screenshots of the issue staged as local files, checked at load time.

A Multimodal row carries `image_assets`, a JSON string in the hub's files (a dict in local ones):
`{"problem_statement": [url, ...], "patch": [...], "test_patch": [...]}`, where swebench 5 also writes patch-side
entries as `{"url", "path"}` objects. Only the `problem_statement` images belong to the issue the policy reads; the
`patch` and `test_patch` ones are gold-side (binary files of the fix and of the hidden tests, which the harness
restores after `git apply`) and never reach a prompt.

Training machines have no internet, so each URL is resolved to a file in an assets folder, `<sha256 of the URL>.<ext>`
(`data.*.assets_dir`, default `assets/` beside the data), filled beforehand where there is internet by
`python scripts/fetch_image_assets.py` (`fetch_assets` here). A data set whose statement images are not all there is
refused at load time (`MissingImageAssets`, with counts) unless `data.*.allow_missing_assets` is set.

The `test_patch` entries (`{"url", "path"}`: binary files of the hidden tests, such as reference screenshots) are
what grading needs: swebench 4.1's eval script fetches them with `curl` before applying the test patch, which fails
in a sandbox without network. The loader stages them too: their bytes ride in the task's payload (`eval_files`,
path -> base64, never in a prompt) and the sandbox writes them into `/testbed` before the eval script runs, so
`curl` finds nothing to fetch and leaves them in place; missing ones refuse the data set like statement images.

The prompt path is text only today: each statement image becomes a placeholder line naming its URL and whether it was
staged (`statement_with_image_notes`); feeding the staged files to a multimodal policy is not wired yet.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from envs.registry import Task, TaskDataset
from envs.swe.harnesses.swebench import load_swebench_dataset as harness_loader

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig

STATEMENT_KEY = "problem_statement"
EVAL_FILES_KEY = "eval_files"
"""Task.metadata key the loader sets: {path in /testbed: base64 bytes} of the test patch's binary assets."""
MAX_EVAL_FILES_BYTES = 16 << 20
STAGED_KEY = "statement_images"
"""Task.metadata key the loader sets: [{"url": URL, "file": local path or None}] of the statement images."""
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg", ".bmp"}
_LISTED = 5


class MissingImageAssets(FileNotFoundError):
    """Images of a data set (statement or test-patch ones) that are not in its assets folder; `missing` lists
    (instance_id, url)."""

    def __init__(self, assets_dir: Path, missing: list[tuple[str, str]], rows: int) -> None:
        self.assets_dir, self.missing, self.rows = assets_dir, missing, rows
        shown = "\n  ".join(f"{iid}: {url}" for iid, url in missing[:_LISTED])
        more = f"\n  ... and {len(missing) - _LISTED} more" if len(missing) > _LISTED else ""
        super().__init__(
            f"{len(missing)} image asset(s) (problem statement or test patch) of {rows} row(s) are not staged in "
            f"{assets_dir}:\n"
            f"  {shown}{more}\n"
            f"Fetch them where there is internet (`python scripts/fetch_image_assets.py DATA --out {assets_dir}`) and "
            "copy the folder here, or set data.*.allow_missing_assets=true to load the rows with a text placeholder "
            "for each missing image")


def parse_image_assets(raw: Any) -> dict[str, list[str]]:
    """URLs per key of a row's `image_assets` (JSON string or dict; entries URLs or `{"url": ...}` objects)."""
    if not raw:
        return {}
    data = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(data, dict):
        raise ValueError(f"image_assets must be an object of URL lists, got {type(data).__name__}")
    out: dict[str, list[str]] = {}
    for key, entries in data.items():
        urls = [e.get("url") if isinstance(e, dict) else e for e in (entries or [])]
        out[str(key)] = [u for u in urls if isinstance(u, str) and u]
    return out


def test_patch_assets(raw: Any) -> list[tuple[str, str]]:
    """(path in the repository, url) of a row's test-patch assets (swebench's `{"url", "path"}` entries)."""
    if not raw:
        return []
    data = json.loads(raw) if isinstance(raw, str) else raw
    entries = data.get("test_patch") or [] if isinstance(data, dict) else []
    out = []
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("url"), str) and isinstance(e.get("path"), str):
            path = PurePosixPath(e["path"])
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"test_patch asset path {e['path']!r} must stay inside the repository")
            out.append((e["path"], e["url"]))
    return out


def statement_urls(task: Task) -> list[str]:
    return parse_image_assets(task.metadata.get("image_assets")).get(STATEMENT_KEY, [])


def asset_stem(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


def find_asset(assets_dir: Path, url: str) -> Path | None:
    """The staged file of `url` (`<sha256>.<any ext>`), or None."""
    hits = sorted(p for p in assets_dir.glob(f"{asset_stem(url)}.*") if p.suffix != ".tmp") if assets_dir.is_dir() \
        else []
    return hits[0] if hits else None


def default_assets_dir(cfg: DatasetConfig, dataset: TaskDataset) -> Path:
    if cfg.assets_dir:
        return Path(cfg.assets_dir).expanduser()
    if cfg.data_path:
        data = Path(cfg.data_path).expanduser()
        return (data if data.is_dir() else data.parent) / "assets"
    return (dataset.root or Path(".")) / "assets"


def stage_assets(tasks: Iterable[Task], assets_dir: Path, *, allow_missing: bool = False) -> int:
    """Set each task's `statement_images` from the assets folder; returns the images found. Raises
    MissingImageAssets (all of them counted) unless `allow_missing`."""
    missing: list[tuple[str, str]] = []
    rows: set[str] = set()
    found = 0
    for task in tasks:
        try:
            urls = statement_urls(task)
            eval_assets = test_patch_assets(task.metadata.get("image_assets"))
        except ValueError as exc:  # JSONDecodeError included
            raise ValueError(f"{task.instance_id}: field image_assets: {exc}") from exc
        files: dict[str, str] = {}
        for path, url in eval_assets:
            file = find_asset(assets_dir, url)
            if file is None:
                missing.append((task.instance_id, url))
                rows.add(task.instance_id)
            else:
                files[path] = base64.b64encode(file.read_bytes()).decode()
        if sum(len(v) for v in files.values()) > MAX_EVAL_FILES_BYTES:
            raise ValueError(f"{task.instance_id}: field image_assets: the test patch's assets are larger than "
                             f"{MAX_EVAL_FILES_BYTES >> 20} MiB")
        if files:
            task.metadata[EVAL_FILES_KEY] = files
        if not urls:
            continue
        staged = []
        for url in urls:
            file = find_asset(assets_dir, url)
            staged.append({"url": url, "file": str(file) if file else None})
            if file is None:
                missing.append((task.instance_id, url))
                rows.add(task.instance_id)
            else:
                found += 1
        task.metadata[STAGED_KEY] = staged
    if missing and not allow_missing:
        raise MissingImageAssets(assets_dir, missing, len(rows))
    return found


def stage_dataset_assets(dataset: TaskDataset, cfg: DatasetConfig) -> None:
    """The load-time check of a SWE data set (a no-op when no row has statement images)."""
    if any(t.metadata.get("image_assets") for t in dataset):
        stage_assets(dataset, default_assets_dir(cfg, dataset), allow_missing=cfg.allow_missing_assets)


def load_swebench_dataset(cfg: DatasetConfig, **kwargs: Any) -> TaskDataset:
    """`data.*.dataset_name=swebench`: the harness's loader, then the statement images of Multimodal rows staged
    (or the data set refused when some are missing)."""
    dataset = harness_loader(cfg, **kwargs)
    stage_dataset_assets(dataset, cfg)
    return dataset


def statement_with_image_notes(task: Task) -> str:
    """The problem statement plus one placeholder line per statement image (the prompt is text only)."""
    staged = task.metadata.get(STAGED_KEY)
    images = staged if isinstance(staged, list) else [{"url": u, "file": None} for u in statement_urls(task)]
    if not images:
        return task.problem_statement
    n = len(images)
    lines = [f"[image {i} of {n}, not shown (this prompt is text only): {im['url']}]" if im.get("file") else
             f"[image {i} of {n}, missing (not staged locally): {im['url']}]" for i, im in enumerate(images, 1)]
    return task.problem_statement.rstrip() + "\n\n" + "\n".join(lines)


Opener = Callable[[str], tuple[bytes, str]]
"""url -> (body, content type)."""


def _urlopen(url: str) -> tuple[bytes, str]:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 (the data set's own URLs)
        return resp.read(), resp.headers.get_content_type()


def _suffix(url: str, content_type: str) -> str:
    suffix = PurePosixPath(urlparse(url).path).suffix.lower()
    if suffix in _IMAGE_SUFFIXES:
        return suffix
    guessed = mimetypes.guess_extension(content_type or "")
    return guessed if guessed in _IMAGE_SUFFIXES else ".bin"


def fetch_assets(rows: Iterable[Any], out: Path, *, opener: Opener = _urlopen) -> tuple[int, int, list[str]]:
    """Download the statement images and test-patch assets of raw rows into `out` (skipping staged ones):
    (fetched, present, failed)."""
    out.mkdir(parents=True, exist_ok=True)
    fetched, present, failed = 0, 0, []
    urls = {u: None for row in rows if isinstance(row, dict)
            for u in [*parse_image_assets(row.get("image_assets")).get(STATEMENT_KEY, []),
                      *(url for _, url in test_patch_assets(row.get("image_assets")))]}
    for url in urls:
        if find_asset(out, url) is not None:
            present += 1
            continue
        try:
            body, content_type = opener(url)
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors; ValueError: not a URL
            failed.append(f"{url}: {exc}")
            continue
        path = out / f"{asset_stem(url)}{_suffix(url, content_type)}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(body)
        tmp.replace(path)  # a half-downloaded file is never taken for a staged one
        fetched += 1
    return fetched, present, failed
