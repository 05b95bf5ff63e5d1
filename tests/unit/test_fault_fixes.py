"""Regressions the fault suite found, pinned without a database: NOTIFY channel length, NULs in
Celery's display headers, a closed channel."""

from __future__ import annotations

import pytest
from kombu.exceptions import ConnectionError as KombuConnectionError

from kombu_akadze.store import wake_channel
from kombu_akadze.transport.channel import Channel, _storable_headers, _storable_properties


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


def test_publish_properties_beyond_plain_json_take_the_full_check_with_the_same_outcome() -> None:
    from datetime import UTC, datetime

    when = datetime(2030, 1, 2, tzinfo=UTC)
    kept = {"timestamp": when, "route": ("a", "b"), 3: "int key", "deep": [[[[[[[[[[1]]]]]]]]]]}
    assert _storable_properties(kept) == kept  # kombu's JSON takes them all: stored as given
    loop: dict[str, object] = {}
    loop["self"] = loop  # nested without end: no RecursionError, the key is left out as not JSON
    assert _storable_properties({"delivery_mode": 2, "loop": loop}) == {"delivery_mode": 2}


def test_publish_properties_are_stored_as_given_unless_a_value_is_not_json() -> None:
    info = {"exchange": "", "routing_key": "q"}
    props = {"delivery_mode": 2, "priority": 0, "delivery_info": info, "delivery_tag": 1}
    assert _storable_properties(props) == {"delivery_mode": 2, "priority": 0, "delivery_info": info}
    odd = object()  # e.g. Celery's signal object, republished with **kwargs from a before_task_publish handler
    stored = _storable_properties({"delivery_mode": 2, "correlation_id": odd, "signal": odd})
    assert stored == {"delivery_mode": 2, "correlation_id": str(odd)}  # an AMQP property as text; the rest left out
