"""Queue depth per queue (ready, held, delayed, dead letters, age of the oldest ready message) and live consumers."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from kombu_akadze.store import QueueStats, StatsSnapshot

if TYPE_CHECKING:
    from kombu_akadze.store import Store

__all__ = ["DEFAULT_CONSUMER_TTL", "QueueStats", "StatsSnapshot", "as_dict", "queue_stats", "snapshot"]

#: Seconds of heartbeat silence after which a consumer no longer counts as alive
#: (the transport's default heartbeat_ttl).
DEFAULT_CONSUMER_TTL = 30.0


def snapshot(store: Store, now: datetime | None = None, *, ttl: float = DEFAULT_CONSUMER_TTL) -> StatsSnapshot:
    """Every queue and the schema's live consumers, read in one statement (one consistent snapshot)."""
    return store.queue_stats(ttl=ttl, now=now)


def queue_stats(store: Store, now: datetime | None = None, *, ttl: float = DEFAULT_CONSUMER_TTL) -> list[QueueStats]:
    """One row per queue that is declared, holds messages or has dead letters, by name."""
    return list(snapshot(store, now, ttl=ttl).queues)


def as_dict(snap: StatsSnapshot) -> dict[str, Any]:
    """The JSON shape of a snapshot (``akadze stats --json``)."""
    return {
        "taken_at": snap.taken_at.isoformat(),
        "consumers_alive": snap.consumers_alive,
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
