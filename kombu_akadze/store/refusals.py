"""Connections the server refuses for good (wrong password, unknown role or database, no pg_hba.conf entry),
told apart from outages a retry outlives, with what to fix.

libpq does not expose the SQLSTATE of an error that ends a connection attempt (psycopg's ``sqlstate`` is
None then), so a refusal at connect is recognised by the server's message; an error that carries a
SQLSTATE is judged by it. Anything not recognised here stays transient, as before: a new kind of refusal
costs retries, never a worker that gives up on an outage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kombu_akadze.errors import DatabaseError, PermanentConnectionError, TransientDatabaseError
from kombu_akadze.urls import mask_password

#: SQLSTATEs of a refused login, when the error carries one (invalid_authorization_specification,
#: invalid_password, invalid_catalog_name).
PERMANENT_SQLSTATES = frozenset({"28000", "28P01", "3D000"})

#: DSNs this process has connected with. A refusal of one of them (a role set NOLOGIN for a while, a
#: password rotation half done) is retried like an outage, since it worked and may work again; a
#: refusal of a DSN that never worked is a mistake to fix, reported at once.
_ACCEPTED: set[str] = set()


@dataclass(frozen=True)
class Refusal:
    """Why the server refused, the SQLSTATE it sent (None: decided by libpq, client-side), the fix, and
    the line of the error that says so (of a multi-host URL's errors, the refusing host's)."""

    reason: str
    sqlstate: str | None
    fix: str
    line: str


# (pattern, SQLSTATE, reason, fix); a fix may name the pattern's groups. First match wins, so the
# specific messages come before the general "... authentication failed for user".
_RULES: tuple[tuple[re.Pattern[str], str | None, str, str], ...] = (
    (
        re.compile(r'password authentication failed for user "(?P<user>[^"]*)"'),
        "28P01",
        "wrong password",
        "check the password of role {user!r} in the broker URL (or in PGPASSWORD / ~/.pgpass), "
        "or set it on the server: ALTER ROLE ... PASSWORD '...'",
    ),
    (
        re.compile(r"fe_sendauth: no password supplied"),
        None,
        "no password given",
        "the server asks for a password: put it in the broker URL "
        "(akadze+postgresql://user:password@host:5432/dbname), PGPASSWORD or ~/.pgpass",
    ),
    (
        re.compile(r'role "(?P<user>[^"]*)" does not exist'),
        "28000",
        "unknown role",
        "create the role (CREATE ROLE ... LOGIN PASSWORD '...') or fix the user name in the broker URL "
        "(akadze+postgresql://user:password@host:5432/dbname)",
    ),
    (
        re.compile(r'role "(?P<user>[^"]*)" is not permitted to log in'),
        "28000",
        "role without LOGIN",
        "ALTER ROLE ... LOGIN, or connect as a role that may log in",
    ),
    (
        re.compile(r'database "(?P<database>[^"]*)" does not exist'),
        "3D000",
        "unknown database",
        "create it (CREATE DATABASE ...) or fix the database name, the part after the last '/' of the broker URL",
    ),
    (
        re.compile(r"no such database: (?P<database>\S+)"),
        "08P01",
        "unknown database (PgBouncer)",
        "add the database to the [databases] section of pgbouncer.ini, or fix the database name in the broker URL",
    ),
    (
        re.compile(r"no pg_hba\.conf entry for|pg_hba\.conf rejects connection"),
        "28000",
        "no pg_hba.conf entry",
        "add a line for this client address, user and database to the server's pg_hba.conf "
        "(then SELECT pg_reload_conf()), or connect as a user it lets in",
    ),
    (
        re.compile(r'(?P<method>\w+) authentication failed for user "(?P<user>[^"]*)"'),
        "28000",
        "authentication refused",
        "the server's pg_hba.conf asks {method} authentication of role {user!r}: connect in a way that "
        "passes it (user, password, certificate), or change pg_hba.conf",
    ),
    (
        re.compile(r'permission denied for database "(?P<database>[^"]*)"'),
        "42501",
        "no CONNECT privilege",
        "GRANT CONNECT ON DATABASE ... TO the role of the broker URL",
    ),
    (
        re.compile(r"server does not support SSL, but SSL was required"),
        None,
        "TLS required but not offered",
        "enable ssl on the server, or lower sslmode in the broker URL (sslmode=prefer)",
    ),
)


def refusal(message: str, sqlstate: str | None) -> Refusal | None:
    """The refusal an error stands for, if it is one retrying cannot fix (None: it may heal)."""
    if sqlstate is not None and sqlstate not in PERMANENT_SQLSTATES:
        return None
    for pattern, state, reason, fix in _RULES:
        match = pattern.search(message)
        if match:
            line = message[message.rfind("\n", 0, match.start()) + 1 :].split("\n", 1)[0].strip()
            return Refusal(reason, sqlstate or state, fix.format(**match.groupdict()), line)
    if sqlstate is not None:
        first = message.strip().split("\n", 1)[0]
        return Refusal("login refused", sqlstate, "fix the user, password or database name of the broker URL", first)
    return None


def describe(refusal: Refusal, what: str) -> str:
    """The one-line error: where, why (with the SQLSTATE), what to fix, and that nothing retries it.
    The server's line names no password (the caller masks *what*)."""
    code = f"SQLSTATE {refusal.sqlstate}" if refusal.sqlstate else "refused by libpq"
    return (
        f"{what}: {refusal.reason} ({code}): {refusal.line}; {refusal.fix}. Not retried: "
        "only a change of configuration fixes this (see docs/operations.md, Troubleshooting)"
    )


def accepted(dsn: str) -> None:
    """Remember that *dsn* connected (see _ACCEPTED)."""
    _ACCEPTED.add(dsn)


def error_for(message: str, sqlstate: str | None, what: str, *, dsn: str | None) -> DatabaseError | None:
    """The error for a refused connection (None: not a refusal): permanent, unless *dsn* worked before
    in this process, when it is retried with the reason and the fix in every log line."""
    refused = refusal(message, sqlstate)
    if refused is None:
        return None
    if dsn is not None and dsn in _ACCEPTED:
        return TransientDatabaseError(
            f"{what}: {refused.reason}, though this process connected with this URL before: "
            f"{mask_password(refused.line)}; retryable, in case an operator's change is undone ({refused.fix})"
        )
    return PermanentConnectionError(mask_password(describe(refused, what)))
