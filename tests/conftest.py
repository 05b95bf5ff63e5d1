"""Shared fixtures: one PostgreSQL per session (AKADZE_TEST_URL or embedded), a fresh schema per test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import SplitResult, urlsplit

import kombu
import pytest

import kombu_akadze  # noqa: F401  (registers the akadze alias)
from kombu_akadze.integrations.testing import database_url, fresh_schema, store_for
from kombu_akadze.store import Store, wake_channel

# Short lease timings so rescue tests finish in seconds; heartbeat_ttl >= 2 x interval.
FAST = {"heartbeat_interval": 0.25, "heartbeat_ttl": 2.0, "rescue_interval": 0.25, "poll_interval": 0.5}


@pytest.fixture(scope="session")
def pg_url() -> str:
    return database_url()


@pytest.fixture
def tcp_pg(pg_url: str) -> SplitResult:
    """The test server's URL when it is reached over TCP (host:port), for the tests of URL forms, failover and
    PgBouncer. The embedded server listens on a socket only: they skip there; CI sets AKADZE_TEST_URL to a
    TCP server and fails rather than skips."""
    parts = urlsplit(pg_url)
    if not parts.hostname:
        reason = "needs PostgreSQL over TCP: AKADZE_TEST_URL=postgresql://user@127.0.0.1:5432/db"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI runs these tests, it never skips them)")
        pytest.skip(f"{reason} (the embedded server listens on a socket only)")
    return parts


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    with fresh_schema(pg_url) as name:
        yield name


@pytest.fixture
def store(pg_url: str, schema: str) -> Iterator[Store]:
    s = store_for(pg_url, schema)
    yield s
    s.close()


@pytest.fixture
def make_connection(pg_url: str, schema: str) -> Iterator[Any]:
    """Factory of kombu connections on the test schema; all closed at teardown."""
    made: list[kombu.Connection] = []

    def make(**options: Any) -> kombu.Connection:
        conn = kombu.Connection(f"akadze+{pg_url}", transport_options={"schema": schema, **FAST, **options})
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.release()


@pytest.fixture
def parked_listener(pg_url: str, schema: str) -> Iterator[Callable[..., Store]]:
    """Factory of consumers parked on a queue, as a claim that came back empty parks one, each LISTENing on
    its own wake channel: what a publish to that queue wakes. Closed at teardown."""
    made: list[Store] = []

    def park(queue: str, consumer: str = "parked") -> Store:
        listener = store_for(pg_url, schema)
        channel = wake_channel(schema, consumer)
        listener.listen_start(channel=channel)
        outcome = listener.message_ack_claim(acks=[], queues=[queue], limits=[1], owner=consumer, park=channel)
        assert outcome.claimed == [], "the queue must be empty to park on it"
        made.append(listener)
        return listener

    yield park
    for listener in made:
        listener.close()


def abandon_a_transaction(store: Store) -> None:
    """A transaction on the store's session that its caller abandons (ValueError): psycopg rolls it back,
    with DEALLOCATE ALL once it has prepared statements of its own."""
    with store.transaction():
        raise ValueError("abandon the transaction")
