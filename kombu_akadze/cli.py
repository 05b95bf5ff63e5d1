"""The ``akadze`` command line (also ``celery akadze``): a thin click layer over the library APIs."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from kombu_akadze import compact, deadletters, embedded, metrics, migrate, rabbitmq, stats
from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import DeadLetterFilter, Store
from kombu_akadze.urls import is_embedded, mask_password, to_dsn

F = TypeVar("F", bound=Callable[..., Any])


def _dsn(url: str | None) -> str:
    if not url:
        raise click.UsageError("no database URL: pass --url postgresql://user@host:5432/db or set AKADZE_URL")
    if url.startswith("akadze+"):
        url = url[len("akadze+") :]
    if is_embedded(url):
        return embedded.start()
    try:
        return to_dsn(url)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


url_option = click.option(
    "--url", envvar="AKADZE_URL", help="PostgreSQL URL (env AKADZE_URL); akadze+ prefix accepted."
)
schema_option = click.option(
    "--schema", envvar="AKADZE_SCHEMA", default="akadze", show_default=True, help="Schema of the tables."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group(name="akadze")
@click.version_option(package_name="kombu-akadze")
def akadze() -> None:
    """kombu-akadze: PostgreSQL as a Celery broker."""


@akadze.group(invoke_without_command=True)
@url_option
@schema_option
@json_option
@click.pass_context
def migrate_cmd(ctx: click.Context, url: str | None, schema: str, as_json: bool) -> None:
    """Apply pending migrations (subcommands: status, sql)."""
    ctx.ensure_object(dict)
    ctx.obj.update(url=url, schema=schema, as_json=as_json)
    if ctx.invoked_subcommand is not None:
        return
    dsn = _dsn(url)
    applied = migrate.apply(dsn, schema)
    st = migrate.status(dsn, schema)
    names = [f"{m.version:04d}_{m.name}" for m in applied]
    _emit(
        {"schema": schema, "applied": names, "version": st.current},
        as_json,
        f"schema {schema!r} at {mask_password(dsn)}: applied {len(applied)} migration(s)"
        + (f" ({', '.join(names)})" if names else "")
        + f"; now at version {st.current}",
    )


migrate_cmd.name = "migrate"


@migrate_cmd.command("status")
@click.pass_context
def migrate_status(ctx: click.Context) -> None:
    """Show the schema version and pending migrations; exit 1 when any are pending."""
    o = ctx.obj
    st = migrate.status(_dsn(o["url"]), o["schema"])
    pending = [f"{m.version:04d}_{m.name}" for m in st.pending]
    _emit(
        {"schema": st.schema, "current": st.current, "latest": st.latest, "pending": pending},
        o["as_json"],
        f"schema {st.schema!r}: version {st.current} of {st.latest}"
        + (f"; pending: {', '.join(pending)}" if pending else "; up to date"),
    )
    if pending:
        ctx.exit(1)


@migrate_cmd.command("sql")
@click.pass_context
def migrate_sql(ctx: click.Context) -> None:
    """Print every migration as SQL, without connecting."""
    click.echo(migrate.plan_sql(ctx.obj["schema"]), nl=False)


# -- operations ---------------------------------------------------------------


class CommandError(click.ClickException):
    """A one-line error that says what is valid; exit code 2 like a usage error."""

    exit_code = 2


def _friendly(func: F) -> F:
    """Turn kombu-akadze errors into CommandError (passwords masked), for every operations command."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AkadzeError as exc:
            raise CommandError(mask_password(str(exc))) from exc

    return wrapper  # type: ignore[return-value]


def _db_options(func: F) -> F:
    return url_option(schema_option(json_option(func)))


@contextmanager
def _store(url: str | None, schema: str) -> Iterator[Store]:
    dsn = _dsn(url)
    store = Store(dsn, schema=schema, role="cli")
    try:
        store.connection()
    except AkadzeError as exc:  # the store's "will retry" wording is for the transport, not a command
        detail = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise CommandError(
            f"cannot connect to PostgreSQL at {mask_password(dsn)}: {mask_password(detail)}; check --url or AKADZE_URL"
        ) from exc
    try:
        yield store
    finally:
        store.close()


