"""Transactional enqueue on the caller's psycopg connection: commit runs, rollback and savepoints leave nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import kombu
import psycopg
import pytest
from celery import Celery, group
from kombu import Exchange, Queue

from kombu_akadze.integrations import outbox
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import NewMessage, Store, handoff_message

ADD = "outbox_test.add"


def make_app(pg_url: str, schema: str, **conf: Any) -> Celery:
    app = Celery("outbox_test", broker=f"akadze+{pg_url}", set_as_current=False)
    app.conf.update(broker_transport_options={"schema": schema}, task_ignore_result=True, **conf)
    app.task(name=ADD, shared=False)(add)  # shared=False: later apps of the session do not inherit it
    return app


def add(x: int, y: int) -> int:
    return x + y


@pytest.fixture
def app(pg_url: str, schema: str) -> Iterator[Celery]:
    celery_app = make_app(pg_url, schema)
    yield celery_app
    celery_app.close()


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The application's own connection: not autocommit, so every statement is in its transaction."""
    with psycopg.connect(pg_url) as c:
        yield c


def enqueue_then_fail(conn: psycopg.Connection[Any], app: Celery, args: tuple[int, int]) -> None:
    """Enqueue in a transaction block (a savepoint when nested) that then fails: the block rolls back."""
    with conn.transaction():
        outbox.enqueue(conn, app.tasks[ADD], args)
        raise RuntimeError("the order could not be saved")


def get_one(make_connection: Any, queue: str = "celery") -> kombu.Message:
    """One message through the akadze transport's consume path, acked; what a worker would receive."""
    channel = make_connection().default_channel
    message = channel.basic_get(queue=queue, no_ack=True)
    assert message is not None, f"no message in {queue!r}"
    return message


def test_committed_enqueue_is_the_message_apply_async_would_publish(
    app: Celery, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[NewMessage] = []
    enqueued: list[NewMessage] = []
    insert, insert_on = Store.message_insert, Store.message_insert_on

    def spy(self: Store, message: NewMessage, **kw: Any) -> int | None:
        published.append(message)
        return insert(self, message, **kw)

    def spy_on(self: Store, c: Any, message: NewMessage, **kw: Any) -> int | None:
        enqueued.append(message)
        return insert_on(self, c, message, **kw)

    monkeypatch.setattr(Store, "message_insert", spy)
    monkeypatch.setattr(Store, "message_insert_on", spy_on)
    options: dict[str, Any] = {"priority": 7, "headers": {"tenant": "acme"}, "compression": "zlib", "retries": 2}
    app.tasks[ADD].apply_async((2, 3), {}, task_id="t-broker", **options)
    outbox.enqueue(conn, app.tasks[ADD], (2, 3), {}, task_id="t-outbox", **options)
    conn.commit()

    reader = Store(conn.info.dsn, schema=app.conf.broker_transport_options["schema"])
    broker, mine = sorted(reader.message_claim(queues=["celery"], limits=[2], owner="test"), key=lambda r: r.id)
    reader.close()
    assert (broker.headers["id"], mine.headers["id"]) == ("t-broker", "t-outbox")

    def without_ids(row: Any) -> dict[str, Any]:
        headers = {k: v for k, v in row.headers.items() if k not in ("id", "root_id")}
        properties = {k: v for k, v in row.properties.items() if k != "correlation_id"}
        return {
            "queue": row.queue,
            "priority": row.priority,
            "body": row.body,
            "content_type": row.content_type,
            "content_encoding": row.content_encoding,
            "headers": headers,
            "properties": properties,
        }

    assert without_ids(mine) == without_ids(broker)
    assert mine.headers["compression"] == "application/x-gzip"
    assert mine.priority == 7
    # Every field of the row to be written (delay, TTL, not_before too), ids aside; and the outbox
    # never went through the transport's own session.
    (from_broker,), (from_outbox,) = published, enqueued
    assert replace(from_outbox, headers={}, properties={}) == replace(from_broker, headers={}, properties={})


def test_commit_makes_a_message_celery_decodes_as_the_task_and_its_arguments(
    app: Celery, conn: psycopg.Connection[Any], make_connection: Any
) -> None:
    result = outbox.enqueue(conn, app.tasks[ADD].s(2, y=40))
    conn.commit()
    message = get_one(make_connection)
    args, kwargs, embed = message.decode()
    assert message.headers["task"] == ADD
    assert message.headers["id"] == result.id
    assert (args, kwargs) == ([2], {"y": 40})
    assert embed["chain"] is None


def test_nothing_is_visible_or_notified_before_commit(
    app: Celery, conn: psycopg.Connection[Any], store: Store, parked_listener: Callable[..., Store]
) -> None:
    listener = parked_listener("celery")  # a consumer waiting on the queue
    outbox.enqueue(conn, ADD, (1, 1), app=app)
    assert store.message_counts() == {}
    assert listener.listen_notifies() == []
    conn.commit()
    assert store.message_counts() == {("celery", "held"): 1}  # handed over to the parked consumer
    [payload] = eventually(listener.listen_notifies, timeout=10, what="NOTIFY delivered at commit")
    assert handoff_message(payload).queue == "celery"
    listener.close()


def test_rollback_leaves_no_message(app: Celery, conn: psycopg.Connection[Any], store: Store) -> None:
    outbox.enqueue(conn, app.tasks[ADD], (1, 2))
    conn.rollback()
    assert store.message_counts() == {}


def test_an_exception_in_the_transaction_block_leaves_no_message(
    app: Celery, conn: psycopg.Connection[Any], store: Store
) -> None:
    with pytest.raises(RuntimeError):
        enqueue_then_fail(conn, app, (1, 2))
    assert store.message_counts() == {}


def test_a_rolled_back_savepoint_drops_its_message_and_the_outer_commit_keeps_the_others(
    app: Celery, conn: psycopg.Connection[Any], make_connection: Any, store: Store
) -> None:
    with conn.transaction():
        outbox.enqueue(conn, app.tasks[ADD], (1, 0))
        with pytest.raises(RuntimeError):
            enqueue_then_fail(conn, app, (2, 0))  # a savepoint, inside the outer transaction
        outbox.enqueue(conn, app.tasks[ADD], (3, 0))
    assert store.message_counts() == {("celery", "ready"): 2}
    firsts = sorted(get_one(make_connection).decode()[0][0] for _ in range(2))
    assert firsts == [1, 3]


def test_routing_follows_queue_option_task_routes_and_topic_exchanges(
    pg_url: str, schema: str, conn: psycopg.Connection[Any], store: Store
) -> None:
    app = make_app(
        pg_url,
        schema,
        task_routes={ADD: {"queue": "math"}},
        task_queues=[Queue("math"), Queue("audit", Exchange("events", "topic"), routing_key="order.*")],
    )
    store.exchange_declare(name="events", type="topic", durable=True, auto_delete=False)
    store.binding_declare(exchange="events", routing_key="order.*", queue="audit", pattern="^\\.order\\.[^.]*$")
    outbox.enqueue(conn, app.tasks[ADD], (1, 1))  # task_routes
    outbox.enqueue(conn, app.tasks[ADD], (1, 2), queue="urgent")  # the queue option wins
    outbox.enqueue(conn, app.tasks[ADD], (1, 3), exchange="events", routing_key="order.paid")
    conn.commit()
    app.close()
    assert store.message_counts() == {("math", "ready"): 1, ("urgent", "ready"): 1, ("audit", "ready"): 1}


def test_a_far_countdown_waits_in_the_database_as_the_transport_would(
    app: Celery, conn: psycopg.Connection[Any], store: Store
) -> None:
    outbox.enqueue(conn, app.tasks[ADD], (1, 1), countdown=3600)
    outbox.enqueue(conn, app.tasks[ADD], (1, 2), countdown=1)  # near: Celery's own ETA handling
    conn.commit()
    assert store.message_counts() == {("celery", "delayed"): 1, ("celery", "ready"): 1}


def test_a_group_enqueues_every_member_in_the_same_transaction(
    app: Celery, conn: psycopg.Connection[Any], store: Store
) -> None:
    outbox.enqueue(conn, group(app.tasks[ADD].s(i, i) for i in range(3)))
    assert store.message_counts() == {}
    conn.commit()
    assert store.message_counts() == {("celery", "ready"): 3}


def test_headers_use_kombus_json_codec_and_leave_the_callers_adapters_alone(
    app: Celery, conn: psycopg.Connection[Any], make_connection: Any
) -> None:
    psycopg.types.json.set_json_dumps(lambda obj: json.dumps({"mine": True}), conn)  # the app's own choice
    adapters_before = conn.adapters.get_dumper(psycopg.types.json.Jsonb, psycopg.adapt.PyFormat.AUTO)
    when, ref = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), uuid.uuid4()
    outbox.enqueue(conn, app.tasks[ADD], (1, 1), headers={"when": when, "ref": ref})
    conn.commit()
    message = get_one(make_connection)
    assert message.headers["when"] == when
    assert message.headers["ref"] == ref
    assert conn.adapters.get_dumper(psycopg.types.json.Jsonb, psycopg.adapt.PyFormat.AUTO) is adapters_before
    assert conn.execute("SELECT %s::jsonb", [psycopg.types.json.Jsonb(1)]).fetchone() == ({"mine": True},)


