"""Wire-level shortcuts for the two messages that carry whole scored groups (~130 KB each: 8 samples x 2k tokens
with log-probs and versions), so the buffer never re-encodes what it only stores and returns.

- SubmitGroup: the request is parsed (its fields are validated), and the `group` field's bytes are sliced out of the
  request as they arrived instead of being serialized again.
- Sample: the stored group bytes are framed straight into a `SampleResponse` (a repeated message field is a sequence
  of tag, length, bytes) instead of being parsed and serialized again.

Both produce exactly what the generated code would accept; tests compare them with the generated (de)serializers.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpofleet.v1 import common_pb2, replay_buffer_pb2

_SUBMIT_GROUP_FIELD = 3  # SubmitGroupRequest.group
_SAMPLE_GROUPS_TAG = (1 << 3) | 2  # SampleResponse.groups, length-delimited
_SAMPLE_STARVATION_TAG = (2 << 3) | 2  # SampleResponse.starvation


@dataclass(frozen=True)
class SubmitEnvelope:
    """What the SubmitGroup handler receives: the parsed request and the group's bytes as sent."""

    request: replay_buffer_pb2.SubmitGroupRequest
    group_bytes: bytes


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited_fields(buf: bytes, number: int) -> list[bytes]:
    """Every occurrence of length-delimited field `number` at the top level of a serialized message."""
    found, pos, mv = [], 0, memoryview(buf)
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if key >> 3 == number:
                found.append(bytes(mv[pos : pos + size]))
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != len(buf):
        raise ValueError("truncated message")
    return found


def decode_submit(raw: bytes) -> SubmitEnvelope:
    request = replay_buffer_pb2.SubmitGroupRequest.FromString(raw)  # raises DecodeError on garbage, like generated
    slices = length_delimited_fields(raw, _SUBMIT_GROUP_FIELD)
    # A field sent in several pieces is legal protobuf (the parser merges them): fall back to re-encoding.
    group_bytes = slices[0] if len(slices) == 1 else request.group.SerializeToString()
    return SubmitEnvelope(request, group_bytes)


def encode_sample(payloads: list[bytes], starvation: replay_buffer_pb2.Starvation | None) -> bytes:
    parts: list[bytes] = []
    for p in payloads:
        parts += [bytes((_SAMPLE_GROUPS_TAG,)), _encode_varint(len(p)), p]
    if starvation is not None:
        s = starvation.SerializeToString()
        parts += [bytes((_SAMPLE_STARVATION_TAG,)), _encode_varint(len(s)), s]
    return b"".join(parts)


def serialize_sample(response: bytes | replay_buffer_pb2.SampleResponse) -> bytes:
    """Response serializer of Sample: pre-framed bytes pass through; a message (e.g. from a test) is serialized."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def prompt_of(kind: str, payload: bytes) -> common_pb2.PromptGroup:
    """The PromptGroup of a leased entry (a re-queued group is stored as its ScoredGroup, which holds the prompt)."""
    if kind == "scored":
        return common_pb2.ScoredGroup.FromString(payload).prompt
    return common_pb2.PromptGroup.FromString(payload)
