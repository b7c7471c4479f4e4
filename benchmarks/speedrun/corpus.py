"""Stage 1 of the SWE speedrun (CPU): Python source from PyPI sdists, deduplicated, and a byte-level BPE on it.

The projects are listed in `packages.txt`; any project that is also a GRPO task repository (`tasks.yaml` or the
default recipe names it, training or held out) is left out, as are the candidates in `reserved.txt`. Sdists are
fetched with pip (the host's index and find-links, as `grpo-fleet data build` fetches its own), one process per
project so that a project whose metadata cannot be prepared here is skipped with a line saying so instead of
failing the stage. `packages.lock` records the version and
sha256 of every sdist used; with it, a later run fetches exactly those and refuses an archive that differs.

Kept: `.py` members of each archive, UTF-8, at most `MAX_FILE_BYTES`, without minified or data-blob lines
(`MAX_LINE_CHARS`). Deduplicated on content with trailing whitespace removed (vendored copies of six, packaging,
urllib3... appear in many sdists). A fixed share of files, chosen by content hash, is held out for bits per byte.

Output (`OUT/`): `train.jsonl.xz` and `heldout.jsonl.xz` (`{"package", "path", "text"}` per file), `tokenizer/`
(an HF tokenizer folder with the project's chat template) and `manifest.json` (what was kept and dropped, sizes).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import lzma
import re
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from launch.data.sdist import SdistError, download_from_index, pip_download, sha256_file
from workshop.tinymodel import QWEN_SPLIT_PATTERN

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
PACKAGES = HERE / "packages.txt"
LOCK = HERE / "packages.lock"
RESERVED = HERE / "reserved.txt"
MAX_FILE_BYTES = 200_000
MAX_LINE_CHARS = 400
HELDOUT_SHARE = 0.01
VOCAB_SIZE = 16384
MAX_TRAIN_BYTES = 150_000_000  # ~25 MiB as xz: with the wheels and the tree, within what one device call carries


@dataclass(frozen=True)
class Sdist:
    package: str
    version: str
    sha256: str
    path: Path


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: Path = PACKAGES) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def read_lock(path: Path = LOCK) -> dict[str, tuple[str, str]]:
    """canonical name -> (version, sha256)."""
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            spec, sha = line.split()
            name, version = spec.split("==")
            out[_canonical(name)] = (version, sha.removeprefix("sha256:"))
    return out


def write_lock(sdists: Iterable[Sdist], path: Path = LOCK) -> None:
    lines = ["# Written by `swe_speedrun.py corpus`: the sdists the corpus was made from (name==version sha256)."]
    lines += [f"{s.package}=={s.version} sha256:{s.sha256}" for s in sorted(sdists, key=lambda s: s.package)]
    path.write_text("\n".join(lines) + "\n")


def _version_of(archive: Path, package: str) -> str:
    stem = archive.name.removesuffix(".tar.gz").removesuffix(".zip").removesuffix(".tar.bz2")
    # `Name-1.2.3` with the project name spelled as the archive spells it (dashes, underscores or dots).
    return stem[len(package):].lstrip("-_") if _canonical(stem[: len(package)]) == _canonical(package) \
        else stem.rsplit("-", 1)[-1]


def fetch_one(package: str, cache: Path, pin: tuple[str, str] | None) -> Sdist | None:
    """The sdist of `package` (the pinned version when `pin`), downloaded into `cache`; None if it cannot be."""
    want = f"{package}=={pin[0]}" if pin else package
    for archive in cache.glob("*"):
        meta = archive.with_suffix(archive.suffix + ".json")
        if meta.is_file():
            m = json.loads(meta.read_text())
            if _canonical(m["package"]) == _canonical(package) and (pin is None or m["version"] == pin[0]):
                return Sdist(package, m["version"], m["sha256"], archive)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        # A pin names its file by hash: fetched from the index as it is, with no metadata for pip to prepare.
        fetched = download_from_index(package, *pin, Path(tmp)) if pin else None
        if fetched is None:
            fetched = _pip_download(want, package, Path(tmp))
        if fetched is None:
            return None
        sha = sha256_file(fetched)
        version = pin[0] if pin else _version_of(fetched, package)
        if pin and sha != pin[1]:
            raise RuntimeError(f"packages.lock: {package}=={pin[0]} has sha256 {pin[1]}, the download has {sha}")
        dest = cache / fetched.name
        fetched.replace(dest)
    dest.with_suffix(dest.suffix + ".json").write_text(json.dumps({"package": package, "version": version,
                                                                   "sha256": sha}))
    return Sdist(package, version, sha, dest)


def _pip_download(want: str, package: str, tmp: Path) -> Path | None:
    try:
        return pip_download(package, want, tmp)
    except SdistError as e:
        log.warning("corpus: skipping %s: %s", want, str(e)[-300:])
        return None


def fetch_all(names: list[str], cache: Path, *, workers: int = 3, locked: bool = False) -> list[Sdist]:
    """Every project's sdist (pip runs `workers` at a time: most of its time is preparing metadata)."""
    cache.mkdir(parents=True, exist_ok=True)
    pins = read_lock() if locked else {}
    if locked:
        # The lock records the corpus as it was fetched: a project pip could not fetch then has no pin, and the
        # locked corpus is the one without it.
        unpinned = [n for n in names if _canonical(n) not in pins]
        if unpinned:
            log.warning("corpus: packages.lock has no pin for %s (not in the locked corpus): skipped", unpinned)
        names = [n for n in names if _canonical(n) in pins]
        if not names:
            raise RuntimeError("packages.lock pins none of packages.txt; run the corpus stage without --locked first")
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        got = list(pool.map(lambda n: fetch_one(n, cache, pins.get(_canonical(n))), names))
    out = [s for s in got if s is not None]
    log.info("corpus: %d/%d sdists in %.0f s", len(out), len(names), time.perf_counter() - t0)
    return out


