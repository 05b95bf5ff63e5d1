"""Pure logic without a database: URL masking, options, tags, slot sharing, SQL files."""

from __future__ import annotations

import logging

import pytest

from kombu_akadze.consume.rounds import rotate as _rotate
from kombu_akadze.consume.rounds import split_slots as _split_slots
from kombu_akadze.errors import ConfigurationError
from kombu_akadze.lease import compact
from kombu_akadze.options import Options
from kombu_akadze.store import TableSize, sqlfiles
from kombu_akadze.transport.qos import make_tag, parse_tag
from kombu_akadze.urls import database_of, is_embedded, mask_password, to_dsn


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://bob:s3cret@db:5432/app", "postgresql://bob:**@db:5432/app"),
        ("akadze+postgresql://bob:s3cret@db/app", "akadze+postgresql://bob:**@db/app"),
        (
            "postgresql://bob@db/app?password=s3cret&sslmode=require",
            "postgresql://bob@db/app?password=**&sslmode=require",
        ),
        ("host=db user=bob password=s3cret dbname=app", "host=db user=bob password=** dbname=app"),
        ("host=db password='s3 cret' dbname=app", "host=db password=** dbname=app"),
        ("postgresql://bob@db/app", "postgresql://bob@db/app"),
    ],
)
def test_mask_password_hides_every_password_form(url: str, masked: str) -> None:
    assert mask_password(url) == masked
    assert "s3" not in mask_password(url)


def test_embedded_urls_are_recognised() -> None:
    assert is_embedded("akadze://")
    assert is_embedded("")
    assert not is_embedded("postgresql://db/app")


def test_to_dsn_rejects_non_postgres_urls_with_a_hint() -> None:
    with pytest.raises(ValueError, match="akadze\\+postgresql://") as info:
        to_dsn("mysql://bob:s3cret@db/app")
    assert "s3cret" not in str(info.value)


def test_options_defaults_follow_the_seed() -> None:
    opts = Options.from_transport_options({})
    assert (opts.heartbeat_interval, opts.heartbeat_ttl, opts.poll_interval, opts.max_attempts) == (5.0, 30.0, 1.0, 20)


def test_every_session_is_bounded_by_default_and_zero_turns_a_limit_off() -> None:
    opts = Options.from_transport_options({})
    assert (opts.lock_timeout, opts.statement_timeout) == (5.0, 300.0)
    off = Options.from_transport_options({"lock_timeout": "0", "statement_timeout": 0})
    assert (off.lock_timeout, off.statement_timeout) == (0.0, 0.0)
    assert Options.from_transport_options({"lock_timeout": 20, "statement_timeout": 0}).lock_timeout == 20.0


