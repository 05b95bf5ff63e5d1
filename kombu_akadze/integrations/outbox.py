"""Transactional enqueue: the message Celery would publish, written on the caller's own database transaction."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqp.protocol import queue_declare_ok_t
from kombu.connection import Connection
from kombu.transport import virtual

from kombu_akadze.errors import QueueFullError
from kombu_akadze.options import Options
from kombu_akadze.store import NewMessage, Store
from kombu_akadze.transport.channel import Channel

if TYPE_CHECKING:
    import psycopg

logger = logging.getLogger("kombu_akadze")


@dataclass(frozen=True)
class Captured:
    """One message kombu published on the capture connection: where it goes and the row it becomes."""

    exchange: str
    routing_key: str
    message: NewMessage


class CaptureChannel(Channel):
    """An akadze channel that keeps the rows it would write instead of writing them.

    Declarations are no-ops: queues and bindings are the workers' to declare, and an upsert of the
    queue's row inside the caller's transaction would lock it (and every other enqueue) until commit.
    """

    connection: CaptureTransport  # type: ignore[assignment]

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> None:
        self._inplace_augment_message(message, exchange, routing_key)  # type: ignore[no-untyped-call]
        self.connection.captured.append(Captured(exchange, routing_key, self._new_message(routing_key, message)))

    def exchange_declare(self, *args: Any, **kwargs: Any) -> None:
        return None

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        return queue_declare_ok_t(queue, 0, 0)

    def queue_bind(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        virtual.Channel.close(self)  # type: ignore[no-untyped-call]  # nothing claimed: nothing to give back


class CaptureTransport(virtual.Transport):
    """A kombu transport that never connects anywhere: its channels capture what is published."""

    Channel = CaptureChannel
    driver_type = "akadze"
    driver_name = "akadze-outbox"

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        self.options = Options.from_transport_options(client.transport_options)
        self.captured: list[Captured] = []


def enqueue(
    conn: psycopg.Connection[Any],
    signature_or_task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Any = None,
    queue: str | None = None,
    schema: str | None = None,
    **options: Any,
) -> Any:
    """Enqueue a Celery task in *conn*'s current transaction; returns Celery's AsyncResult.

    *signature_or_task* is a task, a signature (chains and groups too) or a task name (then *app*, or
    Celery's current app, says which app). The message is built by Celery's own ``apply_async`` /
    ``send_task`` (routing, task options, serializer, compression, signals, ETA, expires) on a
    connection that only captures it; the rows are then inserted on *conn* and nothing is committed:
    the task exists, and its NOTIFY wakes the workers, once the caller commits; a rollback (or a
    rolled-back savepoint) leaves no message. On an autocommit connection outside a transaction block
    the insert commits at once, as a plain publish would. *schema* defaults to the app's
    ``broker_transport_options["schema"]``, else ``akadze``.
    """
    celery_app = _app_of(signature_or_task, app)
    transport_options = dict(celery_app.conf.broker_transport_options or {})
    if queue is not None:
        options["queue"] = queue
    capturing = Connection(transport=CaptureTransport, transport_options=transport_options)  # type: ignore[no-untyped-call]
    with capturing as capture:
        producer = celery_app.amqp.Producer(capture, auto_declare=False)
        result = _publish(
            celery_app,
            signature_or_task,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            producer=producer,
            options=options,
        )
        transport: CaptureTransport = capture.transport
        captured = list(transport.captured)
    store = Store("", schema=schema or transport.options.schema, role="outbox")
    for item in captured:
        _write(store, conn, item, quiet_exchange=celery_app.conf.event_exchange)
    return result


def _app_of(signature_or_task: Any, app: Any) -> Any:
    if app is not None:
        return app
    bound = getattr(signature_or_task, "app", None) if not isinstance(signature_or_task, str) else None
    if bound is not None:
        return bound
    from celery import current_app

    return current_app._get_current_object()


def _publish(
    app: Any, target: Any, *, args: tuple[Any, ...], kwargs: dict[str, Any], producer: Any, options: dict[str, Any]
) -> Any:
    """Celery's own publish path, with our capturing producer."""
    if isinstance(target, str):
        return app.send_task(target, args, kwargs, producer=producer, **options)
    if callable(getattr(target, "apply_async", None)):
        return target.apply_async(args, kwargs, producer=producer, **options)
    raise TypeError(
        f"enqueue needs a Celery task, a signature or a task name, not {type(target).__name__}: "
        "e.g. enqueue(conn, add, (2, 2)), enqueue(conn, add.s(2, 2)) or enqueue(conn, 'proj.add', (2, 2), app=app)"
    )


def _write(store: Store, conn: psycopg.Connection[Any], item: Captured, *, quiet_exchange: str) -> None:
    """Insert one captured message on the caller's connection; a full queue is an error, as on publish."""
    if not item.exchange:
        if store.message_insert_on(conn, item.message) is None:
            raise QueueFullError(
                f"queue {item.routing_key!r} is full (x-max-length with x-overflow=reject-publish); nothing was "
                "stored for it: roll back and retry later, or raise the limit"
            )
        return
    queues, matched = store.message_route_on(conn, item.message, exchange=item.exchange, routing_key=item.routing_key)
    if matched > len(queues):
        raise QueueFullError(
            f"message to exchange {item.exchange!r} (routing key {item.routing_key!r}) was refused by "
            f"{matched - len(queues)} full queue(s) (x-max-length with x-overflow=reject-publish): roll back "
            "and retry later, or raise the limit"
        )
    if not queues and item.exchange != quiet_exchange:
        logger.warning(
            "kombu-akadze: enqueued message to exchange %r with routing key %r matched no bound queue and "
            "will not be stored (start a worker that declares the queue and its binding first)",
            item.exchange,
            item.routing_key,
        )
