"""The scored-group contract at the byte level, spoken by the rollout worker and the replay buffer (so it lives on the
ground floor, below both; it was `services/replay_buffer/codec.py`).

A scored group (8 samples x 2k tokens with log-probs and versions: ~130 KB; 2 MB in agent mode) travels as the bytes
the worker serialized: the worker writes them to a Redis payload key and submits a small `ScoredGroupHeader`
(SubmitGroups), the trainer reads them back by the keys Sample names, so the buffer never sees them at all. A client
without Redis access may still send them inline (`SubmitGroup.scored_group`), which the buffer checks and stores.

- `encode` (worker side) checks that a group is whole, serializes it once and fills the header from it.
- `submit_request` builds an inline SubmitGroup from it (grpcurl-style clients, test harnesses).
- `check_payload` (buffer side, inline submits) checks the header against what the payload's top level says
  (prompt, trajectory count, versions, per-trajectory sizes) by walking field tags and lengths, never the token
  arrays themselves.
"""

from __future__ import annotations

from collections.abc import Iterator

from grpofleet.v1 import common_pb2, replay_buffer_pb2

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, int, memoryview]]:
    """(field number, wire type, varint value or length, slice for length-delimited fields) at the top level."""
    pos, mv, empty = 0, memoryview(buf), memoryview(b"")
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield key >> 3, wire, value, empty
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            yield key >> 3, wire, 0, mv[pos : pos + size]
            pos += size
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            yield key >> 3, wire, size, mv[pos : pos + size]
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(buf):
        raise ValueError("truncated message")


def length_delimited_fields(buf: bytes, number: int) -> list[bytes]:
    """Every occurrence of length-delimited field `number` at the top level of a serialized message."""
    return [bytes(s) for n, wire, _, s in _fields(buf) if n == number and wire == _LEN]


def header_of(group: common_pb2.ScoredGroup) -> replay_buffer_pb2.ScoredGroupHeader:
    p = group.prompt
    return replay_buffer_pb2.ScoredGroupHeader(
        group_id=p.group_id, target_step=p.target_step, min_version=group.min_version,
        max_version=group.max_version, validation=p.validation,
        trajectory_tokens=[len(t.response_token_ids) for t in group.trajectories],
    )  # fmt: skip


def check_whole_group(g: common_pb2.ScoredGroup) -> None:
    """The worker-side check of a group before it is submitted (O(samples)): the buffer checks what it can read
    without decoding token arrays, this also checks that every per-token array has one entry per token. Versions
    within one sample never decrease (weights only move forward during a generation), so a sample's oldest token is
    its first and its newest its last."""
    n_traj = len(g.trajectories)
    if not n_traj:
        raise ValueError("group.trajectories must not be empty (submit whole groups)")
    if g.prompt.num_generations not in (0, n_traj):
        raise ValueError(f"group has {n_traj} trajectories, prompt asked for {g.prompt.num_generations}")
    for i, t in enumerate(g.trajectories):
        n = len(t.response_token_ids)
        if len(t.generation_logprobs) != n or len(t.token_versions) != n:
            raise ValueError(
                f"group.trajectories[{i}]: response_token_ids, generation_logprobs and token_versions differ in length"
            )


def encode(group: common_pb2.ScoredGroup) -> tuple[replay_buffer_pb2.ScoredGroupHeader, bytes]:
    """A whole group's header and bytes: checked, serialized once, the header filled from it (so the two agree)."""
    check_whole_group(group)
    data = group.SerializeToString()
    header = header_of(group)
    header.payload_bytes = len(data)
    return header, data


def submit_request(
    worker_id: str, lease_id: str, group: common_pb2.ScoredGroup
) -> replay_buffer_pb2.SubmitGroupRequest:
    """An inline SubmitGroup request for a scored group (the bytes in the call: for clients without Redis access)."""
    header, data = encode(group)
    return replay_buffer_pb2.SubmitGroupRequest(worker_id=worker_id, lease_id=lease_id, header=header,
                                                scored_group=data)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _prompt_facts(prompt: memoryview) -> tuple[bytes, int, int, bool]:
    """(group_id, target_step, num_generations, validation) of a serialized PromptGroup."""
    gid, ints = b"", {2: 0, 6: 0, 9: 0}
    for n, wire, value, s in _fields(prompt):
        if n == 1 and wire == _LEN:
            gid = bytes(s)
        elif n in ints and wire == _VARINT:
            ints[n] = value
    return gid, ints[2], ints[6], bool(ints[9])


