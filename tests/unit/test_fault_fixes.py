"""Regressions the fault suite found, pinned without a database: NOTIFY channel length, NULs in
Celery's display headers, a closed channel."""

from __future__ import annotations

import pytest
from kombu.exceptions import ConnectionError as KombuConnectionError

from kombu_akadze.store import wake_channel
from kombu_akadze.transport.channel import Channel, _storable_headers


@pytest.mark.parametrize("schema", ["akadze", "é" * 48, "q" * 48, "队列" * 24, "🐘" * 48])
def test_a_consumers_wake_channel_fits_63_bytes_whatever_the_schema_and_is_its_own(schema: str) -> None:
    channel = wake_channel(schema, "host:1234:" + "c" * 100)
    assert len(channel.encode("utf-8")) <= 63
    assert channel.isascii()
    assert channel.startswith("akadze.")
    assert channel != wake_channel(schema, "host:1234:other")
    assert channel != wake_channel(schema + "x", "host:1234:" + "c" * 100)


def test_nuls_in_celerys_repr_headers_are_escaped_and_other_headers_left_alone() -> None:
    headers = {"argsrepr": "('a\x00b',)", "kwargsrepr": "{'k': '\x00'}", "note": "n\x00", "n": 1}
    stored = _storable_headers(headers)
    assert stored == {"argsrepr": "('a\\x00b',)", "kwargsrepr": "{'k': '\\x00'}", "note": "n\x00", "n": 1}
    assert headers["argsrepr"] == "('a\x00b',)", "the caller's dict is not changed"


def test_a_closed_channel_answers_with_a_connection_error_kombu_recovers_from() -> None:
    channel = Channel.__new__(Channel)
    channel.connection = None  # what kombu leaves on a channel it closed after a lost connection
    with pytest.raises(KombuConnectionError, match="closed"):
        _ = channel.store
    with pytest.raises(KombuConnectionError, match="closed"):
        channel.basic_publish({"body": b"x"}, exchange="", routing_key="q")
