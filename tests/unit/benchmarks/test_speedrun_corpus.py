"""The speedrun corpus (benchmarks/speedrun/corpus.py) from real sdist archives (tar.gz with a top folder, as pip
downloads them): only `.py` members, task repositories left out, duplicates dropped, the cap a content-hash sample."""

from __future__ import annotations

import io
import json
import lzma
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import corpus  # noqa: E402

from launch.data.sdist import index_url  # noqa: E402


def sdist(tmp: Path, name: str, version: str, files: dict[str, str]) -> corpus.Sdist:
    path = tmp / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{member}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return corpus.Sdist(name, version, corpus.sha256_file(path), path)


def rows(path: Path) -> list[dict[str, str]]:
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def sixty_files(tmp_path: Path) -> list[corpus.Sdist]:
    files = {f"m{i}.py": f"def f{i}():\n    return {i}\n" * 20 for i in range(60)}
    return [sdist(tmp_path, "one", "1.0", {f"one/{k}": v for k, v in list(files.items())[:30]}),
            sdist(tmp_path, "two", "1.0", {f"two/{k}": v for k, v in list(files.items())[30:]})]


def key(row: dict[str, str]) -> tuple[str, str]:
    return row["package"], row["path"]


def test_only_python_files_of_non_task_projects_once_each(tmp_path: Path) -> None:
    shared = "def vendored():\n    return 1\n"
    a = sdist(tmp_path, "alpha", "1.0", {"alpha/core.py": "def f():\n    return 2\n", "alpha/_six.py": shared,
                                         "README.md": "# not code\n", "alpha/blob.py": "x = '" + "a" * 1000 + "'\n"})
    b = sdist(tmp_path, "beta", "2.0", {"beta/_six.py": shared.replace("1\n", "1   \n"),
                                        "beta/util.py": "def g():\n    pass\n"})
    task = sdist(tmp_path, "inflection", "0.5.1", {"inflection/__init__.py": "def camelize():\n    pass\n"})
    out = tmp_path / "corpus"
    counts = corpus.build([a, b, task], out, {"inflection"})
    kept = rows(out / "train.jsonl.xz") + rows(out / "heldout.jsonl.xz")
    paths = sorted(r["path"] for r in kept)
    # The vendored copy counts once (trailing whitespace ignored); the minified line and the README are not code.
    assert paths == ["alpha/_six.py", "alpha/core.py", "beta/util.py"]
    assert counts["duplicates"] == 1 and counts["filtered"] == 1
    assert not any(r["package"] == "inflection" for r in kept)


def test_the_cap_keeps_a_hash_sample_that_fits(tmp_path: Path) -> None:
    one, two = sixty_files(tmp_path)
    full = corpus.build([one, two], tmp_path / "full", set())
    cap = int(full["train_bytes"]) // 2
    capped = corpus.build([one, two], tmp_path / "capped", set(), max_train_bytes=cap)
    assert 0 < int(capped["train_bytes"]) <= cap and capped["train_bytes_before_cap"] == full["train_bytes"]
    # A sample of both projects, and the same files whatever order the archives come in.
    assert {r["package"] for r in rows(tmp_path / "capped" / "train.jsonl.xz")} == {"one", "two"}
    corpus.build([two, one], tmp_path / "again", set(), max_train_bytes=cap)
    assert rows(tmp_path / "capped" / "train.jsonl.xz") == rows(tmp_path / "again" / "train.jsonl.xz")


def test_the_files_beyond_the_cap_come_in_parts_that_pretraining_reads_after_the_sample(tmp_path: Path) -> None:
    one, two = sixty_files(tmp_path)
    full = corpus.build([one, two], tmp_path / "full", set())
    cap = int(full["train_bytes"]) // 3
    out = tmp_path / "capped"
    corpus.build([one, two], out, set(), max_train_bytes=cap)
    part = cap // 2
    more = corpus.build_more([two, one], out, set(), max_train_bytes=cap, part_bytes=part)
    sample = rows(out / "train.jsonl.xz")
    paths = corpus.training_parts(out)
    assert paths[0] == out / "train.jsonl.xz" and [p.name for p in paths[1:]] == [
        f"train-more-{i:03d}.jsonl.xz" for i in range(more["parts"])] and more["parts"] >= 2
    parts = [rows(p) for p in paths[1:]]
    rest = [r for p in parts for r in p]
    # Every training file once: the sample and the parts together are the corpus without its cap.
    assert sorted(map(key, sample + rest)) == sorted(map(key, rows(tmp_path / "full" / "train.jsonl.xz")))
    assert not set(map(key, sample)) & set(map(key, rest)) and more["files"] == len(rest)
    assert all(sum(len(r["text"].encode()) for r in p) <= part for p in parts)
    assert list(corpus.read_texts(*paths)) == [r["text"] for r in sample + rest]
    # --max-parts: the first parts alone, and parts written before are replaced, not left to be read twice.
    first = corpus.build_more([one, two], out, set(), max_train_bytes=cap, part_bytes=part, max_parts=1)
    assert first["parts"] == 1 and [p.name for p in corpus.training_parts(out)[1:]] == ["train-more-000.jsonl.xz"]
    assert rows(corpus.training_parts(out)[1]) == parts[0] and first["left_out_files"] == len(rest) - len(parts[0])