def _trajectory_facts(traj: memoryview) -> tuple[int, int | None, int | None]:
    """(log-prob count, first token version, last token version) of a serialized Trajectory, from tags and lengths:
    packed log-probs are 4 bytes each; a packed version array's first and last varints are read at its two ends."""
    logprobs, first, last = 0, None, None
    for n, wire, value, s in _fields(traj):
        if n == 2:
            logprobs += len(s) // 4 if wire == _LEN else 1
        elif n == 3 and wire == _VARINT:
            first = value if first is None else first
            last = value
        elif n == 3 and wire == _LEN and len(s):
            i = len(s) - 1
            while i > 0 and s[i - 1] & 0x80:  # back to the byte after the previous varint's last byte
                i -= 1
            first = _varint(s, 0)[0] if first is None else first
            last = _varint(s, i)[0]
    return (
        logprobs,
        None if first is None else _signed(first),
        None if last is None else _signed(last),
    )


OBSERVATION_VERSION = -1
"""The token version of observation tokens (the Trajectory contract, protos/grpofleet/v1/common.proto)."""


def check_payload(h: replay_buffer_pb2.ScoredGroupHeader, payload: bytes) -> None:
    """Raise ValueError naming the first disagreement between the header and the serialized ScoredGroup, or the
    first rule of a whole group the payload breaks."""
    try:
        top = list(_fields(payload))
    except ValueError as exc:
        raise ValueError(f"scored_group is not a serialized ScoredGroup: {exc}") from None
    prompts = [s for n, w, _, s in top if n == 1 and w == _LEN]
    trajs = [s for n, w, _, s in top if n == 2 and w == _LEN]
    versions = {n: _signed(v) for n, w, v, _ in top if n in (4, 5) and w == _VARINT}
    _require(len(prompts) == 1, "scored_group must hold its prompt (ScoredGroup.prompt), once")
    gid, target, asked, validation = _prompt_facts(prompts[0])
    _require(gid == h.group_id.encode(), "header.group_id != scored_group.prompt.group_id")
    _require(target == h.target_step, "header.target_step != scored_group.prompt.target_step")
    _require(validation == h.validation, "header.validation != scored_group.prompt.validation")
    _require(versions.get(4, 0) == h.min_version, "header.min_version != scored_group.min_version")
    _require(versions.get(5, 0) == h.max_version, "header.max_version != scored_group.max_version")
    _require(len(trajs) == len(h.trajectory_tokens), "header.trajectory_tokens != the trajectories in scored_group")
    _require(len(trajs) > 0, "group.trajectories must not be empty (submit whole groups)")
    _require(
        asked in (0, len(trajs)), f"group has {len(trajs)} trajectories, prompt asked for {asked} (submit whole groups)"
    )
    for i, (t, tokens) in enumerate(zip(trajs, h.trajectory_tokens, strict=True)):
        logprobs, first, last = _trajectory_facts(t)
        _require(
            logprobs == tokens,
            f"group.trajectories[{i}]: {logprobs} log-probs for {tokens} tokens (they differ in length)",
        )
        # -1: an observation token (agent mode, computer use), made by no weights; a computer-use episode starts
        # with one (the first screenshot), so only versions of generated tokens are bounded below.
        _require(first is None or first == OBSERVATION_VERSION or first >= h.min_version,
                 f"group.trajectories[{i}] has a token of version {first} < group.min_version")  # fmt: skip
        _require(last is None or last <= h.max_version,
                 f"group.trajectories[{i}] has a token of version {last} > group.max_version")  # fmt: skip


def prompt_of(kind: str, payload: bytes) -> common_pb2.PromptGroup:
    """The PromptGroup of a leased entry (a group re-queued by an older buffer is stored as its ScoredGroup, which
    holds the prompt)."""
    if kind == "scored":
        return common_pb2.PromptGroup.FromString(length_delimited_fields(payload, 1)[0])
    return common_pb2.PromptGroup.FromString(payload)
