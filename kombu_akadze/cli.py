"""The ``akadze`` command line (also ``celery akadze``): a thin click layer over the library APIs."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from kombu_akadze import embedded, migrate
from kombu_akadze.errors import AkadzeError
from kombu_akadze.urls import is_embedded, mask_password, to_dsn


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


def main() -> None:
    try:
        akadze.main(standalone_mode=True)
    except AkadzeError as exc:
        click.echo(f"akadze: {exc}", err=True)
        sys.exit(2)
