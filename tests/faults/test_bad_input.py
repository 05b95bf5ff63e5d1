"""Bad input next to good traffic: NUL bytes, undecodable and foreign bodies, unknown tasks, missing
headers and a 50 MB body. The worker survives, each bad message ends in dead letters or in Celery's
decode-error path with a logged reason, good tasks keep flowing; max_message_size refuses at publish."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import kombu
import pytest
from celery import Celery

from kombu_akadze.errors import DatabaseError, MessageTooLargeError
from kombu_akadze.store import DeadLetterFilter, Store, migrate

from .checker import verdict
from .conftest import SCHEMA, Faults
from .jobs import CHECK, TOUCH

QUEUE = "celery"
REJECTED = "rejected by consumer (requeue=False)"
BIG = 50 * 1024 * 1024
NUL_TEXT = "a\x00b\x00\x00c \u0000 end\x01\x7f é ✓"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _task_headers(app: Celery, name: str) -> dict[str, Any]:
    """Celery protocol-2 headers for task *name*, as send_task would write them."""
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, name, args=(0,), kwargs={})
    return dict(message.headers)


@pytest.mark.slow
def test_bad_messages_end_in_dead_letters_or_celerys_reject_path_and_good_ones_flow(shared: Faults) -> None:
    app = shared.producer()
    worker = shared.start_worker("a", concurrency=2)
    good = iter(range(1000))
    sent: list[int] = []

    def some_good(k: int = 5) -> None:
        for _ in range(k):
            n = next(good)
            app.send_task(TOUCH, args=[n])
            sent.append(n)

    with kombu.Connection(f"akadze+{shared.url}", transport_options={"schema": shared.cluster.schema}) as conn:
        producer = conn.Producer()
        some_good()
        # NUL characters in a task argument: JSON escapes them and the body is bytea, so they arrive
        # intact. (argsrepr is given: Celery's own would copy the NULs into a header, see below.)
        app.send_task(CHECK, args=[500, NUL_TEXT, _sha(NUL_TEXT)], argsrepr="(500, '<text with NULs>')")
        some_good()
        # Not JSON at all, though it says application/json.
        producer.publish(
            b'{"not": json\x00\xff',
            routing_key=QUEUE,
            content_type="application/json",
            content_encoding="utf-8",
            headers=_task_headers(app, TOUCH),
        )
        some_good()
        # A content type the worker does not accept.
        producer.publish(
            b"\x00\x01binary\x00",
            routing_key=QUEUE,
            content_type="application/x-unknown",
            content_encoding="binary",
            headers=_task_headers(app, TOUCH),
        )
        some_good()
        # A task name no worker knows.
        app.send_task("faults.no_such_task", args=[1])
        some_good()
        # No headers at all, a JSON body without "task".
        producer.publish({"hello": "world"}, routing_key=QUEUE, serializer="json")
        some_good()
        # A 50 MB argument: stored, claimed and run like any other.
        app.send_task(TOUCH, args=[501], kwargs={"pad": "x" * BIG})
        some_good()

    published_good = [*sent, 500, 501]
    shared.until(lambda: shared.ledgers.all_done(published_good), timeout=240, interval=0.5, what="good tasks done")
    shared.until(lambda: shared.queued() == 0, timeout=120, interval=0.5, what="every message left the queue")
    dead = {d.task or "(no task header)": d.reason for d in shared.store.deadletter_find(where=DeadLetterFilter())}
    log = worker.output()
    result = verdict(
        "bad input (NUL, bad JSON, foreign type, unknown task, no headers, 50 MB)",
        injected="6 malformed or odd messages among good ones",
        published=published_good,
        ledgers=shared.ledgers,
        recovery=None,
    )
    print(f"dead letters: {dead}")
    assert result.lost == 0
    assert not [r for r in shared.ledgers.runs() if r.event == "corrupt"], "a NUL character was mangled"
    assert worker.alive
    # Celery rejects (requeue=False) what it cannot route or accept: our dead letters, with the reason.
    assert dead.get("faults.no_such_task") == REJECTED
    assert dead.get("(no task header)") == REJECTED
    assert dead.get(TOUCH) == REJECTED, "the foreign content type is rejected into dead letters"
    assert len(dead) == 3
    # Celery acks an undecodable body after logging why (it would loop otherwise), as on RabbitMQ.
    assert "Can't decode message body" in log or "DecodeError" in log
    # And the worker still takes new work.
    app.send_task(TOUCH, args=[999])
    shared.until(lambda: shared.ledgers.all_done([999]), timeout=60, what="the worker still runs tasks")


@pytest.mark.slow
def test_max_message_size_refuses_oversize_publishes_with_a_clear_error_and_loses_nothing(shared: Faults) -> None:
    limit = 1024 * 1024
    app = shared.producer({"max_message_size": limit})
    app.send_task(TOUCH, args=[0])
    with pytest.raises(MessageTooLargeError, match="max_message_size=1048576") as raised:
        app.send_task(TOUCH, args=[1], kwargs={"pad": "x" * (2 * limit)})
    assert "over max_message_size" in str(raised.value)
    app.send_task(TOUCH, args=[2])
    assert shared.queued() == 2, "the refused message must not be stored; the others must"
    # A header PostgreSQL's jsonb cannot hold (a NUL character) is refused at publish too, never silently.
    with pytest.raises(DatabaseError, match="NUL character"):
        app.send_task(TOUCH, args=[3], headers={"note": "nul\x00here"})
    assert shared.queued() == 2

    shared.start_worker("a", concurrency=1)
    shared.until(lambda: shared.ledgers.all_done([0, 2]), timeout=90, what="the accepted tasks run")
    result = verdict(
        "max_message_size + unstorable header at publish",
        injected="1 body of 2 MiB over a 1 MiB limit, 1 header with NUL",
        published=[0, 2],
        ledgers=shared.ledgers,
        recovery=None,
    )
    assert result.lost == 0
    assert {r.n for r in shared.ledgers.runs()} == {0, 2}


@pytest.mark.slow
def test_a_task_with_a_nul_character_in_an_argument_is_published_and_runs(shared: Faults) -> None:
    app = shared.producer()
    # Celery's default argsrepr copies the NULs into a header (jsonb cannot hold U+0000): the transport
    # stores that display copy with the NULs escaped; the argument itself travels intact in the body.
    app.send_task(CHECK, args=[1, NUL_TEXT, _sha(NUL_TEXT)])
    shared.start_worker("a", concurrency=1)
    shared.until(lambda: shared.ledgers.all_done([1]), timeout=90, what="the task runs with its argument intact")
    assert not [r for r in shared.ledgers.runs() if r.event == "corrupt"], "a NUL character was mangled"


#: Names that would be SQL, a psycopg placeholder, a template field, a regular expression or simply
#: long or foreign if anything pasted them into a statement: they must stay data.
EVIL_NAMES = (
    "q'; DELETE FROM messages; --",
    'q"; DROP SCHEMA public CASCADE; --',
    "q %s %(queue)s {schema} \\ \\x00-free",
    "очередь ✓ 队列 🐘",
    "q" * 300,
    "a.(b|c)+[x]*?^$",
)
#: Quotes, a semicolon and multibyte characters: 46 characters, 58 bytes (a NOTIFY channel named
#: after it would be over PostgreSQL's 63 bytes: wake channels are digests).
EVIL_SCHEMA = 'q"; DROP SCHEMA public CASCADE; --' + "é" * 12


@pytest.mark.slow
def test_names_with_quotes_semicolons_unicode_and_300_characters_are_data(own: Faults) -> None:
    server = own.server
    assert server is not None
    migrate.apply(own.url, EVIL_SCHEMA)
    options = {"schema": EVIL_SCHEMA}
    got: dict[str, Any] = {}
    with kombu.Connection(f"akadze+{own.url}", transport_options=options) as conn:
        for k, name in enumerate(EVIL_NAMES):
            exchange = kombu.Exchange(name, type="topic")
            queue = kombu.Queue(name, exchange=exchange, routing_key=f"{name}.#")
            with conn.SimpleQueue(queue) as simple:
                simple.put({"k": k, "name": name}, routing_key=f"{name}.x")
                message = simple.get(timeout=10)
                got[name] = message.payload
                message.ack()
        # A binding key with regular-expression characters matches itself only (topic words are escaped).
        exchange = kombu.Exchange("rx", type="topic")
        queue = kombu.Queue("rx", exchange=exchange, routing_key="a.b+c")
        with conn.SimpleQueue(queue) as simple:
            producer = conn.Producer()
            producer.publish({"hit": False}, exchange=exchange, routing_key="a.bbc", declare=[queue])
            producer.publish({"hit": True}, exchange=exchange, routing_key="a.b+c")
            assert simple.get(timeout=10).payload == {"hit": True}
            assert simple.qsize() == 0
    assert got == {name: {"k": k, "name": name} for k, name in enumerate(EVIL_NAMES)}

    # A Celery task name is data too: unknown, rejected, kept with its name in dead letters.
    evil_task = "x'); DROP TABLE messages; -- ✓"
    own.options = {"schema": EVIL_SCHEMA}
    app = own.producer()
    app.send_task(evil_task, args=[1])
    app.send_task(TOUCH, args=[7])
    own.start_worker("a", concurrency=1)
    store = Store(own.url, schema=EVIL_SCHEMA, role="test")
    try:
        own.until(lambda: store.deadletter_count(where=DeadLetterFilter()) == 1, timeout=90, what="the dead letter")
        (dead,) = store.deadletter_find(where=DeadLetterFilter())
        assert dead.task == evil_task
        assert dead.reason == REJECTED
    finally:
        store.close()
    own.until(lambda: own.ledgers.all_done([7]), timeout=60, what="the good task ran")
    # Nothing was executed: every schema and table is where it was.
    assert server.execute("schemas_present", {"names": ["public", SCHEMA, EVIL_SCHEMA]}) == [(3,)]
    result = verdict(
        "names are data (quotes, ;, Unicode, 300 chars, regex, placeholders)",
        injected=f"{len(EVIL_NAMES)} queue/exchange/routing names, 1 schema, 1 task name",
        published=[7],
        ledgers=own.ledgers,
        recovery=None,
    )
    assert result.lost == 0
