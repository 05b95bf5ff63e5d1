"""The quickstart and the RabbitMQ migration walk-through, run as written: every file they show is written,
every command they show runs (and exits 0), every output they show is what the command prints, on a new
database of the test server and, for the migration, a RabbitMQ vhost of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from kombu_akadze.store import connect, sqlfiles

from . import docwalk

ROOT = Path(__file__).resolve().parents[2]
SQL = sqlfiles.parse_blocks(Path(__file__).with_name("docwalk.sql").read_text())
AMQP_URL = os.environ.get("AKADZE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
RABBITMQCTL = shutil.which("rabbitmqctl")

#: What a fresh clone does not have.
NOT_IN_A_CLONE = (".git", ".venv", "build", "dist", "site", "*.egg-info", "__pycache__", ".*_cache", ".akadze")

#: The reader's servers as the pages name them.
PAGE_PG = re.compile(r"postgresql://[^\s\"'@/]*@db\.internal:5432/app")
PAGE_AMQP = "amqp://guest:guest@rabbit:5672//"
#: Read-only commands whose output changes while workers run: rerun until it matches (or the deadline).
SETTLES = re.compile(r"\bstats\b|list_queues")


def _admin(pg_url: str, name: str, database: str) -> None:
    conn = connect(pg_url, role="test", connect_timeout=10)
    try:
        conn.autocommit = True
        conn.execute(SQL[name].replace("{database}", sqlfiles.quote_ident(database)).encode())
    finally:
        conn.close()


@pytest.fixture
def walk_db(pg_url: str) -> Iterator[str]:
    """The URL of a new, empty database on the test server, dropped afterwards."""
    parts = urlsplit(pg_url)
    if parts.scheme not in ("postgresql", "postgres"):
        pytest.skip(f"the walk needs the test server as a postgresql:// URL, not {parts.scheme!r}")
    database = f"akadze_walk_{uuid.uuid4().hex[:8]}"
    _admin(pg_url, "database_create", database)
    try:
        yield urlunsplit(parts._replace(path=f"/{database}"))
    finally:
        _admin(pg_url, "database_drop", database)


def base_env(*, with_package: bool) -> dict[str, str]:
    """The environment of a new terminal: no AKADZE_* settings; kombu-akadze on PATH only if *with_package*."""
    ours = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != ours]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKADZE_", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = os.pathsep.join([ours, *path] if with_package else path)
    return env


def walk(page: Path, term: docwalk.Terminal, *, settle: float = 90.0) -> list[str]:
    """Run *page* in *term*; every command it ran."""
    ran: list[str] = []
    for block in docwalk.blocks(page.read_text(encoding="utf-8")):
        if docwalk.write_file(term, block):
            continue
        if block.lang == "sh":
            for command in docwalk.commands(block.body):
                done = term.run(command)
                assert done.returncode == 0, f"{page.name}: `{command}` exited {done.returncode}:\n{done.stdout}"
                ran.append(command)
        elif block.lang == "console":
            for command, page_output in docwalk.console(block.body):
                # rabbitmqctl lists queues in no particular order
                order = sorted_rows if "list_queues" in command else str
                shown = order(page_output)
                deadline = time.monotonic() + (settle if SETTLES.search(command) else 0)
                while True:
                    done = term.run(command)
                    printed = order(done.stdout)
                    if docwalk.same(shown, printed) or time.monotonic() > deadline:
                        break
                    time.sleep(1.0)
                print(f"$ {command}\n{done.stdout.rstrip()}")  # with -s: the outputs to paste into the page
                assert docwalk.same(shown, printed), f"{page.name}: `{command}` printed\n{printed}\npage:\n{shown}"
                ran.append(command)
        elif block.lang == "pycon":
            done = docwalk.doctest_block(term, block)
            assert done.returncode == 0, f"{page.name}: the Python session failed:\n{done.stdout}"
            ran.append("pycon")
    return ran


def sorted_rows(text: str) -> str:
    lines = text.strip().splitlines()
    head = [line for line in lines if not re.match(r"^\S+\t\d+$", line)]
    return "\n".join(head + sorted(set(lines) - set(head)))


def test_the_quickstart_runs_as_written(tmp_path: Path, walk_db: str) -> None:
    """From a checkout: a fresh venv, the wheel built and installed, tables, a worker, a task and its result."""
    # a copy, as a clone would be: a build in the work tree would leave build/ there, whose stale files a
    # later wheel could carry
    shutil.copytree(ROOT, tmp_path / "kombu-akadze", ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))

    def to_real(text: str) -> str:
        return PAGE_PG.sub(walk_db, text)

    def to_page(text: str) -> str:
        return text.replace(walk_db, "postgresql://app@db.internal:5432/app")

    with docwalk.terminal(tmp_path, base_env(with_package=False), to_real, to_page) as term:
        ran = walk(ROOT / "docs" / "quickstart.md", term)
        worker_log = term.background[0].output() if term.background else ""
    assert any(c.startswith("pip install") and "dist/kombu_akadze-" in c for c in ran), ran
    assert any(" worker" in c for c in ran), ran
    assert "pycon" in ran
    assert re.search(r"Task proj\.tasks\.add\[[0-9a-f-]+\] succeeded in [\d.]+s: 5", worker_log), worker_log[-3000:]


@pytest.fixture
def vhost() -> Iterator[str]:
    """A RabbitMQ vhost of the walk's own (rabbitmqctl), else the test server's URL as it is."""
    parts = urlsplit(AMQP_URL)
    if RABBITMQCTL is None or parts.hostname not in ("127.0.0.1", "localhost"):
        yield AMQP_URL
        return
    name = f"akadze-walk-{uuid.uuid4().hex[:8]}"
    subprocess.run([RABBITMQCTL, "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(
            [RABBITMQCTL, "-q", "set_permissions", "-p", name, parts.username or "guest", ".*", ".*", ".*"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        subprocess.run([RABBITMQCTL, "-q", "delete_vhost", name], check=False, capture_output=True, timeout=60)


def test_the_migration_walkthrough_runs_as_written_and_every_task_runs_once(
    tmp_path: Path, walk_db: str, vhost: str
) -> None:
    """RabbitMQ holds 500 tasks; the page's steps move them to akadze, whose worker runs each exactly once."""
    probe = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("list_queues.py")), vhost, "/"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"no RabbitMQ at {AMQP_URL}: {probe.stdout}{probe.stderr}")
    name = urlsplit(vhost).path[1:] or "/"
    page_listing = "rabbitmqctl list_queues name messages"
    if RABBITMQCTL is not None and name != "/":
        real_listing = f"{page_listing} -p {name}"
    else:
        lister = Path(__file__).with_name("list_queues.py")
        real_listing = f"{sys.executable} {lister} {vhost} / celery emails"

    def to_real(text: str) -> str:
        return PAGE_PG.sub(walk_db, text).replace(PAGE_AMQP, vhost).replace(page_listing, real_listing)

    def to_page(text: str) -> str:
        text = text.replace(walk_db, "postgresql://app@db.internal:5432/app").replace(vhost, PAGE_AMQP)
        return text.replace(f"Listing queues for vhost {name} ...", "Listing queues for vhost / ...")

    with docwalk.terminal(tmp_path, base_env(with_package=True), to_real, to_page) as term:
        ran = walk(ROOT / "examples" / "migrate_from_rabbitmq.md", term)
        assert term.background, "the page starts no akadze worker"
        worker = term.background[0]
    assert {c.split()[1] for c in ran if c.startswith("akadze ")} >= {"migrate", "move", "stats"}
    log = worker.output()
    ran_ids = re.findall(r"Task proj\.\w+\[([0-9a-f-]+)\] succeeded", log)
    assert len(ran_ids) == 500, log[-3000:]
    assert len(set(ran_ids)) == 500  # each task once
