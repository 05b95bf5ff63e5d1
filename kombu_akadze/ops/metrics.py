"""Prometheus metrics of a schema through prometheus_client: one collector that reads one snapshot per scrape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client import make_wsgi_app as _wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from kombu_akadze.errors import AkadzeError
from kombu_akadze.ops import stats

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from kombu_akadze.store import FleetStats, StatsSnapshot, Store

logger = logging.getLogger("kombu_akadze")

STATES = ("ready", "held", "delayed")
DEFAULT_PORT = 9808

__all__ = ["DEFAULT_PORT", "AkadzeCollector", "make_registry", "make_wsgi_app", "render", "start_server"]


class AkadzeCollector(Collector):
    """Reads the store on every scrape: queue depth by state, oldest-ready age, messages retried after a
    rescue or requeue, dead letters, live consumers, PostgreSQL's own insert/delete counts of the
    messages and dead_letters tables (throughput at no cost per message) and the maintenance leader.

    Register it in ONE process per schema (``akadze metrics``, or the process that already serves
    metrics): every process would report the same fleet-wide figures."""

    def __init__(self, store: Store, *, ttl: float = stats.DEFAULT_CONSUMER_TTL) -> None:
        self.store = store
        self.ttl = ttl

    def describe(self) -> Iterator[Metric]:
        """The families without samples, so registering checks name clashes without a query."""
        return iter(_families(None, None, up=False))

    def collect(self) -> Iterator[Metric]:
        try:
            snap = stats.snapshot(self.store, ttl=self.ttl)
            fleet = self.store.fleet_stats(ttl=self.ttl)
        except AkadzeError as exc:  # the database is down: say so with akadze_up 0, keep serving
            logger.warning("kombu-akadze metrics: %s", exc)
            return iter(_families(None, None, up=False)[:1])
        return iter(_families(snap, fleet, up=True))


def _families(snap: StatsSnapshot | None, fleet: FleetStats | None, *, up: bool) -> list[Metric]:
    up_gauge = GaugeMetricFamily("akadze_up", "1 when the last scrape read the database, 0 when it could not.")
    up_gauge.add_metric([], 1 if up else 0)
    depth = GaugeMetricFamily(
        "akadze_queue_messages", "Messages per queue and state (delayed: ready later).", labels=["queue", "state"]
    )
    oldest = GaugeMetricFamily(
        "akadze_queue_oldest_ready_seconds",
        "Seconds the oldest ready message has been claimable (0: none).",
        labels=["queue"],
    )
    retried = GaugeMetricFamily(
        "akadze_queue_retried_messages",
        "Messages waiting or running again after a run that ended without an outcome (rescued lease, requeue).",
        labels=["queue"],
    )
    dead = GaugeMetricFamily("akadze_dead_letters", "Dead letters per queue.", labels=["queue"])
    alive = GaugeMetricFamily("akadze_consumers_alive", "Consumers whose heartbeat is within the TTL.")
    inserted = CounterMetricFamily(
        "akadze_messages_inserted",
        "Rows inserted into the messages table (published, replayed), as PostgreSQL's table statistics count them.",
    )
    deleted = CounterMetricFamily(
        "akadze_messages_deleted",
        "Rows deleted from the messages table (acked, dead-lettered, expired, purged), per PostgreSQL's statistics.",
    )
    buried = CounterMetricFamily(
        "akadze_dead_lettered", "Rows inserted into the dead_letters table, per PostgreSQL's table statistics."
    )
    leader = InfoMetricFamily(
        "akadze_maintenance_leader", "The consumer that runs the fleet's maintenance passes (absent: none alive)."
    )
    if snap is not None:
        for q in snap.queues:
            counts = {"ready": q.ready, "held": q.held, "delayed": q.delayed}
            for state in STATES:
                depth.add_metric([q.queue, state], counts[state])
            oldest.add_metric([q.queue], q.oldest_ready_age_seconds or 0.0)
            retried.add_metric([q.queue], q.retried)
            dead.add_metric([q.queue], q.dead)
        alive.add_metric([], snap.consumers_alive)
    if fleet is not None:
        inserted.add_metric([], fleet.messages_inserted)
        deleted.add_metric([], fleet.messages_deleted)
        buried.add_metric([], fleet.dead_lettered)
        if fleet.leader_id is not None:
            leader.add_metric(
                [],
                {
                    "consumer": fleet.leader_id,
                    "hostname": fleet.leader_hostname or "",
                    "pid": "" if fleet.leader_pid is None else str(fleet.leader_pid),
                },
            )
    return [up_gauge, depth, oldest, retried, dead, alive, inserted, deleted, buried, leader]


def make_registry(store: Store, *, ttl: float = stats.DEFAULT_CONSUMER_TTL) -> CollectorRegistry:
    """A registry holding only the akadze collector (no process metrics of this process)."""
    registry = CollectorRegistry()
    registry.register(AkadzeCollector(store, ttl=ttl))
    return registry


def render(store: Store, *, ttl: float = stats.DEFAULT_CONSUMER_TTL) -> str:
    """The current metrics of the store's schema in the Prometheus text format."""
    return generate_latest(make_registry(store, ttl=ttl)).decode("utf-8")


def make_wsgi_app(store: Store, *, ttl: float = stats.DEFAULT_CONSUMER_TTL) -> Callable[..., Any]:
    """prometheus_client's WSGI app on the akadze collector, to mount in an existing web app."""
    return _wsgi_app(make_registry(store, ttl=ttl))


def start_server(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    ttl: float = stats.DEFAULT_CONSUMER_TTL,
    registry: CollectorRegistry | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """prometheus_client's HTTP server (any path, text or OpenMetrics by the Accept header, gzip) in a
    daemon thread; *registry*, when given, gets the collector and is served (with what else it holds).
    The caller stops it with ``server.shutdown(); server.server_close()``."""
    if registry is None:
        registry = make_registry(store, ttl=ttl)
    else:
        registry.register(AkadzeCollector(store, ttl=ttl))
    return start_http_server(port, addr=host, registry=registry)
