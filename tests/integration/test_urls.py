"""Broker URLs against real PostgreSQL: both forms, libpq options, kombu failover to an alternate."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import kombu
import pytest

import kombu_akadze  # noqa: F401  (registers the aliases)
from kombu_akadze.transport import Transport


def free_port() -> int:
    """A port nobody listens on: a dead host for failover."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live(tcp_pg: Any) -> Any:
    """The test server's parts: (user@)host:port, database."""
    return tcp_pg


@pytest.fixture
def connections() -> Iterator[list[kombu.Connection]]:
    made: list[kombu.Connection] = []
    yield made
    for conn in made:
        conn.release()


def round_trip(conn: kombu.Connection, queue: str) -> None:
    simple = conn.SimpleQueue(queue)
    simple.put({"via": conn.hostname})
    msg = simple.get(timeout=20)
    assert msg.payload == {"via": conn.hostname}
    msg.ack()
    simple.close()


def url(scheme: str, live: Any, port: int | None = None, query: str = "") -> str:
    auth = f"{live.username}{':' + live.password if live.password else ''}@" if live.username else ""
    return f"{scheme}://{auth}{live.hostname}:{port or live.port or 5432}{live.path}{'?' + query if query else ''}"


@pytest.mark.parametrize("scheme", ["akadze", "akadze+postgresql"])
def test_both_url_forms_connect_with_libpq_options_in_the_query(
    scheme: str, live: Any, schema: str, connections: list[kombu.Connection]
) -> None:
    conn = kombu.Connection(
        url(scheme, live, query="sslmode=prefer&target_session_attrs=read-write&application_name=akadze-test"),
        transport_options={"schema": schema},
    )
    connections.append(conn)
    assert isinstance(conn.transport, Transport)
    assert "application_name=akadze-test" in conn.transport.dsn
    round_trip(conn, f"q-{scheme}")


def test_an_akadze_url_gives_kombu_the_attributes_amqp_gives(live: Any, schema: str) -> None:
    conn = kombu.Connection(url("akadze", live), transport_options={"schema": schema})
    conn.connect()
    try:
        assert (conn.hostname, conn.port, conn.userid, conn.virtual_host) == (
            live.hostname,
            live.port or 5432,
            live.username,
            live.path[1:],
        )
        assert conn.as_uri() == url("akadze", live).replace(f":{live.password}@", ":**@")
    finally:
        conn.release()


@pytest.mark.parametrize("scheme", ["akadze", "akadze+postgresql"])
@pytest.mark.parametrize("how", ["semicolons", "list", "alternates"])
def test_failover_skips_a_dead_host_and_works_on_the_next(
    scheme: str, how: str, live: Any, schema: str, connections: list[kombu.Connection]
) -> None:
    dead, alive = url(scheme, live, port=free_port()), url(scheme, live)
    options: dict[str, Any] = {"transport_options": {"schema": schema, "connect_timeout": 5}}
    if how == "semicolons":
        conn = kombu.Connection(f"{dead};{alive}", **options)
    elif how == "list":
        conn = kombu.Connection([dead, alive], failover_strategy="shuffle", **options)
    else:
        conn = kombu.Connection(dead, alternates=[alive], failover_strategy="round-robin", **options)
    connections.append(conn)
    # shuffle may pick the dead host again: enough retries that it cannot plausibly do so every time
    conn.ensure_connection(max_retries=30, interval_start=0, interval_step=0.1, interval_max=0.2)
    assert (conn.hostname, conn.port) == (live.hostname, live.port or 5432)
    round_trip(conn, f"fo-{how}")
    producer = conn.Producer()
    producer.publish({"again": 1}, routing_key=f"fo-{how}", declare=[kombu.Queue(f"fo-{how}")])
    assert conn.SimpleQueue(f"fo-{how}").get(timeout=20).payload == {"again": 1}