def test_options_coerce_strings_and_accept_kombu_alias() -> None:
    opts = Options.from_transport_options({"listen": "off", "max_attempts": "3", "polling_interval": 0.2})
    assert opts.listen is False
    assert opts.max_attempts == 3
    assert opts.poll_interval == 0.2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"heartbeat_ttl": 5, "heartbeat_interval": 5}, "at least twice"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": "many"}, "expected int"),
        ({"listen": "maybe"}, "expected bool"),
        ({"schema": ""}, "schema"),
        ({"queue_max_attempts": {"q": 0}}, "queue_max_attempts"),
        ({"poll_interval": -1}, "poll_interval"),
        ({"compact_interval": -1}, r"compact_interval must be >= 0 seconds \(0: off\)"),
        ({"lock_timeout": -1}, r"lock_timeout must be >= 0 seconds \(0: no limit\)"),
        ({"statement_timeout": "soon"}, "expected float"),
        ({"lock_timeout": 20, "statement_timeout": 10}, "must not exceed statement_timeout"),
    ],
)
def test_bad_options_say_what_is_valid(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Options.from_transport_options(raw)


def test_unknown_options_are_warned_about_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    Options.from_transport_options({"visibility_timeout": 10, "heartbeat_intervall": 3})
    assert "heartbeat_intervall" in caplog.text
    assert "visibility_timeout" not in caplog.text


def test_a_misspelled_option_is_warned_about_once_with_the_closest_name(caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):  # a Celery worker builds a transport per connection
        Options.from_transport_options({"rescue_intervl": 3, "zz_no_such_option": 1})
    misspelled = [r.getMessage() for r in caplog.records if "'rescue_intervl'" in r.getMessage()]
    assert len(misspelled) == 1
    assert "did you mean 'rescue_interval'?" in misspelled[0]
    far = [r.getMessage() for r in caplog.records if "'zz_no_such_option'" in r.getMessage()]
    assert len(far) == 1
    assert "did you mean" not in far[0]
    assert "valid options: ack_batch_delay, auto_migrate," in far[0]


@pytest.mark.parametrize(
    "url",
    ["akadze://u:s3cret@h:5432", "akadze://u@h:5432/", "postgresql://u@h?sslmode=require", "host=h user=u"],
)
def test_a_url_without_a_database_is_refused_with_the_valid_form(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGDATABASE", raising=False)
    with pytest.raises(ValueError, match="names no database") as refused:
        to_dsn(url)
    assert "'akadze+postgresql://user:password@host:5432/dbname'" in str(refused.value)
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "database"),
    [
        ("akadze://u@h:5432/proj", "proj"),
        ("postgresql://u@a:5432,b:5432/proj?target_session_attrs=read-write", "proj"),
        ("postgresql://u@h?dbname=proj", "proj"),
        ("postgresql:///proj?host=/var/run/postgresql", "proj"),
        ("host=h dbname='proj'", "proj"),
        ("service=broker", "broker"),
    ],
)
def test_every_way_of_naming_the_database_counts(url: str, database: str) -> None:
    assert database_of(to_dsn(url)) == database


def test_pgdatabase_names_the_database_of_a_url_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGDATABASE", "proj")
    assert to_dsn("postgresql://u@h") == "postgresql://u@h"


def test_delivery_tags_round_trip_and_reject_garbage() -> None:
    assert parse_tag(make_tag(42, 7)) == (42, 7)
    with pytest.raises(ValueError, match="message_id:run_count"):
        parse_tag("not-a-tag")


@pytest.mark.parametrize(("free", "queues", "expected"), [(1, 3, [1, 0, 0]), (4, 3, [2, 1, 1]), (6, 2, [3, 3])])
def test_free_slots_are_shared_evenly_between_queues(free: int, queues: int, expected: list[int]) -> None:
    assert _split_slots(free, queues) == expected
    assert sum(_split_slots(free, queues)) == free


def test_rotation_starts_each_round_at_the_next_queue() -> None:
    assert [_rotate(["a", "b", "c"], i)[0] for i in range(4)] == ["a", "b", "c", "a"]


def test_every_named_query_has_a_comment_and_migrations_are_numbered() -> None:
    for name, body in sqlfiles.all_blocks().items():
        assert body.startswith("--"), f"query {name} has no one-line comment"
    assert [m.version for m in sqlfiles.migrations()] == list(range(1, len(sqlfiles.migrations()) + 1))


def test_identifiers_are_quoted_as_data() -> None:
    assert sqlfiles.quote_ident('we"ird; DROP TABLE x') == '"we""ird; DROP TABLE x"'
    with pytest.raises(ValueError, match="NUL"):
        sqlfiles.quote_ident("a\x00b")


