"""The only package that runs SQL at run time: one method per named query, psycopg errors translated here.

``Store`` is one session and every named query, grouped by what they touch: the session itself
(session.py), the messages table (messages.py), the event loop's non-blocking claim (loop.py), the
heartbeat and maintenance passes (maintenance.py), and queues, exchanges and operations
(admin.py); records.py holds what they take and return, and wire.py sends the per-message
statements (publish, ack+claim) through libpq directly.
"""

from __future__ import annotations

from kombu_akadze.store.admin import AdminQueries
from kombu_akadze.store.loop import LoopClaims
from kombu_akadze.store.maintenance import MaintenanceQueries
from kombu_akadze.store.messages import MessageQueries
from kombu_akadze.store.records import (
    AckClaim,
    Beat,
    ClaimedMessage,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterSummary,
    FleetStats,
    Handoff,
    NewMessage,
    Outcome,
    QueueStats,
    ReplayResult,
    StatsSnapshot,
    TableSize,
    Tag,
    handoff_message,
    is_handoff,
    read_handoff,
)
from kombu_akadze.store.session import (
    DRIVER_VERSION,
    KEEPALIVE_DEFAULTS,
    connect,
    is_transient,
    kombu_json_setup,
    relay_key,
    translate,
    wake_channel,
)


class Store(MessageQueries, LoopClaims, MaintenanceQueries, AdminQueries):
    """One database session (autocommit) and the named queries that run on it. Thread-safe."""


__all__ = [
    "DRIVER_VERSION",
    "KEEPALIVE_DEFAULTS",
    "AckClaim",
    "Beat",
    "ClaimedMessage",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterSummary",
    "FleetStats",
    "Handoff",
    "NewMessage",
    "Outcome",
    "QueueStats",
    "ReplayResult",
    "StatsSnapshot",
    "Store",
    "TableSize",
    "Tag",
    "connect",
    "handoff_message",
    "is_handoff",
    "is_transient",
    "kombu_json_setup",
    "read_handoff",
    "relay_key",
    "translate",
    "wake_channel",
]
