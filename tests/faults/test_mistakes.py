"""A newcomer's mistakes get an answer within seconds, from real `celery worker` processes and producers on a
throwaway server with password authentication: a refused login (wrong password, unknown role, unknown
database) stops the worker at start-up with what to fix, while an outage is still retried; a URL without a
database is refused with the valid form; a misspelled transport option is warned about once, with the
closest name; a broker URL kombu cannot map to a transport says what to write."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu
import pytest
from acceptance.conftest import CELERY, ROOT
from celery import Celery

from kombu_akadze.errors import ConfigurationError, PermanentConnectionError

from .conftest import SCHEMA
from .pgserver import HOST, PgServer, free_port

HERE = Path(__file__).resolve().parent
#: A role that must give its password (scram); every other role is trusted, as on the other fault servers.
PW_ROLE = "akadze_pw"
PASSWORD = "right-horse"
WRONG = "wrong-horse"
#: Seconds within which a mistake must be reported (a retried one took ~45 minutes).
FAST = 30.0
#: Seconds a worker gets to start on a loaded machine.
START = 120.0


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    pg = PgServer().init()
    hba = pg.data / "pg_hba.conf"
    hba.write_text(f"host all {PW_ROLE} {HOST}/32 scram-sha-256\n" + hba.read_text())
    try:
        pg.start()
        pg.execute("role_create_with_password", literals={"password": PASSWORD}, role=PW_ROLE)
        yield pg
    finally:
        pg.destroy()


@dataclass
class Run:
    """One process of the test: exit code (None: still running when the wait ended), seconds, output."""

    code: int | None
    seconds: float
    output: str


def _env(broker_url: str, *, options: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKADZE_", "MISTAKES_", "PG"))}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        MISTAKES_BROKER_URL=broker_url,
        MISTAKES_OPTIONS=json.dumps({"schema": SCHEMA, **(options or {})}),
        **extra,
    )
    return env


@dataclass
class Running:
    """A `celery -A mistakes_app worker` process and its log."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    began: float

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str | None, timeout: float = START) -> Run:
        """Until the worker exits, or *text* appears in its output; its exit code (None: running) and seconds."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if text is not None and text in self.output():
                break
            time.sleep(0.1)
        return Run(self.proc.poll(), time.monotonic() - self.began, self.output())

    def stop(self) -> None:
        """A warm shutdown, then SIGKILL to the whole group if it is still there."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(60)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)


@contextlib.contextmanager
def _running(tmp_path: Path, broker_url: str, *, options: dict[str, Any] | None = None) -> Iterator[Running]:
    """`celery -A mistakes_app worker` (prefork, events on: every connection a worker makes), stopped at exit."""
    log_path = tmp_path / f"worker-{time.monotonic_ns()}.log"
    command = [CELERY, "-A", "mistakes_app", "worker", "-P", "prefork", "-c", "1", "-E", "--loglevel=INFO"]
    with open(log_path, "wb") as log:
        began = time.monotonic()
        proc = subprocess.Popen(
            [*command, "-n", f"mistakes-{time.monotonic_ns()}@%h"],
            cwd=tmp_path,
            env=_env(broker_url, options=options),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        running = Running(proc, log_path, began)
        try:
            yield running
        finally:
            running.stop()


def _worker(tmp_path: Path, broker_url: str, *, options: dict[str, Any] | None = None, until: str | None = None) -> Run:
    """A worker until it exits, or until *until* appears in its output (then a warm shutdown)."""
    with _running(tmp_path, broker_url, options=options) as worker:
        run = worker.wait_for(until)
    return Run(run.code, run.seconds, worker.output())


def _producer(tmp_path: Path, broker_url: str, **extra: str) -> Run:
    """A plain Python process that imports the app and sends one task (no `celery` command)."""
    code = "import mistakes_app; mistakes_app.add.delay(2, 3); print('sent')"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_env(broker_url, **extra),
        capture_output=True,
        text=True,
        timeout=START,
        check=False,
    )
    return Run(done.returncode, time.monotonic() - began, done.stdout + done.stderr)


