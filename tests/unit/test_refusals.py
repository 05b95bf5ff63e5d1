"""A refused login (wrong password, unknown role or database, pg_hba.conf) is told apart from an outage by
the server's message or SQLSTATE; only a URL that never worked in this process fails for good."""

from __future__ import annotations

import psycopg
import pytest

from kombu_akadze.errors import PermanentConnectionError, TransientDatabaseError
from kombu_akadze.store import is_transient, translate
from kombu_akadze.store.refusals import accepted, refusal

FAILED = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize(
    ("message", "sqlstate", "reason", "code"),
    [
        (FAILED + 'FATAL:  password authentication failed for user "app"', None, "wrong password", "28P01"),
        (FAILED + "fe_sendauth: no password supplied", None, "no password given", None),
        (FAILED + 'FATAL:  role "ap" does not exist', None, "unknown role", "28000"),
        (FAILED + 'FATAL:  role "app" is not permitted to log in', None, "role without LOGIN", "28000"),
        (FAILED + 'FATAL:  database "prj" does not exist', None, "unknown database", "3D000"),
        (FAILED + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", database "proj"', None,
         "no pg_hba.conf entry", "28000"),
        (FAILED + 'FATAL:  Peer authentication failed for user "app"', None, "authentication refused", "28000"),
        (FAILED + 'FATAL:  permission denied for database "proj"', None, "no CONNECT privilege", "42501"),
        (FAILED + "ERROR:  no such database: proj", None, "unknown database (PgBouncer)", "08P01"),
        ("anything the server says", "28P01", "login refused", "28P01"),
    ],
)  # fmt: skip
def test_a_refused_login_is_recognised_with_its_sqlstate(
    message: str, sqlstate: str | None, reason: str, code: str | None
) -> None:
    found = refusal(message, sqlstate)
    assert found is not None
    assert (found.reason, found.sqlstate) == (reason, code)
    assert found.fix


@pytest.mark.parametrize(
    ("message", "sqlstate"),
    [
        (FAILED + "Connection refused", None),
        (FAILED + "FATAL:  the database system is starting up", None),
        (FAILED + "FATAL:  sorry, too many clients already", None),
        (FAILED + 'FATAL:  too many connections for role "app"', None),
        (FAILED + "server closed the connection unexpectedly", None),
        ("failed to resolve host 'db': [Errno -3] Temporary failure in name resolution", None),
        ('relation "akadze.messages" does not exist', "42P01"),
        ('database "x" does not exist', "55000"),  # a statement's error carries its SQLSTATE: it decides
    ],
)
def test_an_outage_or_a_statement_error_is_no_refusal(message: str, sqlstate: str | None) -> None:
    assert refusal(message, sqlstate) is None


def test_the_refusing_hosts_line_is_quoted_from_a_multi_host_error() -> None:
    message = (
        'connection failed: connection to server at "a", port 5432 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?\n"
        'connection to server at "b", port 5432 failed: FATAL:  password authentication failed for user "app"'
    )
    found = refusal(message, None)
    assert found is not None
    assert found.line.startswith('connection to server at "b"')


def test_a_refusal_is_permanent_unless_the_url_worked_before_in_this_process() -> None:
    exc = psycopg.OperationalError(FAILED + 'FATAL:  role "app" is not permitted to log in')
    dsn = "postgresql://app:s3cret@10.0.0.5:5432/proj?application_name=test_refusals"
    first = translate(exc, "connecting to postgresql://app:**@10.0.0.5:5432/proj", "akadze", dsn=dsn)
    assert isinstance(first, PermanentConnectionError)
    assert not isinstance(first, ConnectionError)  # so kombu and Celery do not retry it
    assert "role without LOGIN (SQLSTATE 28000)" in str(first)
    assert "ALTER ROLE ... LOGIN" in str(first)
    assert "Not retried" in str(first)
    assert not is_transient(exc)
    accepted(dsn)
    later = translate(exc, "connecting to postgresql://app:**@10.0.0.5:5432/proj", "akadze", dsn=dsn)
    assert isinstance(later, TransientDatabaseError)
    assert "connected with this URL before" in str(later)
    assert "s3cret" not in str(first) + str(later)


def test_an_outage_is_transient_and_does_not_promise_a_retry() -> None:
    exc = psycopg.OperationalError(FAILED + "Connection refused")
    error = translate(exc, "connecting", "akadze", dsn="postgresql://h/never_connected")
    assert isinstance(error, TransientDatabaseError)
    assert "transient database error, retryable" in str(error)
    assert "will retry" not in str(error)