def test_the_schema_defaults_to_the_apps_transport_option_and_can_be_named(
    pg_url: str, schema: str, conn: psycopg.Connection[Any], store: Store
) -> None:
    other = make_app(pg_url, "no_such_schema_here")
    outbox.enqueue(conn, other.tasks[ADD], (1, 1), schema=schema)
    conn.commit()
    other.close()
    assert store.message_counts() == {("celery", "ready"): 1}


def test_a_missing_schema_is_an_error_naming_the_migrate_command(pg_url: str, conn: psycopg.Connection[Any]) -> None:
    other = make_app(pg_url, "no_such_schema_here")
    with pytest.raises(Exception, match="akadze migrate"):
        outbox.enqueue(conn, other.tasks[ADD], (1, 1))
    other.close()


def test_a_connection_that_is_not_psycopg_3_is_refused(app: Celery) -> None:
    with pytest.raises(TypeError, match="psycopg 3 connection"):
        outbox.enqueue(object(), app.tasks[ADD], (1, 1))  # type: ignore[arg-type]


def test_something_that_is_not_a_task_is_refused(app: Celery, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(TypeError, match="a Celery task, a signature or a task name"):
        outbox.enqueue(conn, 42, app=app)


def test_the_captured_message_is_what_the_transport_maps(app: Celery) -> None:
    """The capture channel maps kombu's payload with the transport's own code (same NewMessage)."""
    with kombu.Connection(transport=outbox.CaptureTransport) as capture:
        capture.Producer().publish({"n": 1}, routing_key="q", priority=3, expiration=5)
        (item,) = capture.transport.captured
    assert (item.exchange, item.routing_key) == ("", "q")
    assert replace(item.message, properties=None) == NewMessage(
        queue="q",
        body=b'{"n": 1}',
        priority=3,
        content_type="application/json",
        content_encoding="utf-8",
        headers={},
        properties=None,
        ttl=5.0,
    )
