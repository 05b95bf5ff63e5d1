"""Queue depth per queue (ready, held, delayed, dead letters, age of the oldest ready message) and live consumers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kombu_akadze.store import QueueStats, StatsSnapshot

if TYPE_CHECKING:
    from kombu_akadze.store import Store

__all__ = [
    "DEFAULT_CONSUMER_TTL",
    "QueueStats",
    "StatsSnapshot",
    "age",
    "as_dict",
    "as_text",
    "is_internal",
    "queue_stats",
    "snapshot",
    "table",
    "user_view",
]

#: Seconds of heartbeat silence after which a consumer no longer counts as alive
#: (the transport's default heartbeat_ttl).
DEFAULT_CONSUMER_TTL = 30.0


#: Queues Celery declares for itself: remote control (``<node>.celery.pidbox`` and the clients'
#: ``<id>.reply.celery.pidbox``; ``celery`` is the app's control_exchange), event receivers
#: (``celeryev.<id>``) and the rpc:// result backend's reply queues (named by a UUID).
_INTERNAL = re.compile(r"^(?:.+\.pidbox|celeryev\..+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


def is_internal(queue: str) -> bool:
    """Whether *queue* is one of Celery's own queues (remote control, events, rpc:// results) rather than
    one that carries the user's tasks."""
    return bool(_INTERNAL.match(queue))


def user_view(snap: StatsSnapshot, *, show_all: bool = False) -> tuple[StatsSnapshot, int]:
    """The snapshot without Celery's own queues (unless *show_all*), and how many were left out."""
    if show_all:
        return snap, 0
    kept = tuple(q for q in snap.queues if not is_internal(q.queue))
    return replace(snap, queues=kept), len(snap.queues) - len(kept)


def snapshot(store: Store, now: datetime | None = None, *, ttl: float = DEFAULT_CONSUMER_TTL) -> StatsSnapshot:
    """Every queue and the schema's live consumers, read in one statement (one consistent snapshot)."""
    return store.queue_stats(ttl=ttl, now=now)


def queue_stats(store: Store, now: datetime | None = None, *, ttl: float = DEFAULT_CONSUMER_TTL) -> list[QueueStats]:
    """One row per queue that is declared, holds messages or has dead letters, by name."""
    return list(snapshot(store, now, ttl=ttl).queues)


def as_dict(snap: StatsSnapshot, hidden: int = 0) -> dict[str, Any]:
    """The JSON shape of a snapshot (``akadze stats --json``); *hidden*: Celery queues left out."""
    return {
        "taken_at": snap.taken_at.isoformat(),
        "consumers_alive": snap.consumers_alive,
        "internal_queues_hidden": hidden,
        "queues": [
            {
                "queue": q.queue,
                "ready": q.ready,
                "held": q.held,
                "delayed": q.delayed,
                "dead": q.dead,
                "oldest_ready_age_seconds": q.oldest_ready_age_seconds,
            }
            for q in snap.queues
        ],
    }


def as_text(snap: StatsSnapshot, ttl: float = DEFAULT_CONSUMER_TTL, hidden: int = 0) -> str:
    """The human table of a snapshot (``akadze stats``); *hidden*: Celery queues left out."""
    rows = [[q.queue, q.ready, q.held, q.delayed, q.dead, age(q.oldest_ready_age_seconds)] for q in snap.queues]
    text = table(["QUEUE", "READY", "HELD", "DELAYED", "DEAD", "OLDEST READY"], rows) if rows else "no queues"
    if hidden:
        text += f"\n(and {hidden} Celery queue(s) of remote control, events or rpc:// results: --all shows them)"
    when = snap.taken_at.strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"{text}\nconsumers alive: {snap.consumers_alive} (heartbeat within {ttl:g} s) at {when}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: numbers right-aligned, None shown as '-'."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True))

    return "\n".join(line(r).rstrip() for r in [list(headers), *cells])


def age(seconds: float | None) -> str:
    """A short age: 4.2s, 17m, 5h, 3d ('-' for None)."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    for limit, unit, size in ((7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds / 86400:.0f}d"
