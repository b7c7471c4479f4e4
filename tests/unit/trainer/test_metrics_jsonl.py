"""The metrics JSONL is read while the trainer appends to it: a reader sees whole records or none."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.metrics import JsonlBackend, read_jsonl


def test_a_record_longer_than_a_text_buffer_lands_in_one_write(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import trainer.metrics as metrics

    writes: list[bytes] = []
    real_write = metrics.os.write
    monkeypatch.setattr(metrics.os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    backend = JsonlBackend(tmp_path / "metrics.jsonl")
    big = {f"metric/{i:04d}": float(i) for i in range(1000)}  # ~20 KB: more than a line-buffered file's 8 KiB
    backend.log(3, big)
    backend.close()
    assert len(writes) == 1 and writes[0].endswith(b"\n") and len(writes[0]) > 16384
    (record,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert record["step"] == 3 and record["metric/0999"] == 999.0


def test_reader_skips_a_last_line_whose_newline_has_not_landed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    whole = json.dumps({"step": 0, "loss/loss": 1.0})
    path.write_text(whole + "\n" + whole[:12])  # a writer caught mid-record
    assert read_jsonl(path) == [{"step": 0, "loss/loss": 1.0}]
    path.write_text(whole + "\n" + whole + "\n")
    assert len(read_jsonl(path)) == 2


def test_reader_of_a_missing_file_finds_no_records(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_non_finite_metrics_are_written_as_null(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "m.jsonl")
    backend.log(0, {"a": float("inf"), "b": float("nan"), "c": 2.0})
    backend.close()
    (record,) = read_jsonl(tmp_path / "m.jsonl")
    assert record["a"] is None and record["b"] is None and record["c"] == 2.0