def test_parts_are_refused_beside_a_corpus_these_sdists_did_not_make(tmp_path: Path) -> None:
    one, two = sixty_files(tmp_path)
    out = tmp_path / "corpus"
    full = corpus.build([one, two], out, set(), max_train_bytes=10_000)
    with pytest.raises(ValueError, match="not the 5,000-byte sample"):
        corpus.build_more([one, two], out, set(), max_train_bytes=5_000)
    with pytest.raises(ValueError, match="not the"):  # another project's files in the sample
        corpus.build_more([one], out, set(), max_train_bytes=10_000)
    assert corpus.training_parts(out) == [out / "train.jsonl.xz"] and int(full["train_bytes"]) <= 10_000


def test_recipes_and_reserved_projects_are_kept_out(tmp_path: Path) -> None:
    excluded = corpus.task_repo_packages([ROOT / "launch/data/recipe.yaml", ROOT / "benchmarks/speedrun/tasks.yaml"])
    # GRPO's training and held-out repositories, their vendored dependencies and the reserved candidates.
    assert {"toolz", "python-slugify", "text-unidecode", "voluptuous", "xmltodict", "more-itertools"} <= excluded
    lock = corpus.read_lock()
    assert lock and not set(lock) & excluded, "packages.lock pins a project that is now a task repository"


def test_a_locked_fetch_skips_projects_the_lock_has_no_pin_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """packages.lock records the corpus as fetched: a project of packages.txt that pip could not fetch then has no pin,
    and `prepare --locked` reproduces the corpus without it instead of stopping."""
    version, sha = corpus.read_lock()["accelerate"]
    archive = tmp_path / f"accelerate-{version}.tar.gz"
    archive.write_bytes(b"cached")
    archive.with_suffix(".gz.json").write_text(json.dumps({"package": "accelerate", "version": version,
                                                           "sha256": sha}))

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"pip ran: {args}")

    monkeypatch.setattr("launch.data.sdist.subprocess.run", no_pip)
    got = corpus.fetch_all(["accelerate", "not-a-locked-project"], tmp_path, locked=True)
    assert [(s.package, s.version, s.sha256) for s in got] == [("accelerate", version, sha)]


def test_a_locked_fetch_takes_each_pinned_file_from_the_index_without_pip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package_index) -> None:  # type: ignore[no-untyped-def]
    """pip prepares an sdist's metadata in a build environment of its own (30 s a package on two busy cores); a pin
    names its file by hash, so `prepare --locked` fetches it as it is."""
    version, _ = corpus.read_lock()["accelerate"]
    built = sdist(tmp_path, "accelerate", version, {"src/accelerate/__init__.py": "x = 1\n"})
    package_index.publish("accelerate", {built.path.name: built.path.read_bytes()})
    monkeypatch.setattr(corpus, "read_lock", lambda: {"accelerate": (version, built.sha256)})
    assert index_url() == package_index.url  # asked of pip once, before pip is forbidden

    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"pip ran: {args}")

    monkeypatch.setattr("launch.data.sdist.subprocess.run", no_pip)
    cache = tmp_path / "cache"
    got = corpus.fetch_all(["accelerate"], cache, locked=True)
    assert [(s.package, s.version, s.sha256, s.path.read_bytes()) for s in got] == [
        ("accelerate", version, built.sha256, built.path.read_bytes())]
    assert package_index.requests == ["/simple/accelerate/", f"/packages/{built.path.name}"]
    # The sidecar the cache is looked up by: a second fetch asks nothing of the index.
    assert corpus.fetch_all(["accelerate"], cache, locked=True)[0].path == got[0].path
    assert len(package_index.requests) == 2
