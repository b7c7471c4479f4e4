"""The tree cache's file (`sandbox.tree_cache_path`): what is read back, what is skipped, what is never written."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import Verdict
from services.sandbox.treecache import FILE_TAIL_CHARS, TreeCache, environment_fingerprint


def _full() -> Verdict:
    return Verdict(status="completed", resolution="FULL", test_status={"t::a": "PASSED"})


async def _verdict(v: Verdict) -> Verdict:
    return v


def test_lines_of_another_environment_or_unreadable_ones_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "trees.jsonl"
    ours = {"env": "E1", "key": "k1", "verdict": _full().to_json()}
    theirs = {"env": "E0", "key": "k2", "verdict": _full().to_json()}
    path.write_text(json.dumps(ours) + "\n" + json.dumps(theirs) + "\n{not json\n" + '{"env": "E1"}\n')
    cache = TreeCache(8)
    cache.attach(path, "E1")
    assert cache.stats() == {"hits": 0, "misses": 0, "kept": 1, "loaded": 1}
    answer = asyncio.run(cache.get_or_run("k1", lambda: _verdict(Verdict(status="completed"))))
    assert answer.resolution == "FULL" and cache.hits == 1


def test_only_kept_and_durable_verdicts_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "trees.jsonl"
    cache = TreeCache(8)
    cache.attach(path, "E1")

    async def runs() -> None:
        await cache.get_or_run("a", lambda: _verdict(_full()))
        await cache.get_or_run("b", lambda: _verdict(Verdict(status="timeout")))  # never kept
        await cache.get_or_run("c", lambda: _verdict(_full()), durable=False)  # an image named by a tag

    asyncio.run(runs())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["env"], e["key"]) for e in lines] == [("E1", "a")]
    assert Verdict.from_json(lines[0]["verdict"]) == _full()
    assert cache.stats()["kept"] == 2  # "c" is still answered from memory


def test_the_file_keeps_the_end_of_long_output_tails(tmp_path: Path) -> None:
    path = tmp_path / "trees.jsonl"
    cache = TreeCache(8)
    cache.attach(path, "E1")
    long = Verdict(status="completed", resolution="NO", stdout_tail="x" * 50_000 + "END")
    answer = asyncio.run(cache.get_or_run("a", lambda: _verdict(long)))
    assert answer.stdout_tail == long.stdout_tail  # the caller gets the whole verdict
    kept = json.loads(path.read_text())["verdict"]["stdout_tail"]
    assert len(kept) == FILE_TAIL_CHARS and kept.endswith("END")


def test_the_file_is_rewritten_with_the_last_verdicts_once_it_holds_twice_the_size(tmp_path: Path) -> None:
    path = tmp_path / "trees.jsonl"
    path.write_text("".join(json.dumps({"env": "E1", "key": f"k{i}", "verdict": _full().to_json()}) + "\n"
                            for i in range(5)))
    cache = TreeCache(2)
    cache.attach(path, "E1")
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["k3", "k4"]
    assert cache.stats()["loaded"] == 2


def test_the_fingerprint_follows_what_can_change_a_verdict(tmp_path: Path) -> None:
    source = tmp_path / "grading.py"
    source.write_text("x = 1\n")
    base = SandboxConfig().model_dump()
    fp = environment_fingerprint(base, {"pytest": "8.3.4"}, [source])
    assert fp == environment_fingerprint({**base, "pool_size": 3, "work_root": "/elsewhere"}, {"pytest": "8.3.4"},
                                         [source])
    assert fp != environment_fingerprint({**base, "memory_mb": 4096}, {"pytest": "8.3.4"}, [source])
    assert fp != environment_fingerprint(base, {"pytest": "8.4.0"}, [source])
    source.write_text("x = 2\n")
    assert fp != environment_fingerprint(base, {"pytest": "8.3.4"}, [source])


def test_a_cache_file_without_a_cache_is_refused_naming_both_keys() -> None:
    with pytest.raises(ValidationError, match="sandbox.tree_cache_path needs sandbox.tree_cache_size"):
        SandboxConfig(tree_cache_path="/tmp/trees.jsonl")


def test_a_file_that_cannot_be_written_leaves_the_verdict_standing(tmp_path: Path) -> None:
    path = tmp_path / "trees.jsonl"
    cache = TreeCache(8)
    cache.attach(path, "E1")
    path.mkdir()  # appending now fails with IsADirectoryError
    answer = asyncio.run(cache.get_or_run("a", lambda: _verdict(_full())))
    again = asyncio.run(cache.get_or_run("a", lambda: _verdict(Verdict(status="completed"))))
    assert answer.resolution == again.resolution == "FULL" and cache.hits == 1