def test_a_rescue_that_only_forgot_silent_consumers_is_info_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A `celery inspect` that exits without closing its connection leaves a consumer row that holds nothing:
    forgetting it is routine; messages moved by a rescue are still a warning."""
    from kombu_akadze.lease import maintenance

    quiet = dict.fromkeys(("requeued", "dead", "consumers_gone", "queues", "dropped", "expired", "buried"), 0)
    with caplog.at_level(logging.INFO, logger="kombu_akadze"):
        maintenance.report({**quiet, "consumers_gone": 1}, ttl=30)
        maintenance.report({**quiet, "consumers_gone": 1, "requeued": 2}, ttl=30)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.WARNING]


MB = 1024 * 1024


@pytest.mark.parametrize(
    ("heap", "index", "reason"),
    [
        (0, 80 * MB, ""),  # a drained backlog: empty heap, indexes at their peak
        (4 * MB, 20 * MB, ""),  # a few rows left, indexes still 5x the heap
        (9 * MB, 80 * MB, "heap is 9.0 MB"),  # REINDEX would read that heap under its lock
        (0, 15 * MB, "below 16.0 MB"),
        (6 * MB, 20 * MB, "under 4x the heap"),
    ],
)
def test_compaction_is_due_only_for_bloated_indexes_over_a_small_heap(heap: int, index: int, reason: str) -> None:
    got = compact.due(TableSize(heap_bytes=heap, index_bytes=index))
    assert got == reason if not reason else reason in got


def test_broker_use_ssl_maps_onto_libpq_tls_settings() -> None:
    import ssl

    from kombu_akadze.urls import libpq_ssl

    files = {"ca_certs": "/ca.pem", "certfile": "/c.pem", "keyfile": "/k.pem"}
    required = {"sslrootcert": "/ca.pem", "sslcert": "/c.pem", "sslkey": "/k.pem", "sslmode": "verify-full"}
    assert libpq_ssl({**files, "cert_reqs": ssl.CERT_REQUIRED}) == required
    assert libpq_ssl({f"ssl_{k}": v for k, v in files.items()} | {"ssl_cert_reqs": ssl.CERT_REQUIRED}) == required
    assert libpq_ssl({"ca_certs": "/ca.pem", "cert_reqs": ssl.CERT_OPTIONAL})["sslmode"] == "verify-ca"
    assert libpq_ssl({"cert_reqs": ssl.CERT_NONE}) == {"sslmode": "require"}
    assert libpq_ssl({"ca_certs": "/ca.pem", "check_hostname": False})["sslmode"] == "verify-ca"
    assert libpq_ssl(True) == {"sslmode": "require"}
    assert libpq_ssl(False) == {}
    assert libpq_ssl({"sslmode": "verify-ca", "sslrootcert": "/ca"}) == {"sslmode": "verify-ca", "sslrootcert": "/ca"}
    with pytest.raises(ValueError, match="CERT_REQUIRED"):
        libpq_ssl({"cert_reqs": "sometimes"})


def test_the_url_s_own_libpq_options_win_over_broker_use_ssl() -> None:
    from kombu_akadze.urls import with_options

    assert with_options("postgresql://h/db?sslmode=disable", {"sslmode": "require", "sslrootcert": "/ca"}) == (
        "postgresql://h/db?sslmode=disable&sslrootcert=%2Fca"
    )
    assert with_options("host=h dbname=db", {"sslmode": "require"}) == "host=h dbname=db sslmode='require'"


@pytest.mark.parametrize(
    ("url", "dsn"),
    [
        ("akadze://u:p@h:5432/db", "postgresql://u:p@h:5432/db"),
        (
            "akadze://u@h/db?sslmode=require&target_session_attrs=read-write",
            "postgresql://u@h/db?sslmode=require&target_session_attrs=read-write",
        ),
        ("akadze+postgresql://u@a:5432,b:5432/db", "postgresql://u@a:5432,b:5432/db"),
        ("postgres://h/db", "postgres://h/db"),
    ],
)
def test_both_url_forms_become_libpq_urls(url: str, dsn: str) -> None:
    assert to_dsn(url) == dsn


def test_kombu_parts_only_for_what_kombu_attributes_carry_whole() -> None:
    from kombu_akadze.urls import Parts, kombu_parts

    assert kombu_parts("akadze://u:p%40ss@h:5433/db") == Parts("h", 5433, "u", "p@ss", "db")
    assert kombu_parts("akadze://u@h/db?sslmode=require") is None
    assert kombu_parts("akadze://u@a,b/db") is None
    assert kombu_parts("akadze://") is None
