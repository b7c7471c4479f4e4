"""The report stream between the trusted runner (inside the sandbox) and the executor (outside).

One record per line: `SEQ<TAB>MAC<TAB>JSON`. SEQ counts from 0 with no gaps; MAC is keyed BLAKE2b (128 bits, 32 hex
digits) of `SEQ<TAB>JSON` under a key the executor hands the runner through a pipe that is read and closed before any
code of the tree is imported. (BLAKE2b's keyed mode is a MAC by design, and a third of HMAC-SHA256's cost on a short
record: ~1,400 records per 455-test run are signed by the runner and checked by the executor.) A line written by
anything but the runner (a test that found the fd, a child process) fails the MAC or breaks the sequence: the
executor reports it as an integrity violation rather than trusting it.

The encoder uses C functions bound at import (before the tree's code runs), so code under test cannot change what a
record says by monkeypatching `json` or `hashlib`.
"""

from __future__ import annotations

import json
from _blake2 import blake2b as _blake2b
from json.encoder import c_encode_basestring_ascii as _c_escape  # type: ignore[attr-defined]
from typing import Any

KEY_BYTES = 32
_escape = _c_escape or json.encoder.encode_basestring_ascii


def mac(key: bytes, seq: int, payload: str) -> str:
    return _blake2b(f"{seq}\t{payload}".encode(), digest_size=16, key=key).hexdigest()


def _dump(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, str):
        return str(_escape(value))
    if isinstance(value, list):
        return "[" + ",".join(_dump(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_escape(str(k))}:{_dump(v)}" for k, v in value.items()) + "}"
    return "null"


def encode(key: bytes, seq: int, record: dict[str, Any]) -> bytes:
    return encode_payload(key, seq, _dump(record))


def test_payload(nodeid: str, when: str, outcome: str, xfail: bool) -> str:
    """The JSON of one test-phase record, built directly: it is written ~3 times per test."""
    return (f'{{"k":"t","id":{_escape(nodeid)},"w":{_escape(when)},"o":{_escape(outcome)},'
            f'"x":{"true" if xfail else "false"}}}')


def encode_payload(key: bytes, seq: int, payload: str) -> bytes:
    return f"{seq}\t{mac(key, seq, payload)}\t{payload}\n".encode()


def verify(key: bytes, expected_seq: int, line: bytes) -> str:
    """The JSON text of one line, once its number and signature check out; ValueError says why it is not the
    runner's."""
    try:
        seq_text, tag, payload = line.decode("ascii").rstrip("\n").split("\t", 2)
        seq = int(seq_text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError("a line that is not a runner record") from exc
    if seq != expected_seq:
        raise ValueError(f"record {seq} where {expected_seq} was due")
    if not _compare(tag, mac(key, seq, payload)):
        raise ValueError(f"record {seq} does not carry the runner's signature")
    return payload


def parse(seq: int, payload: str) -> dict[str, Any]:
    """The record of a verified payload; ValueError if it is not one."""
    try:
        record = json.loads(payload)
    except ValueError as exc:
        raise ValueError(f"record {seq} is not JSON") from exc
    if not isinstance(record, dict) or not isinstance(record.get("k"), str):
        raise ValueError(f"record {seq} is not a runner record")
    return record


def parse_many(payloads: list[str]) -> list[dict[str, Any]] | None:
    """All verified payloads in one `json.loads` (a fifth of the cost of one call per record); None when any one of
    them is not a single record, so that the caller finds which with `parse`."""
    try:
        records = json.loads("[" + ",".join(payloads) + "]")
    except ValueError:
        return None
    if len(records) != len(payloads) or not all(isinstance(r, dict) and isinstance(r.get("k"), str)
                                                for r in records):
        return None
    return list(records)


def decode(key: bytes, expected_seq: int, line: bytes) -> dict[str, Any]:
    """The record of one line; ValueError says why the line is not the runner's."""
    return parse(expected_seq, verify(key, expected_seq, line))


def _compare(a: str, b: str) -> bool:
    import hmac  # the executor's side only: the runner never loads it

    return hmac.compare_digest(a, b)