# -- refused logins -------------------------------------------------------------------------------------

REFUSALS = [
    pytest.param(
        {"user": f"{PW_ROLE}:{WRONG}"}, "wrong password (SQLSTATE 28P01)", "check the password", id="wrong-password"
    ),
    pytest.param({"user": "nobody_here"}, "unknown role (SQLSTATE 28000)", "CREATE ROLE", id="unknown-role"),
    pytest.param({"dbname": "no_such_db"}, "unknown database (SQLSTATE 3D000)", "CREATE DATABASE", id="unknown-db"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("parts", "reason", "fix"), REFUSALS)
def test_a_refused_login_stops_a_worker_at_start_up_with_what_to_fix(
    server: PgServer, tmp_path: Path, parts: dict[str, str], reason: str, fix: str
) -> None:
    run = _worker(tmp_path, "akadze+" + server.url(**parts))
    print(f"\n{reason}: worker exited {run.code} after {run.seconds:.1f} s")
    assert run.code == 1, run.output[-3000:]
    assert run.seconds < FAST
    assert reason in run.output
    assert fix in run.output
    assert "Not retried: only a change of configuration fixes this" in run.output
    assert "Trying again" not in run.output  # Celery's reconnect loop never started
    assert WRONG not in run.output


@pytest.mark.slow
@pytest.mark.parametrize(("parts", "reason", "fix"), REFUSALS)
def test_a_refused_login_fails_a_producer_at_once(
    server: PgServer, parts: dict[str, str], reason: str, fix: str
) -> None:
    url = "akadze+" + server.url(**parts)
    began = time.monotonic()
    with (
        kombu.Connection(url, transport_options={"schema": SCHEMA}) as conn,
        pytest.raises(PermanentConnectionError, match=fix) as kombu_error,
    ):
        conn.Producer().publish({"n": 1}, routing_key="celery", retry=True)
    kombu_seconds = time.monotonic() - began
    app = Celery("mistakes-producer", broker=url)
    app.conf.broker_transport_options = {"schema": SCHEMA}
    began = time.monotonic()
    try:
        with pytest.raises(PermanentConnectionError, match=fix) as celery_error:
            app.send_task("mistakes.add", args=[2, 3])  # Celery's default publish retry policy
    finally:
        app.close()
    celery_seconds = time.monotonic() - began
    print(f"\n{reason}: kombu publish failed after {kombu_seconds:.2f} s, send_task after {celery_seconds:.2f} s")
    for error in (kombu_error.value, celery_error.value):
        assert reason in str(error)
        assert "will retry" not in str(error)
        assert WRONG not in str(error)
    assert kombu_seconds < FAST
    assert celery_seconds < FAST


@pytest.mark.slow
def test_an_outage_is_still_retried_by_the_worker(tmp_path: Path) -> None:
    """The contrast: nothing listens on the port (a server down or restarting), so the worker keeps trying."""
    url = f"akadze+postgresql://postgres@{HOST}:{free_port()}/postgres"
    run = _worker(tmp_path, url, until="Trying again")
    print(f"\nserver down: first retry announced after {run.seconds:.1f} s")
    assert run.code is None, run.output[-3000:]  # still running when the retry was announced
    assert "transient database error, retryable" in run.output
    assert "Not retried" not in run.output


@pytest.mark.slow
def test_a_refused_listen_url_stops_a_worker_at_start_up_with_what_to_fix(server: PgServer, tmp_path: Path) -> None:
    """listen_url carries a consumer's heartbeat session (and its LISTEN): refused for good, the worker could
    hold no lease, so it exits at start-up with what to fix, as for a refused broker URL."""
    options = {"listen_url": server.url(user=f"{PW_ROLE}:{WRONG}")}
    run = _worker(tmp_path, "akadze+" + server.url(), options=options)
    print(f"\nlisten_url refused: worker exited {run.code} after {run.seconds:.1f} s")
    assert run.code == 1, run.output[-3000:]
    assert run.seconds < FAST
    assert "wrong password (SQLSTATE 28P01)" in run.output
    assert "Not retried: only a change of configuration fixes this" in run.output
    assert WRONG not in run.output


# -- a URL without a database ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_url_without_a_database_is_refused_with_the_valid_form(server: PgServer, tmp_path: Path) -> None:
    url = f"akadze+postgresql://postgres@{HOST}:{server.port}"
    valid = "'akadze+postgresql://user:password@host:5432/dbname'"
    probe = "akadze_nodb_probe"  # a schema of its own: other tests here create the default one
    run = _worker(tmp_path, url, options={"schema": probe})
    print(f"\nno database: worker exited {run.code} after {run.seconds:.1f} s")
    assert run.code == 1, run.output[-3000:]
    assert run.seconds < FAST
    assert "names no database" in run.output
    assert valid in run.output
    began = time.monotonic()
    with (
        kombu.Connection(url, transport_options={"schema": probe}) as conn,
        pytest.raises(ConfigurationError, match="names no database") as refused,
    ):
        conn.Producer().publish({"n": 1}, routing_key="celery", retry=True)
    assert time.monotonic() - began < FAST
    assert valid in str(refused.value)
    cli = subprocess.run(
        [str(Path(sys.executable).with_name("akadze")), "migrate", "--url", url[len("akadze+") :], "--schema", probe],
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=START,
        check=False,
    )
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "names no database" in cli.stderr
    # Nothing was created in the database libpq would have picked (the one named after the user).
    assert server.execute("schemas_present", {"names": [probe]}) == [(0,)]


# -- a misspelled transport option ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_misspelled_option_is_warned_about_once_with_the_closest_name(server: PgServer, tmp_path: Path) -> None:
    url = "akadze+" + server.url()
    run = _worker(tmp_path, url, options={"heartbeat_intervl": 2}, until=" ready.")
    assert " ready." in run.output, run.output[-3000:]
    warnings = [line for line in run.output.splitlines() if "unknown transport option" in line]
    print(f"\nwarnings: {len(warnings)}\n" + "\n".join(w[:160] for w in warnings))
    assert len(warnings) == 1
    assert "'heartbeat_intervl': did you mean 'heartbeat_interval'?" in warnings[0]
    assert "valid options: ack_batch_delay, auto_migrate," in warnings[0]


# -- URLs kombu cannot map to a transport ---------------------------------------------------------------


@pytest.mark.slow
def test_a_url_kombu_has_no_transport_for_says_what_to_write(server: PgServer, tmp_path: Path) -> None:
    plain = server.url()
    # The `celery` command imports kombu_akadze (celery.commands entry point): kombu suggests the alias.
    run = _worker(tmp_path, plain)
    print(f"\npostgresql:// broker_url: worker exited {run.code} after {run.seconds:.1f} s")
    assert run.code == 1, run.output[-3000:]
    assert run.seconds < FAST
    assert "No such transport: postgresql.  Did you mean akadze+postgresql?" in run.output
    # A plain Python producer never imports it (kombu has no entry point for transports): the bare error.
    bare = _producer(tmp_path, "akadze+" + plain)
    assert bare.code == 1
    assert "KeyError: 'No such transport: akadze'" in bare.output
    assert bare.seconds < FAST
    # The two fixes the docs give both work: import kombu_akadze, or name the class in broker_transport.
    imported = _producer(tmp_path, "akadze+" + plain, MISTAKES_IMPORT="1")
    assert (imported.code, imported.output.strip()) == (0, "sent")
    named = _producer(tmp_path, plain, MISTAKES_TRANSPORT="kombu_akadze.transport:Transport")
    assert (named.code, named.output.strip()) == (0, "sent")
    # ... and the errors are findable where users look first.
    troubleshooting = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for text in ("No such transport: akadze", "No such transport: postgresql", "broker_transport"):
        assert text in troubleshooting
