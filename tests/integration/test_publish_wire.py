"""Publishes sent through libpq directly (store.wire): every field as stored, errors, reconnects, real PG."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from kombu_akadze.errors import DatabaseError, TransientDatabaseError
from kombu_akadze.store import NewMessage, Store, sqlfiles
from tests.conftest import abandon_a_transaction

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())
OWNER = "wire-consumer"
#: A queue name that breaks naive quoting in SQL text and in array literals.
AWKWARD = "q 'x' \"y\" \\z, {w} caf\u00e9"


@pytest.fixture(params=[True, False], ids=["prepared", "unprepared"])
def publisher(request: pytest.FixtureRequest, pg_url: str, schema: str) -> Iterator[Store]:
    s = Store(pg_url, schema=schema, role="wirepub", prepared_statements=request.param)
    yield s
    s.close()


def _inspect(store: Store, name: str, **params: object) -> list[tuple[object, ...]]:
    query = SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema))
    with store.connection().cursor() as cur:
        cur.execute(query, params, prepare=False)
        return cur.fetchall() if cur.description else []


def test_every_field_of_a_publish_is_stored_as_given(publisher: Store, store: Store) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    headers = {"eta": when, "id": uuid.UUID(int=9), "price": Decimal("1.10"), "text": "caf\u00e9 \"'\\", "n": [1, None]}
    body = bytes(range(256))
    message_id = publisher.message_insert(
        NewMessage(
            queue=AWKWARD,
            body=body,
            priority=7,
            content_type="application/x-test",
            content_encoding="binary",
            headers=headers,
            properties={"delivery_mode": 2, "x": {"y": [1.5]}},
            ttl=3600.25,
        )
    )
    assert message_id is not None
    assert _inspect(store, "message_expires_in", id=message_id) == [(3600.25, "ready")]
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    (got,) = store.message_claim(queues=[AWKWARD], limits=[5], owner=OWNER)
    assert (got.id, got.queue, got.body, got.priority) == (message_id, AWKWARD, body, 7)
    assert (got.content_type, got.content_encoding) == ("application/x-test", "binary")
    assert got.headers == headers
    assert got.properties == {"delivery_mode": 2, "x": {"y": [1.5]}}


def test_a_publish_due_later_waits_in_delayed(publisher: Store, store: Store) -> None:
    later = publisher.message_insert(NewMessage(queue="q", body=b"later", delay=30.5))
    hour_later = datetime.now(UTC) + timedelta(hours=1)
    far = publisher.message_insert(NewMessage(queue="q", body=b"far", not_before=hour_later))
    transient = publisher.message_insert(NewMessage(queue="q", body=b"now", durable=False))
    counts = store.message_counts()
    assert counts == {("q", "delayed"): 2, ("q", "ready"): 1}, (later, far, transient)
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    assert [m.body for m in store.message_claim(queues=["q"], limits=[5], owner=OWNER)] == [b"now"]


def test_a_refused_publish_leaves_the_session_as_it_was(publisher: Store) -> None:
    publisher.message_insert(NewMessage(queue="q", body=b"first"))
    pid = publisher.connection().info.backend_pid
    with pytest.raises(DatabaseError, match="NUL character"):
        publisher.message_insert(NewMessage(queue="q", body=b"bad", headers={"x": "a\x00b"}))
    assert publisher.message_insert(NewMessage(queue="q", body=b"after")) is not None
    assert publisher.connection().info.backend_pid == pid, "an error the server reported needs no reconnect"


def test_a_publish_on_a_session_the_server_ended_fails_transiently_then_reconnects(
    publisher: Store, store: Store, pg_url: str
) -> None:
    publisher.message_insert(NewMessage(queue="q", body=b"before"))
    before = _inspect(publisher, "prepared_names")
    assert (("akadze_message_insert",) in before) is publisher.prepared_statements
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute(SQL["terminate_sessions"], {"name": "akadze-wirepub"}).fetchone() == (1,)
    with pytest.raises(TransientDatabaseError):
        publisher.message_insert(NewMessage(queue="q", body=b"lost with its session"))
    assert publisher.message_insert(NewMessage(queue="q", body=b"after")) is not None
    after = _inspect(publisher, "prepared_names")
    assert (("akadze_message_insert",) in after) is publisher.prepared_statements, "prepared again on the new session"
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    assert [m.body for m in store.message_claim(queues=["q"], limits=[5], owner=OWNER)] == [b"before", b"after"]


def test_a_publish_through_an_exchange_says_which_queues_got_a_copy(publisher: Store) -> None:
    publisher.exchange_declare(name="ex", type="direct", durable=True, auto_delete=False)
    for queue, key in ((AWKWARD, "k"), ("other", "k"), ("elsewhere", "z")):
        publisher.queue_declare(name=queue)
        publisher.binding_declare(exchange="ex", routing_key=key, queue=queue, pattern="")
    queues, matched = publisher.message_route(NewMessage(queue="", body=b"m"), exchange="ex", routing_key="k")
    assert (sorted(queues), matched) == (sorted([AWKWARD, "other"]), 2)
    assert publisher.message_route(NewMessage(queue="", body=b"m"), exchange="ex", routing_key="nobody") == ([], 0)


def test_a_rolled_back_transaction_on_the_session_keeps_publishes_working(publisher: Store) -> None:
    """psycopg ends a rolled-back transaction with DEALLOCATE ALL once it has prepared statements of its own:
    the publish statement goes with them, and the store prepares it again instead of failing."""
    publisher.message_insert(NewMessage(queue="q", body=b"first"))
    for _ in range(6):  # psycopg prepares a query of its own after its fifth run
        publisher.queue_size(name="q")
    with pytest.raises(ValueError, match="abandon"):
        abandon_a_transaction(publisher)
    assert ("akadze_message_insert",) not in _inspect(publisher, "prepared_names"), "the premise: it was deallocated"
    pid = publisher.connection().info.backend_pid
    assert publisher.message_insert(NewMessage(queue="q", body=b"after the rollback")) is not None
    assert (("akadze_message_insert",) in _inspect(publisher, "prepared_names")) is publisher.prepared_statements
    assert publisher.connection().info.backend_pid == pid


def test_a_publish_whose_statement_was_deallocated_behind_its_back_prepares_it_again(publisher: Store) -> None:
    publisher.message_insert(NewMessage(queue="q", body=b"first"))
    _inspect(publisher, "prepared_drop_all")
    pid = publisher.connection().info.backend_pid
    assert publisher.message_insert(NewMessage(queue="q", body=b"second")) is not None
    assert publisher.connection().info.backend_pid == pid, "prepared again on the same session"
    assert publisher.queue_size(name="q") == 2
