"""Dead letters: list, show, replay (back to ready under the same id, at most one copy), purge and prune."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kombu_akadze.errors import ConfigurationError
from kombu_akadze.store import DeadLetter, DeadLetterFilter, DeadLetterSummary, ReplayResult

if TYPE_CHECKING:
    from kombu_akadze.store import Store

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterSummary",
    "ReplayResult",
    "count",
    "detail_dict",
    "find",
    "matching",
    "prune",
    "purge",
    "replay",
    "show",
    "summary_dict",
]

#: Days a dead letter is kept by ``prune`` unless told otherwise.
DEFAULT_RETENTION_DAYS = 14.0


def matching(
    *,
    ids: Iterable[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    reason: str | None = None,
    older_than: float | None = None,
) -> DeadLetterFilter:
    """A filter from optional parts; an empty *ids* counts as no id filter."""
    id_tuple = tuple(int(i) for i in ids) if ids is not None else ()
    if older_than is not None and older_than < 0:
        raise ConfigurationError(f"older_than must be >= 0 seconds, got {older_than}")
    return DeadLetterFilter(ids=id_tuple or None, queue=queue, task=task, reason=reason, older_than=older_than)


def find(
    store: Store, where: DeadLetterFilter | None = None, *, limit: int | None = 100, now: datetime | None = None
) -> list[DeadLetterSummary]:
    """Matching dead letters, newest first (bodies left out)."""
    return store.deadletter_find(where=where or DeadLetterFilter(), limit=limit, now=now)


def count(store: Store, where: DeadLetterFilter | None = None, *, now: datetime | None = None) -> int:
    return store.deadletter_count(where=where or DeadLetterFilter(), now=now)


def show(store: Store, message_id: int) -> DeadLetter | None:
    """One dead letter with its body, headers and properties; None when there is no such id."""
    return store.deadletter_get(message_id=message_id)


def replay(
    store: Store,
    where: DeadLetterFilter,
    *,
    everything: bool = False,
    limit: int | None = None,
    now: datetime | None = None,
) -> ReplayResult:
    """Put matching dead letters back as ready messages (attempts 0, same id); repeating it is harmless."""
    _refuse_empty(where, everything, "replay")
    return store.deadletter_replay(where=where, limit=limit, now=now)


def purge(store: Store, where: DeadLetterFilter, *, everything: bool = False, now: datetime | None = None) -> int:
    """Delete matching dead letters; how many went."""
    _refuse_empty(where, everything, "purge")
    return store.deadletter_purge(where=where, now=now)


def prune(store: Store, *, days: float = DEFAULT_RETENTION_DAYS, now: datetime | None = None) -> int:
    """Delete dead letters buried more than *days* ago; how many went."""
    if days <= 0:
        raise ConfigurationError(f"days must be > 0, got {days}; use purge to delete recent dead letters")
    return store.deadletter_purge(where=DeadLetterFilter(older_than=days * 86400.0), now=now)


def _refuse_empty(where: DeadLetterFilter, everything: bool, what: str) -> None:
    if where.is_empty and not everything:
        raise ConfigurationError(
            f"{what} without a filter would touch every dead letter: give ids, queue, task, reason or "
            "older_than, or pass everything=True (CLI: --all)"
        )


def summary_dict(d: DeadLetterSummary) -> dict[str, Any]:
    return {
        "id": d.id,
        "queue": d.queue,
        "task": d.task,
        "reason": d.reason,
        "attempts": d.attempts,
        "run_count": d.run_count,
        "last_owner": d.last_owner,
        "body_size": d.body_size,
        "created_at": d.created_at.isoformat(),
        "dead_at": d.dead_at.isoformat(),
    }


def detail_dict(d: DeadLetter) -> dict[str, Any]:
    """Every column; the body both as base64 (exact bytes) and as a Python repr (readable)."""
    return {
        "id": d.id,
        "queue": d.queue,
        "priority": d.priority,
        "reason": d.reason,
        "attempts": d.attempts,
        "run_count": d.run_count,
        "last_owner": d.last_owner,
        "created_at": d.created_at.isoformat(),
        "dead_at": d.dead_at.isoformat(),
        "content_type": d.content_type,
        "content_encoding": d.content_encoding,
        "headers": d.headers,
        "properties": d.properties,
        "body_size": len(d.body),
        "body_base64": base64.b64encode(d.body).decode("ascii"),
        "body_repr": repr(d.body),
    }
