"""Prometheus `/metrics` for the replay buffer, on `replay_buffer.metrics_port`.

Each scrape reads the store's Stats, so what Prometheus sees is exactly what `Stats` answers. prometheus_client
serves scrapes from its own thread; the collector hands the read to the service's event loop (the Redis client
belongs to it) and waits for the answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from services.replay_buffer.models import StoreStats
from services.replay_buffer.store import ReplayStore

log = logging.getLogger(__name__)

_NS = "grpofleet_replay_buffer"
_SCRAPE_TIMEOUT_S = 5.0
_COUNTERS = {
    "enqueued": "Unique prompt groups enqueued.",
    "duplicates": "Enqueues of an already known group id.",
    "leased": "Leases granted.",
    "reclaimed": "Leases reclaimed after the lease timeout.",
    "released": "Leases given back by workers.",
    "submitted": "Scored groups stored.",
    "requeued": "Groups queued again (tokens from weights a resume discarded).",
    "returned_on_resume": "Sampled groups returned to the store by BeginRun.",
    "committed": "Sampled groups deleted after their step's checkpoint.",
}
_GAUGES = {
    "prompts_pending": "Prompt groups not yet submitted (queued + leased).",
    "leases_outstanding": "Leases held by workers.",
    "groups_ready": "Scored training groups waiting to be sampled.",
    "validation_ready": "Scored validation groups waiting.",
    "uncommitted": "Sampled groups kept until a checkpoint commits their step.",
    "epoch": "Run epoch.",
    "current_version": "Weight version the trainer published last.",
    "current_step": "Step the trainer samples for.",
    "live_workers": "Workers with a recent heartbeat.",
}


class StoreCollector(Collector):
    def __init__(self, store: ReplayStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        try:
            stats = asyncio.run_coroutine_threadsafe(self._store.stats(), self._loop).result(_SCRAPE_TIMEOUT_S)
        except Exception as exc:  # a scrape must not raise: report the failure as a metric instead
            log.warning("metrics scrape failed: %r", exc)
            up = GaugeMetricFamily(f"{_NS}_up", "1 when the store answered the scrape.")
            up.add_metric([], 0)
            return [up]
        return list(_families(stats))


def _families(s: StoreStats) -> Iterator[Metric]:
    up = GaugeMetricFamily(f"{_NS}_up", "1 when the store answered the scrape.")
    up.add_metric([], 1)
    yield up
    for name, doc in _COUNTERS.items():
        yield CounterMetricFamily(f"{_NS}_{name}", doc, value=s.counters.get(name, 0))
    sampled = GaugeMetricFamily(f"{_NS}_sampled", "Groups sampled (net of those returned on resume).")
    sampled.add_metric([], s.counters.get("sampled", 0))
    yield sampled
    dead = CounterMetricFamily(f"{_NS}_dead_lettered", "Groups dead-lettered, by reason.", labels=["reason"])
    for reason, n in sorted(s.dead_by_reason.items()):
        dead.add_metric([reason], n)
    yield dead
    for name, doc in _GAUGES.items():
        yield GaugeMetricFamily(f"{_NS}_{name}", doc, value=getattr(s, name))
    # Ages are small integers: one cumulative bucket per age seen, as a Prometheus histogram.
    buckets, total, cum = [], 0, 0
    for age in sorted(s.age_histogram):
        cum += s.age_histogram[age]
        total += age * s.age_histogram[age]
        buckets.append((str(float(age)), cum))
    buckets.append(("+Inf", cum))
    yield HistogramMetricFamily(
        f"{_NS}_sample_age_steps", "Age (step - min_version) of sampled groups.", buckets=buckets, sum_value=total
    )


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics(store: ReplayStore, host: str, port: int) -> MetricsServer:
    """Serve /metrics on host:port (0 = a free port) from a daemon thread. Call from the service's event loop."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, asyncio.get_running_loop()))
    server, thread = start_http_server(port, addr=host, registry=registry)
    m = MetricsServer(server, thread)
    log.info("replay_buffer metrics on http://%s:%d/metrics", host, m.port)
    return m
