"""Exchanges and bindings shared by every process through PostgreSQL; routing is done in SQL at publish."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

from amqp.protocol import queue_declare_ok_t
from kombu.exceptions import ChannelError
from kombu.transport.base import to_rabbitmq_queue_arguments

from kombu_akadze.errors import ConfigurationError, QueueFullError
from kombu_akadze.store import Store

if TYPE_CHECKING:
    from kombu_akadze.transport import Transport

logger = logging.getLogger("kombu_akadze")

EXCHANGE_TYPES = ("direct", "topic", "fanout")
OVERFLOW_MODES = ("drop-head", "reject-publish")

# Exchanges whose unroutable messages are normal (events and replies nobody listens to).
_QUIET_EXCHANGES = re.compile(r"^(celeryev|.*\.pidbox)$")
# Celery's event exchange: events are lossy by design, so "no monitor bound" may be cached.
_EVENT_EXCHANGES = re.compile(r"^celeryev$")

#: (dsn, schema) -> {event exchange: time.monotonic() until which it is known to have no bound queue}.
#: One per process, shared by its connections: a worker's consuming connection refreshes it on its
#: heartbeat session (see refresh_unbound), so the producer Celery keeps for events needs no round
#: trip of its own while no monitor runs, and its session closes when idle (option idle_close).
_UNBOUND: dict[tuple[str, str], dict[str, float]] = {}


def unbound_routes(dsn: str, schema: str) -> dict[str, float]:
    return _UNBOUND.setdefault((dsn, schema), {})


def refresh_unbound(routes: dict[str, float], store: Store, *, ttl: float, within: float) -> None:
    """Look again at the cached exchanges whose entry ends within *within* s: still unbound, kept *ttl* s
    more; bound by now (a monitor started), dropped so the next event is routed."""
    now = time.monotonic()
    due = [name for name, until in list(routes.items()) if until - now < within]
    if not due:
        return
    still = store.exchanges_unbound(names=due)
    for name in due:
        if name in still:
            routes[name] = time.monotonic() + ttl
        else:
            routes.pop(name, None)


def topic_pattern(binding_key: str) -> str:
    """A regular expression over ``'.' + routing_key`` that matches as RabbitMQ's topic exchange does.

    ``*`` is exactly one word, ``#`` zero or more words; words are separated by dots.
    """
    parts = []
    for word in binding_key.split("."):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + re.escape(word))
    return "^" + "".join(parts) + "$"


def milliseconds(arguments: dict[str, Any], key: str) -> float | None:
    """An x-expires / x-message-ttl style argument (milliseconds) in seconds, validated."""
    value = arguments.get(key)
    if value is None:
        return None
    try:
        ms = float(value)
    except (TypeError, ValueError):
        ms = -1.0
    if ms < 0:
        raise ConfigurationError(f"queue argument {key}={value!r} must be a number of milliseconds >= 0")
    return ms / 1000.0


def max_length(arguments: dict[str, Any]) -> int | None:
    value = arguments.get("x-max-length")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"queue argument x-max-length={value!r} must be an integer >= 0 (messages)")
    return value


def overflow(arguments: dict[str, Any]) -> str:
    value = arguments.get("x-overflow", "drop-head")
    if value not in OVERFLOW_MODES:
        raise ConfigurationError(f"queue argument x-overflow={value!r} is not supported; use one of {OVERFLOW_MODES}")
    return str(value)


class ExchangeMixin:
    """Channel methods for exchanges, bindings and queue declaration, backed by the store."""

    connection: Transport

    def exchange_declare(  # noqa: PLR0917 (kombu's signature)
        self,
        exchange: str | None = None,
        type: str = "direct",
        durable: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        nowait: bool = False,
        passive: bool = False,
    ) -> None:
        type = type or "direct"
        exchange = exchange or f"amq.{type}"
        store = self.connection.store
        if passive:
            if not store.exchange_exists(name=exchange):
                raise ChannelError(f"NOT_FOUND - no exchange {exchange!r}", (50, 10), "Channel.exchange_declare", "404")
            return
        if type not in EXCHANGE_TYPES:
            raise ChannelError(
                f"exchange type {type!r} is not supported by kombu-akadze; use one of {', '.join(EXCHANGE_TYPES)}"
            )
        key = ("exchange", exchange, type, durable, auto_delete)
        if key in self.connection.declared:
            return
        store.exchange_declare(
            name=exchange, type=type, durable=durable, auto_delete=auto_delete, arguments=arguments or {}
        )
        self.connection.declared.add(key)

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        self.connection.store.exchange_delete(name=exchange)
        self.connection.declared.clear()

    def queue_bind(
        self, queue: str, exchange: str | None = None, routing_key: str = "", arguments: Any = None, **kwargs: Any
    ) -> None:
        exchange = exchange or "amq.direct"
        key = ("binding", queue, exchange, routing_key)
        if key in self.connection.declared:
            return
        self.connection.store.binding_declare(
            exchange=exchange,
            routing_key=routing_key,
            queue=queue,
            pattern=topic_pattern(routing_key),
            arguments=arguments or {},
        )
        self.connection.declared.add(key)

    def queue_unbind(
        self, queue: str, exchange: str | None = None, routing_key: str = "", arguments: Any = None, **kwargs: Any
    ) -> None:
        self.connection.store.binding_delete(exchange=exchange or "amq.direct", routing_key=routing_key, queue=queue)
        self.connection.declared.discard(("binding", queue, exchange or "amq.direct", routing_key))

    def list_bindings(self) -> list[tuple[str, str, str]]:
        return [(b["queue"], b["exchange"], b["routing_key"]) for b in self.connection.store.binding_list()]

    def prepare_queue_arguments(self, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Queue(expires=, message_ttl=, max_length=...) become x-* arguments, as on RabbitMQ."""
        return dict(to_rabbitmq_queue_arguments(arguments, **kwargs))

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        """Declare a queue in one round trip (its ready count comes back with it)."""
        queue = queue or f"amq.gen-{self.connection.new_name()}"
        store = self.connection.store
        if passive:
            if not store.queue_exists(name=queue):
                raise ChannelError(f"NOT_FOUND - no queue {queue!r}", (50, 10), "Channel.queue_declare", "404")
            return queue_declare_ok_t(queue, store.queue_size(name=queue), 0)
        arguments = dict(kwargs.get("arguments") or {})
        ready = store.queue_declare(
            name=queue,
            max_attempts=self.connection.options.max_attempts_for(queue) or arguments.get("x-max-attempts"),
            arguments=arguments,
            durable=bool(kwargs.get("durable", True)),
            auto_delete=bool(kwargs.get("auto_delete", False)),
            exclusive=bool(kwargs.get("exclusive", False)),
            expires=milliseconds(arguments, "x-expires"),
            message_ttl=milliseconds(arguments, "x-message-ttl"),
            max_length=max_length(arguments),
            overflow=overflow(arguments),
        )
        return queue_declare_ok_t(queue, ready, 0)

    def route(self, exchange: str, routing_key: str, message: Any) -> None:
        """Publish through an exchange; an unroutable message is dropped (as RabbitMQ does) and logged."""
        transport = self.connection
        cacheable = bool(_EVENT_EXCHANGES.match(exchange)) and transport.options.event_route_cache > 0
        if cacheable and transport.unbound_until.get(exchange, 0.0) > time.monotonic():
            return  # no event monitor was bound a moment ago: drop the event without a round trip
        queues, matched = transport.store.message_route(message, exchange=exchange, routing_key=routing_key)
        if matched > len(queues):
            raise QueueFullError(
                f"message to exchange {exchange!r} (routing key {routing_key!r}) was refused by "
                f"{matched - len(queues)} full queue(s) (x-max-length with x-overflow=reject-publish); "
                "nothing was stored for them: retry later or raise the limit"
            )
        if cacheable:
            if queues:
                transport.unbound_until.pop(exchange, None)
            else:
                transport.unbound_until[exchange] = time.monotonic() + transport.options.event_route_cache
        if not queues and not _QUIET_EXCHANGES.match(exchange):
            logger.warning(
                "kombu-akadze: message to exchange %r with routing key %r matched no bound queue and was "
                "dropped (declare the queue and its binding before publishing)",
                exchange,
                routing_key,
            )