_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Seconds, or a number with a unit: 90, 90s, 15m, 2h, 3d."""
    if value is None:
        return None
    match = _DURATION.match(value)
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration: use seconds or a number with s, m, h or d (e.g. 2h)")
    return float(match["n"]) * _UNIT_SECONDS[match["unit"]]


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


ttl_option = click.option(
    "--consumer-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=stats.DEFAULT_CONSUMER_TTL,
    show_default=True,
    help="Seconds of heartbeat silence after which a consumer no longer counts as alive.",
)


@akadze.command("stats")
@_db_options
@ttl_option
@click.option(
    "--watch",
    type=click.FloatRange(min=0, min_open=True),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C; with --json, one JSON document per line.",
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="With --watch: stop after N refreshes.")
@_friendly
def stats_cmd(
    *, url: str | None, schema: str, as_json: bool, consumer_ttl: float, watch: float | None, count: int | None
) -> None:
    """Per queue: ready, held, delayed, dead letters, age of the oldest ready message; live consumers."""
    if count is not None and watch is None:
        raise click.UsageError("--count only makes sense with --watch [SECONDS]")
    with _store(url, schema) as store:
        shown = 0
        try:
            while True:
                snap = stats.snapshot(store, ttl=consumer_ttl)
                if watch is None:
                    _emit(stats.as_dict(snap), as_json, stats.as_text(snap, consumer_ttl))
                    return
                if as_json:  # one JSON document per line while watching
                    click.echo(json.dumps(stats.as_dict(snap), default=str))
                else:
                    if sys.stdout.isatty():
                        click.clear()
                    click.echo(stats.as_text(snap, consumer_ttl) + "\n")
                shown += 1
                if count is not None and shown >= count:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return


# -- dead letters -------------------------------------------------------------


def _filter_options(func: F) -> F:
    func = click.option("--older-than", callback=_duration, help="Only buried longer ago (90, 15m, 2h, 3d).")(func)
    func = click.option("--reason", help="Only reasons containing this text (any case).")(func)
    func = click.option("--task", help="Only this Celery task name (headers 'task').")(func)
    return click.option("--queue", help="Only dead letters of this queue.")(func)


def _where(ids: Sequence[int], filters: dict[str, Any], everything: bool | None = None) -> DeadLetterFilter:
    where = deadletters.matching(ids=ids, **filters)
    if everything is not None and where.is_empty and not everything:
        raise click.UsageError("give dead letter IDS, a filter (--queue, --task, --reason, --older-than) or --all")
    return where


@akadze.group("dead")
def dead() -> None:
    """Dead letters: list, show, replay, purge."""


@dead.command("list")
@_db_options
@_filter_options
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most rows shown.")
@_friendly
def dead_list(*, url: str | None, schema: str, as_json: bool, limit: int, **filters: Any) -> None:
    """Dead letters matching the filters, newest first."""
    with _store(url, schema) as store:
        found = deadletters.find(store, _where((), filters), limit=limit)
    rows = [[d.id, d.queue, d.task, _short(d.reason, 60), d.attempts, f"{d.dead_at:%Y-%m-%d %H:%M:%S}"] for d in found]
    headers = ["ID", "QUEUE", "TASK", "REASON", "ATTEMPTS", "DEAD AT"]
    text = stats.table(headers, rows) if rows else "no dead letters match"
    _emit([deadletters.summary_dict(d) for d in found], as_json, text)


@dead.command("show")
@click.argument("message_id", metavar="ID", type=int)
@_db_options
@_friendly
def dead_show(*, message_id: int, url: str | None, schema: str, as_json: bool) -> None:
    """One dead letter: reason, headers, properties and body (base64 and repr in --json)."""
    with _store(url, schema) as store:
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
    _emit(data, as_json, "\n".join(lines))


@dead.command("replay")
@click.argument("ids", nargs=-1, type=int)
@_db_options
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter (when no IDS or filter).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay at most N (oldest ids first).")
@_friendly
def dead_replay(
    *, ids: tuple[int, ...], url: str | None, schema: str, as_json: bool, everything: bool, limit: int | None, **f: Any
) -> None:
    """Put dead letters back in their queues as ready (attempts 0, same id); repeating it is harmless."""
    where = _where(ids, f, everything)
    with _store(url, schema) as store:
        result = deadletters.replay(store, where, everything=everything, limit=limit)
    text = f"replayed {len(result.replayed)} dead letter(s) into their queues"
    if result.already_live:
        text += f"; {len(result.already_live)} were already live and only left the dead letters"
    _emit({"replayed": sorted(result.replayed), "already_live": sorted(result.already_live)}, as_json, text)


@dead.command("purge")
@click.argument("ids", nargs=-1, type=int)
@_db_options
@_filter_options
@click.option("--all", "everything", is_flag=True, help="Purge every dead letter (when no IDS or filter).")
@click.option("--yes", is_flag=True, help="Really delete (without it: say how many would go).")
@_friendly
def dead_purge(
    *, ids: tuple[int, ...], url: str | None, schema: str, as_json: bool, everything: bool, yes: bool, **f: Any
) -> None:
    """Delete dead letters matching IDS or the filters."""
    where = _where(ids, f, everything)
    with _store(url, schema) as store:
        if not yes:
            n = deadletters.count(store, where)
            raise CommandError(f"would delete {n} dead letter(s) of schema {schema!r}; pass --yes to delete them")
        purged = deadletters.purge(store, where, everything=everything)
    _emit({"purged": purged}, as_json, f"deleted {purged} dead letter(s)")


# -- queues, maintenance, RabbitMQ, metrics -----------------------------------


@akadze.command("purge")
@click.argument("queue")
@_db_options
@click.option("--yes", is_flag=True, help="Really delete (without it: say how many would go).")
@_friendly
def purge_cmd(*, queue: str, url: str | None, schema: str, as_json: bool, yes: bool) -> None:
    """Delete a queue's ready (and delayed) messages, like RabbitMQ's purge; held ones stay with consumers."""
    with _store(url, schema) as store:
        known = {q.queue: q for q in stats.queue_stats(store)}
        if queue not in known:
            names = ", ".join(sorted(known)) or "none"
            raise CommandError(f"no queue {queue!r} in schema {schema!r}; known queues: {names}")
        if not yes:
            n = known[queue].ready + known[queue].delayed
            raise CommandError(f"would delete {n} ready message(s) of queue {queue!r}; pass --yes to delete them")
        purged = store.queue_purge(name=queue)
    _emit({"queue": queue, "purged": purged}, as_json, f"deleted {purged} ready message(s) of queue {queue!r}")


@akadze.command("prune")
@_db_options
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True),
    default=deadletters.DEFAULT_RETENTION_DAYS,
    show_default=True,
    help="Delete dead letters buried more than this many days ago.",
)
@_friendly
def prune_cmd(*, url: str | None, schema: str, as_json: bool, days: float) -> None:
    """Delete old dead letters (for cron)."""
    with _store(url, schema) as store:
        pruned = deadletters.prune(store, days=days)
    _emit({"pruned": pruned, "days": days}, as_json, f"deleted {pruned} dead letter(s) older than {days:g} days")


@akadze.command("compact")
@_db_options
@click.option("--force", is_flag=True, help="Rebuild even when the indexes do not look bloated.")
@_friendly
def compact_cmd(*, url: str | None, schema: str, as_json: bool, force: bool) -> None:
    """Give back the index space a drained backlog left (REINDEX of a small heap; run as the table owner)."""
    with _store(url, schema) as store:
        result = compact.run_once(store, force=force)
    before, after = result.before, result.after
    text = (
        f"messages indexes {before.index_bytes / 2**20:.1f} MB -> {after.index_bytes / 2**20:.1f} MB "
        f"(heap {after.heap_bytes / 2**20:.1f} MB)"
        if result.compacted
        else f"nothing done: {result.skipped}"
    )
    data = {"compacted": result.compacted, "skipped": result.skipped, "before": vars(before), "after": vars(after)}
    _emit(data, as_json, text)


@akadze.command("move")
@click.option("--from", "source", required=True, envvar="AKADZE_MOVE_FROM", help="RabbitMQ URL, amqp://...")
@click.option("--queues", required=True, help="Comma-separated RabbitMQ queue names (same names in akadze).")
@_db_options
@click.option("--dry-run", is_flag=True, help="Count the messages only (fetched without ack, then requeued).")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=rabbitmq.DEFAULT_BATCH,
    show_default=True,
    help="Messages per INSERT and per ack; a crash repeats at most one batch.",
)
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True), help="Ceiling in messages per second.")
@_friendly
def move_cmd(*, source: str, queues: str, url: str | None, schema: str, as_json: bool, **options: Any) -> None:
    """Drain RabbitMQ queues into akadze; nothing is acked before PostgreSQL committed it. Rerun to resume."""
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names:
        raise click.UsageError("--queues needs at least one name, e.g. --queues celery,emails")
    reporter = rabbitmq.ProgressPrinter(sys.stderr)
    with _store(url, schema) as store:
        try:
            result = rabbitmq.move(source, store, names, progress=reporter, **options)
        except KeyboardInterrupt:
            raise CommandError("interrupted: what was moved is committed and acked; rerun to resume") from None
        finally:
            reporter.done()
    per_queue = ", ".join(f"{q}: {n}" for q, n in result.moved.items())
    text = (
        f"{'would move' if result.dry_run else 'moved'} {result.total} message(s) ({per_queue}) "
        f"in {result.seconds:.1f} s, {result.rate:.0f} msgs/s, {result.bytes} bytes"
    )
    _emit(result.as_dict(), as_json, text)


@akadze.command("metrics")
@url_option
@schema_option
@ttl_option
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True, help="TCP port (0: any).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@_friendly
def metrics_cmd(*, url: str | None, schema: str, consumer_ttl: float, port: int, host: str) -> None:
    """Serve Prometheus metrics at http://HOST:PORT/metrics until Ctrl-C."""
    with _store(url, schema) as store:
        try:
            server = metrics.make_server(store, host=host, port=port, ttl=consumer_ttl)
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}; pick another --port") from exc
        click.echo(f"serving http://{host}:{server.server_address[1]}/metrics", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def main() -> None:
    try:
        akadze.main(standalone_mode=True)
    except AkadzeError as exc:
        click.echo(f"akadze: {exc}", err=True)
        sys.exit(2)
