"""``akadze dead``: list, show, replay and purge dead letters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from kombu_akadze.ops import deadletters, stats
from kombu_akadze.ops.cli.common import (
    CommandError,
    F,
    db_options,
    duration,
    emit,
    friendly,
    open_store,
    short,
    write_options,
)
from kombu_akadze.store import DeadLetterFilter


def _filter_options(func: F) -> F:
    func = click.option("--older-than", callback=duration, help="Only buried longer ago (90, 15m, 2h, 3d).")(func)
    func = click.option("--reason", help="Only reasons containing this text (any case).")(func)
    func = click.option("--task", help="Only this Celery task name (headers 'task').")(func)
    return click.option("--queue", help="Only dead letters of this queue.")(func)


def _where(ids: Sequence[int], filters: dict[str, Any], everything: bool | None = None) -> DeadLetterFilter:
    where = deadletters.matching(ids=ids, **filters)
    if everything is not None and where.is_empty and not everything:
        raise click.UsageError("give dead letter IDS, a filter (--queue, --task, --reason, --older-than) or --all")
    return where


@click.group("dead")
def dead() -> None:
    """Dead letters: list, show, replay, purge."""


@dead.command("list")
@db_options
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most rows shown.")
@friendly
def dead_list(*, url: str | None, schema: str, as_json: bool, limit: int, **filters: Any) -> None:
    """Dead letters matching the filters, newest first."""
    with open_store(url, schema) as store:
        found = deadletters.find(store, _where((), filters), limit=limit)
    rows = [[d.id, d.queue, d.task, short(d.reason, 60), d.attempts, f"{d.dead_at:%Y-%m-%d %H:%M:%S}"] for d in found]
    headers = ["ID", "QUEUE", "TASK", "REASON", "ATTEMPTS", "DEAD AT"]
    text = stats.table(headers, rows) if rows else "no dead letters match"
    emit([deadletters.summary_dict(d) for d in found], as_json, text)


@dead.command("show")
@click.argument("message_id", metavar="ID", type=int)
@db_options
@friendly
def dead_show(*, message_id: int, url: str | None, schema: str, as_json: bool) -> None:
    """One dead letter: reason, headers, properties and body (base64 and repr in --json)."""
    with open_store(url, schema) as store:
        found = deadletters.show(store, message_id)
    if found is None:
        raise CommandError(f"no dead letter with id {message_id} in schema {schema!r}; `akadze dead list` shows them")
    data = deadletters.detail_dict(found)
    body = data["body_repr"]
    if len(body) > 2000:
        body = body[:2000] + f"… ({len(found.body)} bytes; --json has all of them as base64)"
    keys = ("id", "queue", "priority", "reason", "attempts", "run_count", "last_owner", "created_at", "dead_at")
    lines = [f"{k}: {data[k]}" for k in (*keys, "content_type", "content_encoding")]
    for k in ("headers", "properties"):
        lines.append(f"{k}: " + json.dumps(data[k], indent=2, default=str, sort_keys=True))
    lines.append(f"body ({len(found.body)} bytes): {body}")
    emit(data, as_json, "\n".join(lines))


@dead.command("replay")
@click.argument("ids", nargs=-1, type=int)
@write_options
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter (when no IDS or filter).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay at most N (oldest ids first).")
@friendly
def dead_replay(
    *,
    ids: tuple[int, ...],
    url: str | None,
    schema: str,
    as_json: bool,
    no_migrate: bool,
    everything: bool,
    limit: int | None,
    **f: Any,
) -> None:
    """Put dead letters back in their queues as ready (attempts 0, same id); repeating it is harmless."""
    where = _where(ids, f, everything)
    with open_store(url, schema, auto_migrate=not no_migrate) as store:
        result = deadletters.replay(store, where, everything=everything, limit=limit)
    text = f"replayed {len(result.replayed)} dead letter(s) into their queues"
    if result.already_live:
        text += f"; {len(result.already_live)} were already live and only left the dead letters"
    emit({"replayed": sorted(result.replayed), "already_live": sorted(result.already_live)}, as_json, text)


@dead.command("purge")
@click.argument("ids", nargs=-1, type=int)
@write_options
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Purge every dead letter (when no IDS or filter).")
@click.option("--yes", is_flag=True, help="Really delete (without it: say how many would go).")
@friendly
def dead_purge(
    *,
    ids: tuple[int, ...],
    url: str | None,
    schema: str,
    as_json: bool,
    no_migrate: bool,
    everything: bool,
    yes: bool,
    **f: Any,
) -> None:
    """Delete dead letters matching IDS or the filters."""
    where = _where(ids, f, everything)
    with open_store(url, schema, auto_migrate=not no_migrate) as store:
        if not yes:
            n = deadletters.count(store, where)
            raise CommandError(f"would delete {n} dead letter(s) of schema {schema!r}; pass --yes to delete them")
        purged = deadletters.purge(store, where, everything=everything)
    emit({"purged": purged}, as_json, f"deleted {purged} dead letter(s)")
