"""What every ``akadze`` command shares: the database options, opening a store, errors and formatting."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from kombu_akadze import embedded
from kombu_akadze.errors import AkadzeError
from kombu_akadze.ops import stats
from kombu_akadze.store import Store, migrate, sqlfiles
from kombu_akadze.urls import is_embedded, libpq_ssl, mask_password, to_dsn, with_options

F = TypeVar("F", bound=Callable[..., Any])


def dsn_of(url: str | None) -> str:
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


def emit(data: Any, as_json: bool, text: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def celery_app(ctx: click.Context) -> Any:
    """The Celery app of ``celery -A proj akadze ...`` (celery's context object carries it), else None."""
    return getattr(ctx.find_root().obj, "app", None)


_PG_PREFIXES = ("akadze:", "akadze+", "postgres:", "postgresql:", "postgresql+")


def _url_from_app(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Under ``celery -A proj``, no --url and no AKADZE_URL: the app's broker_url (the first of a failover
    list) with its broker_use_ssl, as its workers use them."""
    app = celery_app(ctx)
    if value or app is None:
        return value
    broker = app.conf.broker_url
    if not broker:
        return None
    first = (broker[0] if isinstance(broker, list | tuple) else str(broker)).split(";")[0].strip()
    if not first.startswith(_PG_PREFIXES):
        raise click.UsageError(
            f"the app's broker_url {mask_password(first)!r} is not PostgreSQL: pass --url "
            "postgresql://user@host:5432/db or set AKADZE_URL"
        )
    ssl = app.conf.broker_use_ssl
    if not ssl or is_embedded(first.removeprefix("akadze+")):
        return first
    try:  # the app's TLS settings (broker_use_ssl) apply as they do for its workers
        return with_options(to_dsn(first), libpq_ssl(ssl))
    except ValueError as exc:
        raise click.UsageError(f"the app's broker_use_ssl: {exc}") from None


def _schema_from_app(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Under ``celery -A proj``, no --schema and no AKADZE_SCHEMA: the app's transport option schema."""
    app = celery_app(ctx)
    if app is None or param.name is None or ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT:
        return value
    options = app.conf.broker_transport_options or {}
    return str(options.get("schema") or value)


url_option = click.option(
    "--url",
    envvar="AKADZE_URL",
    callback=_url_from_app,
    help="PostgreSQL URL (env AKADZE_URL; under `celery -A proj`: the app's broker_url); akadze+ prefix accepted.",
)
schema_option = click.option(
    "--schema",
    envvar="AKADZE_SCHEMA",
    default="akadze",
    show_default=True,
    callback=_schema_from_app,
    help="Schema of the tables (under `celery -A proj`: the app's transport option schema).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


class CommandError(click.ClickException):
    """A one-line error that says what is valid; exit code 2 like a usage error."""

    exit_code = 2


def for_humans(exc: AkadzeError) -> str:
    """An error's text for a person at a terminal: passwords masked, without the name of the statement
    that failed ("queue_stats: ..."), which the store puts first for logs and means nothing here."""
    text = mask_password(str(exc))
    name, sep, rest = text.partition(": ")
    return rest if sep and name in sqlfiles.all_blocks() else text


def friendly(func: F) -> F:
    """Turn kombu-akadze errors into CommandError (passwords masked), for every operations command."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AkadzeError as exc:
            raise CommandError(for_humans(exc)) from exc

    return wrapper  # type: ignore[return-value]


def db_options(func: F) -> F:
    return url_option(schema_option(json_option(func)))


migrate_option = click.option(
    "--no-migrate",
    is_flag=True,
    help="Never create or upgrade the schema (for a least-privilege role): fail when it is not current. "
    "By default a command that writes migrates first, as the transport does on first use (auto_migrate).",
)


def write_options(func: F) -> F:
    """The database options of a command that writes: it migrates first unless --no-migrate."""
    return db_options(migrate_option(func))


@contextmanager
def open_store(url: str | None, schema: str, *, auto_migrate: bool | None = None) -> Iterator[Store]:
    """A store on *url*; a command that writes passes *auto_migrate* (True: apply pending migrations
    first; False: fail with what to run when the schema is not current), a reader passes nothing."""
    dsn = dsn_of(url)
    store = Store(dsn, schema=schema, role="cli")
    try:
        store.connection()
    except AkadzeError as exc:  # the store's "will retry" wording is for the transport, not a command
        detail = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise CommandError(
            f"cannot connect to PostgreSQL at {mask_password(dsn)}: {mask_password(detail)}; check --url or AKADZE_URL"
        ) from exc
    try:
        if auto_migrate is not None:
            migrate.ensure(dsn, schema, auto_migrate=auto_migrate)
        yield store
    finally:
        store.close()


_DURATION_RE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Seconds, or a number with a unit: 90, 90s, 15m, 2h, 3d."""
    if value is None:
        return None
    match = _DURATION_RE.match(value)
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration: use seconds or a number with s, m, h or d (e.g. 2h)")
    return float(match["n"]) * _UNIT_SECONDS[match["unit"]]


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


ttl_option = click.option(
    "--consumer-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=stats.DEFAULT_CONSUMER_TTL,
    show_default=True,
    help="Seconds of heartbeat silence after which a consumer no longer counts as alive.",
)
