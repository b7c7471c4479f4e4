"""`Outage`: one line when an outage starts, one per report period while it lasts, one when it ends, however many
calls report it; past the bound, `ServiceDown` names what is down and what the service last said about it."""

from __future__ import annotations

import logging
import time

import pytest

from services.runtime.outage import Outage, ServiceDown


def test_many_failed_calls_of_one_outage_log_one_start_and_one_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = Outage("replay buffer at h:1", 600, report_every_s=3600)
    for _ in range(50):
        outage.failed("UNAVAILABLE: failed to connect")
    outage.recovered()
    outage.recovered()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "replay buffer at h:1 is unavailable (UNAVAILABLE: failed to connect)" in messages[0]
    assert "services.outage_tolerance_s" in messages[0]
    assert "replay buffer at h:1 is back after" in messages[1]
    assert outage.outages == 1 and not outage.active


def test_past_the_bound_the_error_names_the_service_and_its_last_answer() -> None:
    outage = Outage("replay buffer at h:1", 0.2, report_every_s=3600)
    outage.failed("UNAVAILABLE: backend unavailable: redis at unix:///r.sock is unavailable", answered=True)
    with pytest.raises(ServiceDown) as err:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            outage.failed("UNAVAILABLE: failed to connect")
            time.sleep(0.05)
    message = str(err.value)
    assert message.startswith("replay buffer at h:1 has been down for")
    assert "longer than services.outage_tolerance_s=0.2: UNAVAILABLE: failed to connect" in message
    assert "(before that: UNAVAILABLE: backend unavailable: redis at unix:///r.sock is unavailable)" in message
