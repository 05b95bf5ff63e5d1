"""Prometheus metrics served by prometheus_client against real PostgreSQL, read back with the client's own parsers."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.ops import metrics
from kombu_akadze.store import NewMessage, Store

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "kombu-akadze.json"
WEIRD = 'we"ird\\q\nx'


@pytest.fixture
def endpoint(store: Store) -> Iterator[str]:
    server, thread = metrics.start_server(store, port=0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read().decode("utf-8"), resp.headers["Content-Type"]


def samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(found: list[Sample], name: str, **labels: str) -> float:
    matching = [s.value for s in found if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, f"{name}{labels}: {matching}"
    return matching[0]


def fill(store: Store) -> None:
    """Two ready messages in a queue with a hostile name, one dead letter, one requeued message, a live
    consumer (the leader): every family has a sample."""
    store.message_insert_many([NewMessage(queue=WEIRD, body=b"x") for _ in range(2)])
    store.consumer_heartbeat(consumer_id="worker-1", hostname="host-a", pid=42)
    for queue in ("dead-q", "retry-q"):
        store.message_insert(NewMessage(queue=queue, body=b"y"))
    (dead,) = store.message_claim(queues=["dead-q"], limits=[1], owner="worker-1")
    store.message_bury([dead.tag], reason="bad input", owner="worker-1")
    (retry,) = store.message_claim(queues=["retry-q"], limits=[1], owner="worker-1")
    store.message_requeue([retry.tag], max_attempts=5, owner="worker-1")


def test_the_endpoint_serves_every_family_with_escaped_labels(store: Store, endpoint: str) -> None:
    fill(store)
    text, content_type = scrape(endpoint)
    assert content_type.startswith("text/plain; version=0.0.4")
    found = samples(text)
    assert value(found, "akadze_up") == 1
    assert value(found, "akadze_queue_messages", queue=WEIRD, state="ready") == 2
    assert value(found, "akadze_queue_messages", queue="dead-q", state="held") == 0
    assert value(found, "akadze_dead_letters", queue="dead-q") == 1
    assert value(found, "akadze_queue_retried_messages", queue="retry-q") == 1
    assert value(found, "akadze_queue_retried_messages", queue=WEIRD) == 0
    assert value(found, "akadze_queue_oldest_ready_seconds", queue="dead-q") == 0
    assert value(found, "akadze_queue_oldest_ready_seconds", queue=WEIRD) >= 0
    assert value(found, "akadze_consumers_alive") == 1
    assert value(found, "akadze_maintenance_leader_info", consumer="worker-1", hostname="host-a", pid="42") == 1


def test_openmetrics_is_served_when_the_scraper_asks_for_it(store: Store, endpoint: str) -> None:
    fill(store)
    text, content_type = scrape(endpoint, accept="application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["akadze_messages_inserted"].type == "counter"
    assert families["akadze_maintenance_leader"].type == "info"
    assert [s.value for s in families["akadze_consumers_alive"].samples] == [1]


def test_throughput_counters_follow_postgresql_table_statistics(store: Store, endpoint: str) -> None:
    """Five published, three acked, one dead-lettered: the counters come from pg_stat_user_tables,
    which a backend reports at the end of its transactions, so they are waited for."""
    store.message_insert_many([NewMessage(queue="q", body=b"x") for _ in range(5)])
    store.consumer_heartbeat(consumer_id="w", hostname="h", pid=1)
    claimed = store.message_claim(queues=["q"], limits=[4], owner="w")
    store.message_ack([m.tag for m in claimed[:3]], owner="w")
    store.message_bury([claimed[3].tag], reason="bad", owner="w")
    want = {"akadze_messages_inserted_total": 5, "akadze_messages_deleted_total": 4, "akadze_dead_lettered_total": 1}

    def counters() -> dict[str, float] | None:
        found = samples(scrape(endpoint)[0])
        got = {name: value(found, name) for name in want}
        return got if got == want else None

    eventually(counters, timeout=60, interval=0.5, what=f"counters reach {want}")


def test_a_registry_of_the_caller_serves_its_own_metrics_beside_akadze(store: Store) -> None:
    registry = CollectorRegistry()
    Counter("app_tasks", "Tasks run by the app.", registry=registry).inc(3)
    server, thread = metrics.start_server(store, port=0, registry=registry)
    try:
        found = samples(scrape(f"http://127.0.0.1:{server.server_address[1]}/")[0])
        assert value(found, "app_tasks_total") == 3
        assert value(found, "akadze_up") == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_database_that_cannot_be_reached_is_reported_as_akadze_up_zero() -> None:
    """Nothing listens on port 1: the scrape still answers, with akadze_up 0 and no stale figures."""
    unreachable = Store("postgresql://postgres@127.0.0.1:1/test", schema="akadze", role="cli")
    try:
        found = samples(metrics.render(unreachable))
    finally:
        unreachable.close()
    assert [(s.name, s.value) for s in found] == [("akadze_up", 0)]


def test_render_is_the_text_of_the_same_collector(store: Store) -> None:
    fill(store)
    found = samples(metrics.render(store))
    assert value(found, "akadze_queue_messages", queue=WEIRD, state="ready") == 2


def dashboard_names() -> dict[str, set[str]]:
    """Every akadze_* name each panel (and the queue variable) queries, by panel title."""
    board = json.loads(DASHBOARD.read_text())
    names = {
        panel["title"]: {n for t in panel["targets"] for n in re.findall(r"\bakadze_[a-z_]+", t["expr"])}
        for panel in board["panels"]
    }
    variables = board["templating"]["list"]
    names["$queue"] = {
        n for v in variables if v["type"] == "query" for n in re.findall(r"\bakadze_[a-z_]+", v["query"]["query"])
    }
    return names


def test_the_grafana_dashboard_queries_only_what_the_collector_exports(store: Store, endpoint: str) -> None:
    fill(store)
    exported = {s.name for s in samples(scrape(endpoint)[0])}
    by_panel = dashboard_names()
    for title, names in by_panel.items():
        assert names, f"panel {title!r} queries no akadze metric"
        assert names <= exported, (
            f"panel {title!r} queries {sorted(names - exported)}, not exported: {sorted(exported)}"
        )
    used = set().union(*by_panel.values())
    for needed in (
        "akadze_queue_messages",
        "akadze_queue_oldest_ready_seconds",
        "akadze_messages_deleted_total",
        "akadze_queue_retried_messages",
        "akadze_dead_letters",
    ):
        assert needed in used, f"the dashboard has no panel on {needed}"
