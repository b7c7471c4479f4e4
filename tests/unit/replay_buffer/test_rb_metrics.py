"""Prometheus /metrics serves what Stats answers."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from rb_store_helpers import prompts, scored, start_run

from services.replay_buffer.metrics import start_metrics


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def test_metrics_endpoint_reports_the_store(make_store) -> None:
    store = await make_store(max_age=1)
    await store.enqueue(prompts(("a", 0), ("b", 0), ("c", 0)))
    epoch = await start_run(store, "w")
    la, lb = (await store.lease("w", 0, epoch, 2)).leases
    await store.submit(la.lease_id, scored("a", 0))
    await store.submit(lb.lease_id, scored("b", 0))
    await store.sample(1, 1, 0)
    await store.sample(2, 1, 0)  # "b" is now too old
    server = start_metrics(store, "127.0.0.1", 0)
    try:
        m = await asyncio.to_thread(_scrape, server.port)  # scrapes run off the event loop, as in production
    finally:
        server.stop()
    ns = "grpofleet_replay_buffer"
    assert m[f"{ns}_up"] == 1
    assert m[f"{ns}_enqueued_total"] == 3 and m[f"{ns}_sampled"] == 1
    assert m[f"{ns}_dead_lettered_total{{reason=too_old}}"] == 1
    assert m[f"{ns}_prompts_pending"] == 1 and m[f"{ns}_live_workers"] == 1
    assert m[f"{ns}_sample_age_steps_bucket{{le=1.0}}"] == 1 and m[f"{ns}_sample_age_steps_count"] == 1