def _members(archive: Path) -> Iterator[tuple[str, bytes]]:
    """(path inside the project, bytes) of every `.py` file of a tar or zip sdist, its top folder removed."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if info.filename.endswith(".py") and not info.is_dir() and info.file_size <= MAX_FILE_BYTES:
                    yield info.filename.split("/", 1)[-1], z.read(info)
        return
    with tarfile.open(archive) as t:
        for m in t:
            if m.isfile() and m.name.endswith(".py") and m.size <= MAX_FILE_BYTES:
                f = t.extractfile(m)
                if f is not None:
                    yield m.name.split("/", 1)[-1], f.read()


def _keep(text: str) -> bool:
    lines = text.splitlines()
    return bool(lines) and text.strip() != "" and max(map(len, lines)) <= MAX_LINE_CHARS


def _heldout(digest: str) -> bool:
    return int(digest[:8], 16) / 0x1_0000_0000 < HELDOUT_SHARE


Doc = tuple[str, str, str, str]  # (content digest, package, path, text)


def _documents(sdists: list[Sdist], excluded: set[str]) -> tuple[list[Doc], dict[str, int]]:
    """Every `.py` file of the sdists outside `excluded`, deduplicated on content, in package order."""
    seen: set[str] = set()
    counts = {"files": 0, "duplicates": 0, "filtered": 0, "not_utf8": 0}
    docs: list[Doc] = []
    for s in sorted(sdists, key=lambda s: s.package):
        if _canonical(s.package) in excluded:
            continue
        for path, raw in _members(s.path):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                counts["not_utf8"] += 1
                continue
            if not _keep(text):
                counts["filtered"] += 1
                continue
            digest = hashlib.sha1("\n".join(line.rstrip() for line in text.splitlines()).encode()).hexdigest()
            if digest in seen:
                counts["duplicates"] += 1
                continue
            seen.add(digest)
            counts["files"] += 1
            docs.append((digest, s.package, path, text))
    return docs, counts


def _split(docs: list[Doc], max_train_bytes: int) -> tuple[list[Doc], list[Doc], list[Doc]]:
    """(training files within the cap, training files beyond it, held-out files). The cap keeps a sample chosen by
    content hash (so the same files whatever the order); the rest stays in hash order, a fair sample at any prefix."""
    heldout = [d for d in docs if _heldout(d[0])]
    train = sorted((d for d in docs if not _heldout(d[0])), key=lambda d: d[0])  # hash order: a fair sample
    kept, rest, size = [], [], 0
    for d in train:
        n = len(d[3].encode())
        if size + n > max_train_bytes:
            rest.append(d)
            continue
        kept.append(d)
        size += n
    kept.sort(key=lambda d: (d[1], d[2]))
    return kept, rest, heldout


def _write_rows(path: Path, docs: list[Doc]) -> None:
    with lzma.open(path, "wt", preset=6) as f:
        for _, package, file, text in docs:
            f.write(json.dumps({"package": package, "path": file, "text": text}) + "\n")


def build(sdists: list[Sdist], out: Path, excluded: set[str], *, max_train_bytes: int = MAX_TRAIN_BYTES
          ) -> dict[str, object]:
    """Write train/heldout JSONL (xz) of the deduplicated `.py` files; return the counts for the manifest.

    Beyond `max_train_bytes` the training files are a sample, chosen by content hash (so the same files whatever the
    order), that fits: the corpus must travel to the lent GPU machine within its 64 MiB (`build_more` writes the
    rest in parts that travel in calls of their own)."""
    out.mkdir(parents=True, exist_ok=True)
    docs, counts = _documents(sdists, excluded)
    kept, rest, heldout = _split(docs, max_train_bytes)
    _write_rows(out / "train.jsonl.xz", kept)
    _write_rows(out / "heldout.jsonl.xz", heldout)
    per_package: dict[str, int] = {}
    for _, package, _, text in kept:
        per_package[package] = per_package.get(package, 0) + len(text.encode())
    size = sum(len(d[3].encode()) for d in kept)
    return {**counts, "train_files": len(kept), "train_bytes": size,
            "train_bytes_before_cap": size + sum(len(d[3].encode()) for d in rest),
            "heldout_files": len(heldout), "heldout_bytes": sum(len(d[3].encode()) for d in heldout),
            "packages": len(per_package), "bytes_per_package": per_package}


MORE = "train-more-{:03d}.jsonl.xz"
MORE_GLOB = "train-more-*.jsonl.xz"


def build_more(sdists: list[Sdist], out: Path, excluded: set[str], *, max_train_bytes: int = MAX_TRAIN_BYTES,
               part_bytes: int = 100_000_000, max_parts: int | None = None) -> dict[str, object]:
    """The training files the cap left out, as `out/train-more-NNN.jsonl.xz` parts of about `part_bytes` each (~16 MB
    as xz at 100 MB: the speedrun corpus's four parts travel together in one device call), beside the corpus
    `build` wrote from the same sdists; `train.jsonl.xz`, the held-out files and the tokenizer are not touched.
    Refused unless the corpus there is the cap's sample of these sdists, file for file: a file in both would be
    trained on twice as often."""
    docs, _ = _documents(sdists, excluded)
    kept, rest, _ = _split(docs, max_train_bytes)
    there = [(r["package"], r["path"]) for r in _read_rows(out / "train.jsonl.xz")]
    if there != [(d[1], d[2]) for d in kept]:
        raise ValueError(f"{out / 'train.jsonl.xz'} is not the {max_train_bytes:,}-byte sample of these sdists "
                         f"({len(there)} files there, {len(kept)} here): build the corpus again from them first")
    for old in out.glob(MORE_GLOB):
        old.unlink()
    parts: list[list[Doc]] = [[]]
    size = 0
    for d in rest:
        n = len(d[3].encode())
        if parts[-1] and size + n > part_bytes:
            parts.append([])
            size = 0
        parts[-1].append(d)
        size += n
    parts = [p for p in parts if p][:max_parts]
    for i, part in enumerate(parts):
        _write_rows(out / MORE.format(i), part)
    written = [d for p in parts for d in p]
    return {"parts": len(parts), "files": len(written), "bytes": sum(len(d[3].encode()) for d in written),
            "left_out_files": len(rest) - len(written),
            "compressed_bytes": [(out / MORE.format(i)).stat().st_size for i in range(len(parts))]}


def _read_rows(path: Path) -> Iterator[dict[str, str]]:
    with lzma.open(path, "rt") as f:
        for line in f:
            yield json.loads(line)


def training_parts(corpus_dir: Path) -> list[Path]:
    """The training corpus as pre-training reads it: `train.jsonl.xz`, then the `train-more-*` parts present."""
    return [corpus_dir / "train.jsonl.xz", *sorted(corpus_dir.glob(MORE_GLOB))]


def read_texts(*paths: Path) -> Iterator[str]:
    for path in paths:
        for row in _read_rows(path):
            yield row["text"]


# Qwen2's split, except that a path component (a word followed by `/` or `.py`) never takes the character before it.
# Under Qwen2's split `[start of unidiff/patch.py` gives ` uni` and `diff --git a/unidiff/patch.py` gives `/`, `uni`:
# copying a file's path from the context into the diff was a respelling, and the speedrun's model wrote `a/ unidiff/`
# (the header's token, space and all) for 42 of 43 held-out unidiff tasks (37 after GRPO). Here the path's tokens
# are the same in both places for all 737 tasks (none under Qwen2's), at 0.15 % more tokens on held-out code.
PATH_SPLIT_PATTERN = QWEN_SPLIT_PATTERN.replace(
    r"[^\r\n\p{L}\p{N}]?\p{L}+", r"(?:[^\r\n\p{L}\p{N}](?![\p{L}\p{N}_]+(?:/|\.py\b)))?\p{L}+")


def train_tokenizer(corpus: Path, out: Path, *, vocab_size: int = VOCAB_SIZE, max_bytes: int = 80_000_000) -> Path:
    """A byte-level BPE (`PATH_SPLIT_PATTERN`, the project's chat template and special tokens) trained on up to
    `max_bytes` of the training corpus; saved as an HF tokenizer folder at `out`."""
    from workshop.tinymodel import _save_tokenizer, _train_tokenizer

    def texts() -> Iterator[str]:
        seen = 0
        for text in read_texts(corpus / "train.jsonl.xz"):
            yield text
            seen += len(text)
            if seen >= max_bytes:
                return

    tok = _train_tokenizer(vocab_size, texts(), split_pattern=PATH_SPLIT_PATTERN)
    _save_tokenizer(tok, out)
    return out


def bytes_per_token(tokenizer_dir: Path, corpus: Path) -> float:
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    texts = list(read_texts(corpus / "heldout.jsonl.xz"))
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    return sum(len(t.encode()) for t in texts) / max(1, sum(map(len, ids)))


def task_repo_packages(recipes: Iterable[Path]) -> set[str]:
    """Canonical PyPI names of every repository (and vendored dependency) the task recipes name, and of the projects
    reserved for task sets (`reserved.txt`)."""
    import yaml

    names: set[str] = {_canonical(n) for n in read_names(RESERVED)}
    for path in recipes:
        if path.is_file():
            for repo in yaml.safe_load(path.read_text()).get("repos", []):
                names.add(_canonical(repo["package"]))
                names.update(_canonical(v["package"]) for v in repo.get("vendor", []))
    return names


def sources(cache: Path, recipes: list[Path], *, locked: bool, workers: int = 3
            ) -> tuple[list[str], list[Sdist], set[str]]:
    """(the projects asked for, their sdists fetched into `cache`, the task projects kept out of the corpus)."""
    excluded = task_repo_packages(recipes)
    names = [n for n in read_names() if _canonical(n) not in excluded]
    return names, fetch_all(names, cache, workers=workers, locked=locked), excluded


def run(out: Path, cache: Path, recipes: list[Path], *, locked: bool, workers: int = 3) -> dict[str, object]:
    t0 = time.perf_counter()
    names, sdists, excluded = sources(cache, recipes, locked=locked, workers=workers)
    if not locked:
        write_lock(sdists)
    t_fetch = time.perf_counter() - t0
    counts = build(sdists, out, excluded)
    t_build = time.perf_counter() - t0 - t_fetch
    train_tokenizer(out, out / "tokenizer")
    bpt = bytes_per_token(out / "tokenizer", out)
    manifest = {
        **counts, "excluded_task_packages": sorted(excluded), "sdists": len(sdists),
        "skipped": sorted(set(map(_canonical, names)) - {_canonical(s.package) for s in sdists}),
        "vocab_size": VOCAB_SIZE, "heldout_bytes_per_token": round(bpt, 3),
        "compressed_bytes": sum((out / f).stat().st_size for f in ("train.jsonl.xz", "heldout.jsonl.xz")),
        "seconds": {"fetch": round(t_fetch, 1), "build": round(t_build, 1),
                    "tokenizer": round(time.perf_counter() - t0 - t_fetch - t_build, 1)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--locked", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    m = run(args.out, args.cache, [HERE.parents[1] / "launch/data/recipe.yaml", HERE / "tasks.yaml"],
            locked=args.locked)
    print(json.dumps({k: v for k, v in m.items() if k != "bytes_per_package"}, indent=1))


if __name__ == "__main__":
    main()
