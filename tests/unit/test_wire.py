"""store.wire: the text form of a statement's parameters, written without psycopg's dumpers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from psycopg.types.json import Jsonb

from kombu_akadze.store import wire


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (None, None),
        (True, b"t"),
        (False, b"f"),
        (0, b"0"),
        (-42, b"-42"),
        (1.5, b"1.5"),
        (float("inf"), b"inf"),
        ("caf\u00e9 'q'", "caf\u00e9 'q'".encode()),
        (datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), b"2026-01-02T03:04:05.000006+00:00"),
        ([1, 2, 3], b"{1,2,3}"),
        ([], b"{}"),
        (['a"b', "c\\d", "e,f", "{g}", "NULL", ""], b'{"a\\"b","c\\\\d","e,f","{g}","NULL",""}'),
        (Jsonb({"n": 1, "s": "x"}), b'{"n": 1, "s": "x"}'),
    ],
)
def test_each_kind_of_parameter_has_its_text_form(value: object, written: bytes | None) -> None:
    assert wire.text(value) == written


def test_typed_json_values_are_written_the_way_kombu_reads_them_back() -> None:
    from kombu.utils import json as kombu_json

    doc = {"eta": datetime(2026, 1, 2, tzinfo=UTC), "id": uuid.UUID(int=7), "price": Decimal("1.10")}
    written = wire.text(Jsonb(doc))
    assert written is not None
    assert b'"__type__"' in written
    assert kombu_json.loads(written) == doc


@pytest.mark.parametrize("value", [object(), {"a": 1}, [1, "mixed"], b"bytes go as binary"])
def test_a_parameter_without_a_text_form_is_refused_by_name(value: object) -> None:
    with pytest.raises(TypeError, match="no text form"):
        wire.text(value)


def test_bytes_go_as_binary_and_the_rest_as_text_in_placeholder_order() -> None:
    query, names = wire.positional("SELECT %(b)s::bytea, %(a)s::int, %(b)s, '100%%'")
    assert query == b"SELECT $1::bytea, $2::int, $1, '100%'"
    assert names == ("b", "a")
    values, formats = wire.parameters({"a": 7, "b": b"\x00\xff"}, names)
    assert values == [b"\x00\xff", b"7"]
    assert formats == [wire.BINARY, wire.TEXT]


def test_a_subclass_of_a_written_type_is_written_as_its_base() -> None:
    import enum

    class Level(enum.IntEnum):
        HIGH = 9

    class Name(str):
        pass

    assert wire.text(Level.HIGH) == b"9"
    assert wire.text(Name("q")) == b"q"
    assert wire.text([Name("a"), "b"]) == b'{"a","b"}'
