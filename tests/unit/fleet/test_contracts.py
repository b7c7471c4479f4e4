"""The ground floor's contracts: one frozen weights identity, ordered by (epoch, version), carried whole by a push."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fleet.contracts.buffer import Starvation
from fleet.contracts.weights import NO_WEIGHTS, WeightsId
from grpofleet.v1 import common_pb2
from weightsync.header import WeightSnapshot, decode_header


def test_a_later_run_epoch_is_newer_whatever_its_version() -> None:
    assert WeightsId(2, 0) > WeightsId(1, 9) > WeightsId(1, 3) > NO_WEIGHTS
    assert WeightsId(1, 3) == WeightsId(1, 3) and str(WeightsId(1, 3)) == "v3 (epoch 1)"


def test_the_identity_is_minted_once_and_travels_through_the_header() -> None:
    snap = WeightSnapshot(WeightsId(4, 7), {"w": torch.zeros(2, 3)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.id = WeightsId(5, 7)  # type: ignore[misc]
    header = snap.header()
    assert (header.epoch, header.version) == (4, 7)
    _, ws = decode_header(common_pb2.WeightChunk(header=header), {"w": ((2, 3), "float32")})
    assert ws.id == snap.id and (ws.epoch, ws.version) == (4, 7)


def test_starvation_describes_why_a_sample_came_back_short() -> None:
    s = Starvation("generating", prompts_pending=3, waited_s=1.5)
    assert s.describe() == "generating: 3 prompts pending, 0 leases out, 0 live workers, 0 evicted, waited 1.5s"
