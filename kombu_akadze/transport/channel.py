"""The kombu channel of kombu-akadze: publish, get, queue operations and close, each a store call."""

from __future__ import annotations

import logging
from collections import deque
from datetime import datetime, timedelta, timezone
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.exceptions import ConnectionError as KombuConnectionError
from kombu.transport import virtual
from kombu.utils import json as kombu_json

from kombu_akadze.errors import AkadzeError, MessageTooLargeError, QueueFullError
from kombu_akadze.store import ClaimedMessage, NewMessage, Store
from kombu_akadze.transport.delivery import payload_of
from kombu_akadze.transport.exchanges import ExchangeMixin, milliseconds
from kombu_akadze.transport.qos import QoS as AkadzeQoS
from kombu_akadze.transport.qos import parse_tag

if TYPE_CHECKING:
    from kombu_akadze.transport import Transport

logger = logging.getLogger("kombu_akadze")

#: The AMQP 0-9-1 basic properties RabbitMQ keeps (py-amqp ignores any other publish keyword).
AMQP_PROPERTIES = frozenset(
    [
        "content_type",
        "content_encoding",
        "application_headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ]
)


class Channel(ExchangeMixin, virtual.Channel):
    """A kombu channel whose queues are rows of the messages table."""

    QoS = AkadzeQoS
    connection: Transport
    # Bodies are stored as bytea, so no base64 detour.
    body_encoding = None  # type: ignore[assignment]

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        #: Messages claimed for this channel and not yet handed to its consumer (held; they count
        #: against its prefetch window, and a close gives them back in place).
        self.claimed: deque[ClaimedMessage] = deque()
        super().__init__(connection, **kwargs)

    # -- what the transport reads of kombu's channel state (one place each) ----

    def consuming(self) -> bool:
        """Whether some consumer is registered on this channel."""
        return bool(self._consumers)

    def consumed_queues(self) -> list[str]:
        """The queues this channel's consumers consume, each once, in consume order."""
        return list(dict.fromkeys(self._active_queues))

    def existing_qos(self) -> AkadzeQoS | None:
        """This channel's QoS if kombu made one (a channel that never consumed or settled has none)."""
        return self._qos

    @property
    def store(self) -> Store:
        if self.connection is None:
            raise _closed_channel()
        return self.connection.store

    @property
    def max_attempts_default(self) -> int:
        return self.connection.options.max_attempts

    # -- publish ------------------------------------------------------------

    #: Publishes buffered by kombu_akadze.integrations.batch.publishing(), written as one statement at its end.
    _batch: list[tuple[str, str, NewMessage]] | None = None

    def basic_publish(self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any) -> None:
        if self.connection is None:
            raise _closed_channel()
        self._inplace_augment_message(message, exchange, routing_key)
        if self._batch is not None:
            self._batch.append((exchange or "", routing_key, self._new_message(routing_key, message)))
            return
        if exchange:
            self.route(exchange, routing_key, self._new_message(routing_key, message))
        else:  # the default exchange: the routing key names the queue
            self._put(routing_key, message)

    def _next_delivery_tag(self) -> str:
        """kombu tags every publish with a fresh uuid4; akadze never stores it (a delivery's tag is made
        from its row, see delivery.make_tag, and _storable_properties drops this one), so no uuid."""
        return ""

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        if self.store.message_insert(self._new_message(queue, message)) is None:
            raise QueueFullError(
                f"queue {queue!r} is full (x-max-length with x-overflow=reject-publish); the message was "
                "not stored: retry later or raise the limit"
            )

    def _new_message(self, queue: str, message: dict[str, Any]) -> NewMessage:
        body = message.get("body") or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(
                f"message body for queue {queue!r} must be bytes or str, not {type(body).__name__}: "
                "with content_type=... kombu sends the body as it is; leave content_type out to serialize it"
            )
        limit = self.connection.options.max_message_size
        if limit and len(body) > limit:
            raise MessageTooLargeError(
                f"message body of {len(body)} bytes for queue {queue!r} is over max_message_size={limit} bytes; "
                "put the payload in object storage and send a reference, or raise the transport option"
            )
        properties = _storable_properties(message.get("properties") or {})
        expiration = properties.get("expiration")
        return NewMessage(
            queue=queue,
            body=bytes(body),
            priority=self._get_message_priority(message),
            content_type=message.get("content-type"),
            content_encoding=message.get("content-encoding"),
            headers=_storable_headers(message.get("headers") or {}),
            properties=properties,
            ttl=milliseconds(properties, "expiration") if expiration is not None else None,
            not_before=self._native_delay(message),
            durable=not (self.connection.options.transient_async and properties.get("delivery_mode") == 1),
        )

    def _native_delay(self, message: dict[str, Any]) -> datetime | None:
        """A Celery ETA further ahead than native_delay_threshold: not claimable until that long before it,
        so far-future tasks hold no lease and no worker memory (nearer ETAs keep Celery's behaviour)."""
        threshold = self.connection.options.native_delay_threshold
        eta = (message.get("headers") or {}).get("eta")
        if not threshold or not eta:
            return None
        when = eta if isinstance(eta, datetime) else _parse_eta(eta)
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        lead = timedelta(seconds=threshold)
        return when - lead if when - datetime.now(timezone.utc) > lead else None

    # -- consume ------------------------------------------------------------

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        claimed = self.connection.claim([queue], [1])
        if not claimed:
            raise Empty()
        return payload_of(claimed[0])

    def _size(self, queue: str) -> int:
        return self.store.queue_size(name=queue)

    def _purge(self, queue: str) -> int:
        self._write_buffered_outcomes()
        return self.store.queue_purge(name=queue)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.queue_declare(queue, **kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self.store.queue_exists(name=queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.queue_delete(queue)

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any) -> int | None:
        """Drop the queue, its bindings and its messages."""
        if if_empty and self._size(queue):
            return None
        self.connection.declared.clear()
        self._write_buffered_outcomes()
        return self.store.queue_delete(name=queue)

    def _write_buffered_outcomes(self) -> None:
        """Acks and rejects this connection buffered go out before a purge or delete, as RabbitMQ's
        channel applies them in order: else a delete took the held rows first, and every ack of a run
        the consumer had finished was reported as "changed nothing". This also covers the reply queue
        kombu deletes once its replies are in (inspect, ping: after_reply_message_received). Outcomes
        another thread took for writing (the heartbeat flushes a draining client's at every beat) are
        waited for too: else the delete could take the session first, and those acks changed nothing."""
        self.connection.flush_outcomes_and_wait()

    def basic_qos(self, prefetch_size: int = 0, prefetch_count: int = 0, apply_global: bool = False) -> None:
        """A wider window (Celery widens it for every ETA task it holds) may be filled at once."""
        super().basic_qos(prefetch_size, prefetch_count, apply_global)
        self.connection.wake(ready=True)

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any) -> Any:
        result = super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if no_ack:
            # kombu tracks (and so acks) only deliveries of ack-mode consumers: without this the row of a
            # no_ack delivery (Celery's pidbox) stayed held, and was rescued and replayed once its worker
            # left. kombu's own basic_consume keeps the callbacks on the connection, so it is wrapped there.
            deliver = self.connection._callbacks[queue]
            qos = self.qos

            def forget_then_deliver(raw_message: dict[str, Any]) -> Any:
                qos.forget(raw_message["properties"]["delivery_tag"])
                return deliver(raw_message)

            self.connection._callbacks[queue] = forget_then_deliver
        self.store.queue_touch(queues=[queue])
        self.connection.wake(ready=True)  # a new queue may hold messages already: claim for every window
        return result

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Stop consuming; a queue no channel of this connection consumes any more is no longer parked on
        (a publish would hand its message to a consumer that gives it straight back)."""
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        transport = self.connection
        if queue is not None and transport is not None and queue not in transport.consumed_queues():
            try:
                self.store.consumer_unpark(consumer_id=transport.consumer_id, queues=[queue])
            except AkadzeError as exc:  # its next heartbeat unparks it
                logger.info("kombu-akadze: could not unpark %r after its consumer was cancelled: %s", queue, exc)
        return result

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack, **kwargs)
        if message is not None and no_ack:
            self.qos.forget(message.delivery_tag)  # as basic_consume: a no_ack delivery is not held
        return message

    def close(self) -> None:
        """Buffered (claimed, not yet delivered) messages go back first; then kombu restores the unacked."""
        if not self.closed and self.connection is not None:
            self.connection.deliverer.release_buffered(self)
            qos = self.existing_qos()
            if qos is not None:
                qos.flush_at_close()  # logs an error it cannot fix: the close goes on
        super().close()

    def _restore(self, message: Any) -> None:
        """Give one held message back in place; kombu's default would insert a copy."""
        self.store.message_release([parse_tag(message.delivery_tag)], owner=self.connection.consumer_id)

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)


