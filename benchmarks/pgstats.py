"""The benchmark's own PostgreSQL access: named blocks of benchmarks/queries.sql, run on a short session."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kombu_akadze.store.sqlfiles import quote_ident

_NAME = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.M)
_FILE = Path(__file__).with_name("queries.sql")


@cache
def blocks() -> dict[str, str]:
    text = _FILE.read_text(encoding="utf-8")
    matches = list(_NAME.finditer(text))
    found = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        found[match["name"]] = text[match.end() : end].strip()
    return found


def render(name: str, **identifiers: str) -> str:
    text = blocks()[name]
    for ident, value in identifiers.items():
        text = text.replace("{" + ident + "}", quote_ident(value))
    return text


class Pg:
    """One autocommit session for sampling counters and sizes; its own statements are few and counted."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-sampler")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Pg:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, name: str, params: dict[str, Any] | None = None, **identifiers: str) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(render(name, **identifiers), params)
            return cur.fetchall() if cur.description else []

    def one(self, name: str, params: dict[str, Any] | None = None, **identifiers: str) -> dict[str, Any]:
        return self.rows(name, params, **identifiers)[0]

    def run(self, name: str, params: dict[str, Any] | None = None, **identifiers: str) -> None:
        self.rows(name, params, **identifiers)

    # -- what the workloads sample ------------------------------------------

    def statements_available(self) -> bool:
        try:
            return bool(self.one("statements_available")["available"])
        except psycopg.Error:
            return False

    def activity_counter(self, use_statements: bool) -> int:
        """Statements so far (pg_stat_statements) or commits+rollbacks so far (pg_stat_database)."""
        self.run("stats_flush")
        if use_statements:
            return int(self.one("statements_calls")["calls"])
        row = self.one("database_transactions")
        return int(row["xact_commit"]) + int(row["xact_rollback"])

    def client_sessions(self) -> dict[str, int]:
        return {r["application_name"]: r["sessions"] for r in self.rows("client_sessions")}

    def sizes(self, schema: str, table: str) -> dict[str, int]:
        qualified = f"{quote_ident(schema)}.{quote_ident(table)}"
        return {k: int(v) for k, v in self.one("relation_sizes", {"table": qualified}).items()}
