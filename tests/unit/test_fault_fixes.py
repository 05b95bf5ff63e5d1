"""Regressions the fault suite found, pinned without a database: NOTIFY channel length, NULs in
Celery's display headers, a re-armed LISTEN socket that reuses its fd number, a closed channel."""

from __future__ import annotations

from typing import Any

import pytest
from kombu.exceptions import ConnectionError as KombuConnectionError

from kombu_akadze.consume.driver import HubDriver
from kombu_akadze.consume.listener import Listener
from kombu_akadze.consume.wakeups import Waker
from kombu_akadze.errors import TransientDatabaseError
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


class _Hub:
    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}
        self.added: list[int] = []

    def add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        self.readers[fd] = callback
        self.added.append(fd)

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)

    def call_later(self, delay: float, callback: Any) -> Any:
        return None


class _NoClaims:
    def start_claim(self, *, claim: bool) -> bool | None:
        return False

    def claim_done(self) -> bool:
        return False

    def finish_claim(self) -> bool:
        return False

    def settle_claim(self, timeout: float) -> None:
        pass


class _ListenStore:
    """Every session it opens gets fd 42 again, as the kernel hands out the lowest free number."""

    def __init__(self) -> None:
        self.connected = False

    def listen_start(self, *, channel: str) -> int:
        self.connected = True
        return 42

    def listen_notifies(self) -> list[str]:
        raise TransientDatabaseError("listen_notifies: the LISTEN session was lost")

    def close(self) -> None:
        self.connected = False


def test_a_relistened_socket_with_the_same_fd_number_is_registered_with_the_hub_again() -> None:
    hub = _Hub()
    waker = Waker()
    listener = Listener(_ListenStore(), channel="akadze.test", enabled=True, waker=waker)  # type: ignore[arg-type]
    driver = HubDriver(
        hub=hub,
        listener=listener,
        claims=_NoClaims(),
        deliver_one=lambda: False,
        has_free_slot=lambda: False,
        poll_interval=1.0,
        listen_poll_interval=10.0,
        waker=waker,
    )
    try:
        driver.start()
        assert hub.added.count(42) == 1
        driver._on_readable()  # the session died (terminated): re-armed on a new socket, fd 42 again
        assert hub.added.count(42) == 2, "the new socket must be polled, not only the number remembered"
    finally:
        driver.stop()
        waker.close()


def test_a_closed_channel_answers_with_a_connection_error_kombu_recovers_from() -> None:
    channel = Channel.__new__(Channel)
    channel.connection = None  # what kombu leaves on a channel it closed after a lost connection
    with pytest.raises(KombuConnectionError, match="closed"):
        _ = channel.store
    with pytest.raises(KombuConnectionError, match="closed"):
        channel.basic_publish({"body": b"x"}, exchange="", routing_key="q")