#: Celery's display copies of a task's arguments; its saferepr keeps a NUL character as it is.
_REPR_HEADERS = ("argsrepr", "kwargsrepr")


def _storable_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """Headers as stored (jsonb, which cannot hold U+0000): a NUL in argsrepr/kwargsrepr, display text
    only, is written as the escape \\x00 (the arguments themselves travel intact in the body); a NUL in
    any other header is refused at publish with the database's error."""
    out = dict(headers)
    for key in _REPR_HEADERS:
        value = out.get(key)
        if isinstance(value, str) and "\x00" in value:
            out[key] = value.replace("\x00", "\\x00")
    return out


def _storable_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """Publish properties as stored (jsonb). kombu's virtual transports pass on every keyword given to
    Producer.publish; RabbitMQ's client ignores those it does not know. So a value JSON cannot hold
    (Celery's ``signal`` object, republished from a before_task_publish handler with ``**kwargs``)
    never fails the publish: an AMQP property is kept as text, anything else is left out."""
    given = {key: value for key, value in properties.items() if key != "delivery_tag"}
    if _plain_json(given, 0):  # the usual case: nothing to encode twice (psycopg encodes it as it sends)
        return given
    try:  # then checked in one go; one key at a time only when something is not JSON
        kombu_json.dumps(given)
    except (TypeError, ValueError):
        pass
    else:
        return given
    out: dict[str, Any] = {}
    for key, value in given.items():
        try:
            kombu_json.dumps(value)
        except (TypeError, ValueError):
            if key in AMQP_PROPERTIES:
                out[key] = str(value)
                logger.debug("kombu-akadze: publish property %r is not JSON; stored as text", key)
            else:
                logger.debug("kombu-akadze: publish keyword %r (%s) is not JSON; left out", key, type(value).__name__)
            continue
        out[key] = value
    return out


#: Values JSON holds as they are; exact types, so a subclass with its own encoding takes the full check.
_PLAIN_SCALARS = frozenset([str, int, float, bool, type(None)])


def _plain_json(value: Any, depth: int) -> bool:
    """Whether *value* is made only of str-keyed dicts, lists and plain scalars (so any JSON encoder takes
    it), without encoding it; False (the full check decides) for anything else, or nested past 8 levels."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if depth > 8:
        return False
    if kind is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    if kind is list:
        return all(_plain_json(v, depth + 1) for v in value)
    return False


def _closed_channel() -> KombuConnectionError:
    """The error of a channel kombu closed after a lost connection (its connection is None): a connection
    error, so kombu's retry (ensure) reconnects and revives the producer on a new channel."""
    return KombuConnectionError(
        "kombu-akadze: this channel was closed when its connection was lost; publish on a new channel "
        "(kombu's retry=True, and Celery, reconnect and do that)"
    )


def _parse_eta(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None  # not an ETA we understand: deliver now and let Celery decide
