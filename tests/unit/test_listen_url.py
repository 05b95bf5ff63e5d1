"""Transport option listen_url: the broker URL's forms, a named server, passwords never shown."""

from __future__ import annotations

import pytest

from kombu_akadze.options import Options
from kombu_akadze.urls import listen_dsn


@pytest.mark.parametrize(
    ("url", "dsn"),
    [
        ("akadze://app:pw@db:5432/proj", "postgresql://app:pw@db:5432/proj"),
        ("akadze+postgresql://app@db/proj?sslmode=disable", "postgresql://app@db/proj?sslmode=disable"),
        ("postgresql://app@db/proj", "postgresql://app@db/proj"),
        ("host=db dbname=proj", "host=db dbname=proj"),
    ],
)
def test_listen_url_takes_every_form_of_the_broker_url(url: str, dsn: str) -> None:
    assert listen_dsn(url) == dsn


def test_listen_url_gets_the_brokers_tls_unless_it_sets_its_own() -> None:
    assert listen_dsn("postgresql://app@db/proj", True) == "postgresql://app@db/proj?sslmode=require"
    assert listen_dsn("postgresql://app@db/proj?sslmode=verify-full", True).endswith("?sslmode=verify-full")


@pytest.mark.parametrize("url", ["akadze://", "http://app:secret@db/proj"])
def test_a_listen_url_naming_no_postgresql_server_is_refused_with_its_password_masked(url: str) -> None:
    with pytest.raises(ValueError, match="listen_url") as info:
        listen_dsn(url)
    assert "secret" not in str(info.value)


def test_listen_url_stays_out_of_the_options_repr() -> None:
    opts = Options.from_transport_options({"listen_url": "postgresql://app:secret@db/proj"})
    assert opts.listen_url == "postgresql://app:secret@db/proj"
    assert "secret" not in repr(opts)
