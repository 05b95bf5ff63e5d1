"""Schema migrations: plan, apply and status, one transaction each, under an advisory lock."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from kombu_akadze.errors import SchemaNotAppliedError, SchemaTooNewError
from kombu_akadze.store import connect, sqlfiles, translate
from kombu_akadze.store.sqlfiles import Migration
from kombu_akadze.urls import mask_password

logger = logging.getLogger("kombu_akadze")

_checked: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()


@dataclass(frozen=True)
class Status:
    schema: str
    current: int
    latest: int
    pending: tuple[Migration, ...]

    @property
    def up_to_date(self) -> bool:
        return self.current == self.latest


def _sql(name: str, schema: str) -> str:
    return sqlfiles.render(name, schema=schema)


def _current(conn: psycopg.Connection[Any], schema: str) -> int:
    table = f"{sqlfiles.quote_ident(schema)}.schema_version"
    present = conn.execute(_sql("version_table_exists", schema), {"table": table}).fetchone()
    if not present or not present[0]:
        return 0
    rows = conn.execute(_sql("version_list", schema)).fetchall()
    return max((int(r[0]) for r in rows), default=0)


def status(dsn: str, schema: str, *, connect_timeout: float = 10.0) -> Status:
    """Where the schema is, without changing anything."""
    try:
        with connect(dsn, role="migrate", connect_timeout=connect_timeout) as conn:
            current = _current(conn, schema)
    except psycopg.Error as exc:
        raise translate(exc, f"migrate status of {mask_password(dsn)}", schema, dsn=dsn) from exc
    known = sqlfiles.migrations()
    return Status(schema, current, len(known), tuple(m for m in known if m.version > current))


def plan_sql(schema: str) -> str:
    """Every migration as one SQL script, for review or for a DBA to run by hand."""
    parts = [_sql("schema_create", schema), _sql("version_table_create", schema)]
    for migration in sqlfiles.migrations():
        parts.append(f"-- {migration.version:04d}_{migration.name}")
        parts.append(sqlfiles.render_migration(migration.text, schema))
        # Names match [a-z0-9_]+ (sqlfiles checks), so inlining them as literals is safe.
        record = _sql("version_record", schema).replace("%(version)s", str(migration.version))
        parts.append(record.replace("%(name)s", f"'{migration.name}'") + ";")
    return "\n\n".join(parts) + "\n"


def apply(dsn: str, schema: str, *, connect_timeout: float = 10.0) -> list[Migration]:
    """Apply every pending migration, each in its own transaction, under the schema's advisory lock."""
    applied: list[Migration] = []
    known = sqlfiles.migrations()
    try:
        with connect(dsn, role="migrate", connect_timeout=connect_timeout, autocommit=False) as conn:
            for migration in known:
                with conn.transaction():
                    conn.execute(_sql("migrate_lock", schema), {"schema": schema})
                    conn.execute(_sql("schema_create", schema))
                    conn.execute(_sql("version_table_create", schema))
                    current = _current(conn, schema)
                    if current > len(known):
                        raise _too_new(schema, current, len(known))
                    if migration.version <= current:
                        continue
                    conn.execute(sqlfiles.render_migration(migration.text, schema))
                    conn.execute(_sql("version_record", schema), {"version": migration.version, "name": migration.name})
                    applied.append(migration)
                    logger.info(
                        "kombu-akadze: applied migration %04d_%s to schema %r",
                        migration.version,
                        migration.name,
                        schema,
                    )
    except psycopg.Error as exc:
        raise translate(exc, f"migrating schema {schema!r} at {mask_password(dsn)}", schema, dsn=dsn) from exc
    return applied


def ensure(dsn: str, schema: str, *, auto_migrate: bool, connect_timeout: float = 10.0) -> None:
    """Check (once per process) that the schema is current; apply migrations when allowed."""
    key = (dsn, schema)
    with _checked_lock:
        if key in _checked:
            return
        st = status(dsn, schema, connect_timeout=connect_timeout)
        if st.current > st.latest:
            raise _too_new(schema, st.current, st.latest)
        if not st.up_to_date:
            if not auto_migrate:
                raise SchemaNotAppliedError(
                    f"the kombu-akadze schema {schema!r} at {mask_password(dsn)} is at version {st.current}, "
                    f"this package needs {st.latest}: run `akadze migrate --url URL --schema {schema}` "
                    "(or set the transport option auto_migrate=True)"
                )
            apply(dsn, schema, connect_timeout=connect_timeout)
        _checked.add(key)


def forget_checks() -> None:
    """Make the next ensure() look at the database again (tests drop schemas)."""
    with _checked_lock:
        _checked.clear()


def _too_new(schema: str, current: int, latest: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"schema {schema!r} is at version {current}, this kombu-akadze knows up to {latest}: "
        "upgrade the package or run `akadze migrate status`"
    )


def drop(dsn: str, schema: str, *, connect_timeout: float = 10.0) -> None:
    """Drop the schema and every table in it."""
    try:
        with connect(dsn, role="migrate", connect_timeout=connect_timeout) as conn:
            conn.execute(_sql("schema_drop", schema))
    except psycopg.Error as exc:
        raise translate(exc, f"dropping schema {schema!r}", schema, dsn=dsn) from exc
