"""The ``akadze`` command line (also ``celery akadze``): a thin click layer over the library APIs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from kombu_akadze.errors import AkadzeError
from kombu_akadze.lease import compact
from kombu_akadze.ops import deadletters, metrics, progress, rabbitmq, stats
from kombu_akadze.ops.cli.common import (
    CommandError,
    db_options,
    dsn_of,
    emit,
    for_humans,
    friendly,
    json_option,
    open_store,
    schema_option,
    ttl_option,
    url_option,
    write_options,
)
from kombu_akadze.ops.cli.dead import dead
from kombu_akadze.store import migrate
from kombu_akadze.urls import mask_password

F = TypeVar("F", bound=Callable[..., Any])


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
    dsn = dsn_of(url)
    applied = migrate.apply(dsn, schema)
    st = migrate.status(dsn, schema)
    names = [f"{m.version:04d}_{m.name}" for m in applied]
    emit(
        {"schema": schema, "applied": names, "version": st.current},
        as_json,
        f"schema {schema!r} at {mask_password(dsn)}: applied {len(applied)} migration(s)"
        + (f" ({', '.join(names)})" if names else "")
        + f"; now at version {st.current}",
    )


migrate_cmd.name = "migrate"


def sub_options(func: F) -> F:
    """--url, --schema and --json after a migrate subcommand too (``akadze migrate status --url ...``);
    given there, they win over the same options given before it."""
    func = click.option("--url", default=None, help="PostgreSQL URL (env AKADZE_URL); akadze+ prefix accepted.")(func)
    func = click.option("--schema", default=None, help="Schema of the tables (env AKADZE_SCHEMA, default akadze).")(
        func
    )
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(func)


def merged(ctx: click.Context, **given: Any) -> dict[str, Any]:
    """The subcommand's options where given (a flag only when set), else the group's."""
    return {name: value if value else ctx.obj[name] for name, value in given.items()}


@migrate_cmd.command("status")
@sub_options
@click.pass_context
def migrate_status(ctx: click.Context, url: str | None, schema: str | None, as_json: bool) -> None:
    """Show the schema version and pending migrations; exit 1 when any are pending."""
    o = merged(ctx, url=url, schema=schema, as_json=as_json)
    st = migrate.status(dsn_of(o["url"]), o["schema"])
    pending = [f"{m.version:04d}_{m.name}" for m in st.pending]
    emit(
        {"schema": st.schema, "current": st.current, "latest": st.latest, "pending": pending},
        o["as_json"],
        f"schema {st.schema!r}: version {st.current} of {st.latest}"
        + (f"; pending: {', '.join(pending)}" if pending else "; up to date"),
    )
    if pending:
        ctx.exit(1)


@migrate_cmd.command("sql")
@click.option("--schema", default=None, help="Schema of the tables (env AKADZE_SCHEMA, default akadze).")
@click.pass_context
def migrate_sql(ctx: click.Context, schema: str | None) -> None:
    """Print every migration as SQL, without connecting."""
    click.echo(migrate.plan_sql(merged(ctx, schema=schema)["schema"]), nl=False)


# -- operations ---------------------------------------------------------------


@akadze.command("stats")
@db_options
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
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also list Celery's own queues (remote control *.pidbox, celeryev.*, rpc:// result queues).",
)
@friendly
def stats_cmd(
    *,
    url: str | None,
    schema: str,
    as_json: bool,
    consumer_ttl: float,
    watch: float | None,
    count: int | None,
    show_all: bool,
) -> None:
    """Per queue: ready, held, delayed, dead letters, age of the oldest ready message; live consumers."""
    if count is not None and watch is None:
        raise click.UsageError("--count only makes sense with --watch [SECONDS]")
    with open_store(url, schema) as store:
        shown = 0
        try:
            while True:
                snap, hidden = stats.user_view(stats.snapshot(store, ttl=consumer_ttl), show_all=show_all)
                if watch is None:
                    emit(stats.as_dict(snap, hidden), as_json, stats.as_text(snap, consumer_ttl, hidden))
                    return
                if as_json:  # one JSON document per line while watching
                    click.echo(json.dumps(stats.as_dict(snap, hidden), default=str))
                else:
                    if sys.stdout.isatty():
                        click.clear()
                    click.echo(stats.as_text(snap, consumer_ttl, hidden) + "\n")
                shown += 1
                if count is not None and shown >= count:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            return


akadze.add_command(dead)


# -- queues, maintenance, RabbitMQ, metrics -----------------------------------


@akadze.command("purge")
@click.argument("queue")
@write_options
@click.option("--yes", is_flag=True, help="Really delete (without it: say how many would go).")
@friendly
def purge_cmd(*, queue: str, url: str | None, schema: str, as_json: bool, no_migrate: bool, yes: bool) -> None:
    """Delete a queue's ready (and delayed) messages, like RabbitMQ's purge; held ones stay with consumers."""
    with open_store(url, schema, auto_migrate=not no_migrate) as store:
        known = {q.queue: q for q in stats.queue_stats(store)}
        if queue not in known:
            names = ", ".join(sorted(known)) or "none"
            raise CommandError(f"no queue {queue!r} in schema {schema!r}; known queues: {names}")
        if not yes:
            n = known[queue].ready + known[queue].delayed
            raise CommandError(f"would delete {n} ready message(s) of queue {queue!r}; pass --yes to delete them")
        purged = store.queue_purge(name=queue)
    emit({"queue": queue, "purged": purged}, as_json, f"deleted {purged} ready message(s) of queue {queue!r}")


@akadze.command("prune")
@write_options
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True),
    default=deadletters.DEFAULT_RETENTION_DAYS,
    show_default=True,
    help="Delete dead letters buried more than this many days ago.",
)
@friendly
def prune_cmd(*, url: str | None, schema: str, as_json: bool, no_migrate: bool, days: float) -> None:
    """Delete old dead letters (for cron)."""
    with open_store(url, schema, auto_migrate=not no_migrate) as store:
        pruned = deadletters.prune(store, days=days)
    emit({"pruned": pruned, "days": days}, as_json, f"deleted {pruned} dead letter(s) older than {days:g} days")


@akadze.command("compact")
@db_options
@click.option("--force", is_flag=True, help="Rebuild even when the indexes do not look bloated.")
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0, min_open=True, max=600),
    default=compact.LOCK_TIMEOUT,
    show_default=True,
    help="Seconds the REINDEX waits for the messages table; publishes and claims queue behind it meanwhile.",
)
@friendly
def compact_cmd(*, url: str | None, schema: str, as_json: bool, force: bool, lock_timeout: float) -> None:
    """Give back the index space a drained backlog left (REINDEX of a small heap; run as the table owner)."""
    with open_store(url, schema) as store:
        result = compact.run_once(store, force=force, lock_timeout=lock_timeout)
    before, after = result.before, result.after
    if result.compacted:
        text = (
            f"messages indexes {before.index_bytes / 2**20:.1f} MB -> {after.index_bytes / 2**20:.1f} MB "
            f"(heap {after.heap_bytes / 2**20:.1f} MB)"
        )
    elif result.busy:
        text = (
            f"nothing done: the messages table was busy for {lock_timeout:g} s; run it again, or give it longer "
            "with --lock-timeout (publishes and claims wait behind a REINDEX that waits)"
        )
    else:
        text = f"nothing done: {result.skipped}"
    data = {
        "compacted": result.compacted, "skipped": result.skipped, "busy": result.busy,
        "before": vars(before), "after": vars(after),
    }  # fmt: skip
    emit(data, as_json, text)


@akadze.command("move")
@click.option("--from", "source", required=True, envvar="AKADZE_MOVE_FROM", help="RabbitMQ URL, amqp://...")
@click.option("--queues", required=True, help="Comma-separated RabbitMQ queue names (same names in akadze).")
@write_options
@click.option("--dry-run", is_flag=True, help="Count the messages only (fetched without ack, then requeued).")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=rabbitmq.DEFAULT_BATCH,
    show_default=True,
    help="Messages per INSERT and per ack; a crash repeats at most one batch.",
)
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True), help="Ceiling in messages per second.")
@friendly
def move_cmd(
    *, source: str, queues: str, url: str | None, schema: str, as_json: bool, no_migrate: bool, **options: Any
) -> None:
    """Drain RabbitMQ queues into akadze; nothing is acked before PostgreSQL committed it. Rerun to resume."""
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names:
        raise click.UsageError("--queues needs at least one name, e.g. --queues celery,emails")
    reporter = progress.MoveProgress(sys.stderr, dry_run=options["dry_run"])
    with open_store(url, schema, auto_migrate=not no_migrate) as store:
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
    emit(result.as_dict(), as_json, text)


@akadze.command("metrics")
@url_option
@schema_option
@ttl_option
@click.option(
    "--port", type=click.IntRange(0, 65535), default=metrics.DEFAULT_PORT, show_default=True, help="TCP port (0: any)."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@friendly
def metrics_cmd(*, url: str | None, schema: str, consumer_ttl: float, port: int, host: str) -> None:
    """Serve Prometheus metrics at http://HOST:PORT/metrics until Ctrl-C."""
    with open_store(url, schema) as store:
        try:
            server, thread = metrics.start_server(store, host=host, port=port, ttl=consumer_ttl)
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}; pick another --port") from exc
        click.echo(f"serving http://{host}:{server.server_address[1]}/metrics", err=True)
        try:
            while thread.is_alive():
                thread.join(1.0)
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()


def main() -> None:
    try:
        akadze.main(standalone_mode=True)
    except AkadzeError as exc:
        click.echo(f"akadze: {for_humans(exc)}", err=True)
        sys.exit(2)
