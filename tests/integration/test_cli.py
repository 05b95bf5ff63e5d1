"""The `akadze` command line against real PostgreSQL: stats, dead letters, purge, prune, metrics, errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.ops.cli.main import akadze
from kombu_akadze.store import NewMessage, Store, migrate

OWNER = "consumer-a"
AKADZE = Path(sys.executable).with_name("akadze")


@pytest.fixture
def cli(pg_url: str, schema: str) -> Any:
    """Run `akadze ARGS` in-process with AKADZE_URL/AKADZE_SCHEMA pointing at the test schema."""
    runner = CliRunner()

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(akadze, list(args), env={"AKADZE_URL": pg_url, "AKADZE_SCHEMA": schema, **(env or {})})

    return run


def bury(store: Store, queue: str, n: int, *, reason: str = "bad input", task: str = "app.add") -> list[int]:
    for i in range(n):
        store.message_insert(NewMessage(queue=queue, body=f"{queue}-{i}".encode(), headers={"task": task}))
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    claimed = store.message_claim(queues=[queue], limits=[n], owner=OWNER)
    return sorted(store.message_bury([m.tag for m in claimed], reason=reason, owner=OWNER))


def every_command(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found.extend(every_command(command, (*prefix, name)))
    return found


@pytest.mark.parametrize("path", every_command(akadze), ids=" ".join)
def test_every_command_has_help(cli: Any, path: tuple[str, ...]) -> None:
    result = cli(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_migrate_commands_still_work(cli: Any) -> None:
    assert cli("migrate", "status").exit_code == 0
    assert "up to date" in cli("migrate", "status").output
    assert cli("migrate").exit_code == 0


def test_stats_groups_celerys_own_queues_and_all_lists_them(cli: Any, store: Store) -> None:
    internal = [
        "celery@host-1.celery.pidbox",
        "4f1c2a3b-aaaa-bbbb-cccc-0123456789ab.reply.celery.pidbox",
        "celeryev.5d0c9a77-1f7e-4c41-8d7e-6a2b0f3c9e11",
        "0b6d7c1e-9f2a-3b4c-8d5e-6f7a8b9c0d1e",  # an rpc:// result queue
    ]
    for name in ["emails", *internal]:
        store.message_insert(NewMessage(queue=name, body=b"x"))

    text = cli("stats")
    assert text.exit_code == 0, text.output
    assert [line.split()[0] for line in text.output.splitlines()[1:2]] == ["emails"]
    assert "(and 4 Celery queue(s) of remote control, events or rpc:// results: --all shows them)" in text.output
    assert not any(name in text.output for name in internal)
    data = json.loads(cli("stats", "--json").output)
    assert ([q["queue"] for q in data["queues"]], data["internal_queues_hidden"]) == (["emails"], 4)

    every = cli("stats", "--all")
    assert every.exit_code == 0, every.output
    assert all(name in every.output for name in internal)
    assert "--all shows them" not in every.output


def test_migrate_subcommands_take_url_schema_and_json_after_the_subcommand_as_the_quickstart_writes_them(
    pg_url: str, schema: str
) -> None:
    runner = CliRunner()
    status = runner.invoke(akadze, ["migrate", "status", "--url", pg_url, "--schema", schema], env={})
    assert status.exit_code == 0, status.output
    assert f"schema {schema!r}: version" in status.output
    assert "up to date" in status.output

    applied = runner.invoke(akadze, ["migrate", "--url", pg_url, "--schema", schema], env={})
    assert applied.exit_code == 0, applied.output
    as_json = runner.invoke(akadze, ["migrate", "--json", "status", "--url", pg_url, "--schema", schema], env={})
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)["pending"] == []
    # given after the subcommand, an option wins over the group's (and over the environment)
    other = runner.invoke(
        akadze, ["migrate", "--schema", "not_this_one", "status", "--schema", schema], env={"AKADZE_URL": pg_url}
    )
    assert other.exit_code == 0, other.output
    assert "up to date" in other.output

    sql = runner.invoke(akadze, ["migrate", "sql", "--schema", "elsewhere"], env={})
    assert sql.exit_code == 0, sql.output
    assert 'CREATE SCHEMA IF NOT EXISTS "elsewhere";' in sql.output


def test_stats_shows_a_table_and_json(cli: Any, store: Store) -> None:
    store.message_insert_many([NewMessage(queue="work", body=b"x") for _ in range(4)])
    store.message_insert(NewMessage(queue="work", body=b"later", delay=3600))
    bury(store, "work", 1)

    text = cli("stats")
    assert text.exit_code == 0, text.output
    header, row, *rest = text.output.splitlines()
    assert header.split() == ["QUEUE", "READY", "HELD", "DELAYED", "DEAD", "OLDEST", "READY"]
    assert row.split()[:5] == ["work", "4", "0", "1", "1"]
    assert "consumers alive: 1" in rest[-1]

    data = json.loads(cli("stats", "--json").output)
    (work,) = data["queues"]
    assert (work["ready"], work["held"], work["delayed"], work["dead"]) == (4, 0, 1, 1)
    assert data["consumers_alive"] == 1


def test_stats_watch_refreshes_count_times(cli: Any, store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"x"))
    result = cli("stats", "--json", "--watch", "0.01", "--count", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["queues"][0]["ready"] == 1 for line in lines)
    assert cli("stats", "--watch", "--count", "1").exit_code == 0
    assert cli("stats", "--count", "2").exit_code == 2


def test_dead_list_show_replay_and_purge(cli: Any, store: Store) -> None:
    a = bury(store, "a", 2, reason="ValueError: bad input")
    b = bury(store, "b", 1, reason="max_attempts exceeded", task="app.mul")

    listed = cli("dead", "list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[0].split() == ["ID", "QUEUE", "TASK", "REASON", "ATTEMPTS", "DEAD", "AT"]
    assert len(listed.output.splitlines()) == 4
    only_b = json.loads(cli("dead", "list", "--task", "app.mul", "--json").output)
    assert [d["id"] for d in only_b] == b
    assert json.loads(cli("dead", "list", "--older-than", "1h", "--json").output) == []

    shown = json.loads(cli("dead", "show", str(a[0]), "--json").output)
    assert (shown["queue"], shown["body_repr"], shown["headers"]) == ("a", "b'a-0'", {"task": "app.add"})
    assert "body (3 bytes): b'a-0'" in cli("dead", "show", str(a[0])).output
    missing = cli("dead", "show", "999999")
    assert missing.exit_code == 2
    assert "no dead letter with id 999999" in missing.output

    replayed = json.loads(cli("dead", "replay", "--queue", "a", "--json").output)
    assert replayed == {"replayed": a, "already_live": []}
    assert "replayed 0 dead letter(s)" in cli("dead", "replay", *map(str, a)).output
    assert store.message_counts() == {("a", "ready"): 2}

    refused = cli("dead", "purge", "--reason", "max_attempts")
    assert refused.exit_code == 2
    assert "would delete 1 dead letter(s)" in refused.output
    assert "deleted 1 dead letter(s)" in cli("dead", "purge", "--reason", "max_attempts", "--yes").output
    assert json.loads(cli("dead", "list", "--json").output) == []


def test_dead_replay_and_purge_need_ids_a_filter_or_all(cli: Any, store: Store) -> None:
    bury(store, "a", 2)
    for command in ("replay", "purge"):
        result = cli("dead", command, "--yes") if command == "purge" else cli("dead", command)
        assert result.exit_code == 2
        assert "--all" in result.output
    assert "deleted 2 dead letter(s)" in cli("dead", "purge", "--all", "--yes").output


def test_purge_deletes_ready_messages_only_and_needs_yes(cli: Any, store: Store) -> None:
    store.message_insert_many([NewMessage(queue="q", body=b"x") for _ in range(3)])
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    store.message_claim(queues=["q"], limits=[1], owner=OWNER)

    refused = cli("purge", "q")
    assert refused.exit_code == 2
    assert "would delete 2 ready message(s) of queue 'q'; pass --yes" in refused.output
    unknown = cli("purge", "nope", "--yes")
    assert unknown.exit_code == 2
    assert "no queue 'nope'" in unknown.output
    assert "known queues: q" in unknown.output

    done = cli("purge", "q", "--yes", "--json")
    assert json.loads(done.output) == {"queue": "q", "purged": 2}
    assert store.message_counts() == {("q", "held"): 1}


def test_prune_deletes_only_old_dead_letters(cli: Any, store: Store) -> None:
    bury(store, "a", 2)
    assert json.loads(cli("prune", "--json").output) == {"pruned": 0, "days": 14.0}
    assert cli("prune", "--days", "0").exit_code == 2
    assert len(json.loads(cli("dead", "list", "--json").output)) == 2


def test_compact_says_why_it_does_nothing_and_rebuilds_with_force(cli: Any, store: Store) -> None:
    store.message_insert(NewMessage(queue="a", body=b"stays"))
    idle = cli("compact")
    assert idle.exit_code == 0, idle.output
    assert "nothing done: indexes are" in idle.output
    forced = json.loads(cli("compact", "--force", "--json").output)
    assert forced["compacted"] is True
    assert forced["after"]["index_bytes"] > 0
    assert sum(store.message_counts().values()) == 1
    missing = cli("compact", "--schema", "never_migrated_here")
    assert missing.exit_code == 2
    assert "akadze migrate" in missing.output


def test_compact_waits_for_a_busy_table_only_as_long_as_it_is_told(cli: Any, pg_url: str, store: Store) -> None:
    """A session holds the messages table (as a long write would): the REINDEX gives up after --lock-timeout
    and says how to go on; given longer than the holder keeps it, it runs once the lock is released."""
    store.message_insert(NewMessage(queue="a", body=b"stays"))
    holder = psycopg.connect(pg_url)
    holder.execute(f'LOCK TABLE "{store.schema}".messages IN ROW EXCLUSIVE MODE')  # a write's lock: REINDEX waits
    try:
        busy = cli("compact", "--force", "--lock-timeout", "0.2")
        assert busy.exit_code == 0, busy.output
        assert "busy for 0.2 s" in busy.output, busy.output
        assert "--lock-timeout" in busy.output, busy.output
        assert json.loads(cli("compact", "--force", "--lock-timeout", "0.2", "--json").output)["busy"] is True
        release = threading.Timer(1.0, holder.commit)
        release.start()
        waited = json.loads(cli("compact", "--force", "--lock-timeout", "60", "--json").output)
        release.join()
    finally:
        holder.close()
    assert waited["compacted"] is True, waited
    assert waited["busy"] is False, waited
    assert sum(store.message_counts().values()) == 1
    invalid = cli("compact", "--lock-timeout", "0")
    assert invalid.exit_code == 2
    assert "--lock-timeout" in invalid.output


def test_errors_are_one_line_exit_2_and_never_show_the_password(cli: Any, pg_url: str) -> None:
    refused = cli("stats", env={"AKADZE_URL": "postgresql://akadze:s3cret@127.0.0.1:1/db"})
    assert refused.exit_code == 2
    assert "s3cret" not in refused.output
    assert "cannot connect to PostgreSQL at postgresql://akadze:**@127.0.0.1:1/db" in refused.output

    no_url = CliRunner().invoke(akadze, ["stats"], env={"AKADZE_URL": ""})
    assert no_url.exit_code == 2
    assert "pass --url postgresql://" in no_url.output

    no_schema = cli("dead", "list", "--schema", "never_migrated_here")
    assert no_schema.exit_code == 2
    assert "akadze migrate" in no_schema.output
    for command in (["stats"], ["dead", "list"]):  # no internal statement name ("queue_stats:") first
        unmigrated = cli(*command, "--schema", "never_migrated_here")
        assert unmigrated.exit_code == 2
        assert unmigrated.output.startswith("Error: the kombu-akadze schema 'never_migrated_here' is not there")

    bad_duration = cli("dead", "list", "--older-than", "3 weeks")
    assert bad_duration.exit_code == 2
    assert "s, m, h or d" in bad_duration.output


def run_celery(app_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`celery -A proj ARGS` in *app_dir*, with neither AKADZE_URL nor AKADZE_SCHEMA set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKADZE_")}
    env["PYTHONPATH"] = str(app_dir)
    return subprocess.run(
        [str(AKADZE.with_name("celery")), "-A", "proj", *args],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_celery_akadze_takes_the_url_and_schema_from_the_app(
    tmp_path: Path, pg_url: str, schema: str, store: Store
) -> None:
    store.message_insert_many([NewMessage(queue="from_the_app", body=b"x") for _ in range(3)])
    (tmp_path / "proj.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('proj', broker={'akadze+' + pg_url!r})\n"
        f"app.conf.broker_transport_options = {{'schema': {schema!r}}}\n"
    )

    stats_run = run_celery(tmp_path, "akadze", "stats", "--json")
    assert stats_run.returncode == 0, stats_run.stderr
    assert [(q["queue"], q["ready"]) for q in json.loads(stats_run.stdout)["queues"]] == [("from_the_app", 3)]
    status = run_celery(tmp_path, "akadze", "migrate", "status")
    assert status.returncode == 0, status.stderr
    assert f"schema {schema!r}" in status.stdout

    with (tmp_path / "proj.py").open("a") as app_module:  # its TLS settings apply too
        app_module.write("app.conf.broker_use_ssl = {'sslmode': 'no-such-mode'}\n")
    tls = run_celery(tmp_path, "akadze", "stats")
    assert tls.returncode == 2
    assert 'invalid sslmode value: "no-such-mode"' in tls.stderr

    (tmp_path / "proj.py").write_text(
        "from celery import Celery\napp = Celery('proj', broker='amqp://guest:s3cret@127.0.0.1:5672//')\n"
    )
    rabbit = run_celery(tmp_path, "akadze", "stats")
    assert rabbit.returncode == 2
    assert "the app's broker_url 'amqp://guest:**@127.0.0.1:5672//' is not PostgreSQL: pass --url" in rabbit.stderr
    assert "s3cret" not in rabbit.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_command_serves_prometheus_text(pg_url: str, schema: str, store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"x"))
    port = free_port()
    env = {**os.environ, "AKADZE_URL": pg_url, "AKADZE_SCHEMA": schema}
    proc = subprocess.Popen(
        [str(AKADZE), "metrics", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return str(resp.read().decode())
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, "akadze metrics exited"
            return ""

    try:
        body = eventually(scrape, timeout=30, what="akadze metrics answers")
        found = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
        }
        assert found[("akadze_queue_messages", (("queue", "q"), ("state", "ready")))] == 1
        assert found[("akadze_consumers_alive", ())] == 0
        assert found[("akadze_up", ())] == 1
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    "command",
    [("dead", "purge", "--all", "--yes"), ("dead", "replay", "--all"), ("prune",), ("purge", "q", "--yes")],
    ids=" ".join,
)
def test_commands_that_write_migrate_first_unless_no_migrate(
    cli: Any, pg_url: str, schema: str, command: tuple[str, ...]
) -> None:
    """The transport migrates on first use (auto_migrate); so does every command that writes. A
    least-privilege role passes --no-migrate and is told what to run."""
    fresh = f"{schema}_w"
    try:
        refused = cli(*command, "--no-migrate", env={"AKADZE_SCHEMA": fresh})
        assert refused.exit_code == 2, refused.output
        assert "run `akadze migrate" in refused.output
        assert migrate.status(pg_url, fresh).current == 0
        done = cli(*command, env={"AKADZE_SCHEMA": fresh})
        assert "schema is not there" not in done.output
        assert migrate.status(pg_url, fresh).up_to_date
    finally:
        migrate.drop(pg_url, fresh)
        migrate.forget_checks()
