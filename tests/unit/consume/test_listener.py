"""The LISTEN wait of the heartbeat's thread, without a database: a socket pair stands for the session's
socket. Wake-ups are handed on as they come, a lost session is re-armed at the next wait and that
re-arm wakes the consumer (wake-ups may have been missed), and interrupt() ends a wait at once."""

from __future__ import annotations

import socket
import threading
import time

from kombu_akadze.consume.listener import Listener
from kombu_akadze.errors import TransientDatabaseError


class Session:
    """listen_start opens a new 'connection' (a socket pair) or adds a channel to it; the test writes
    wake-ups into its far end: "queue" for the first channel, "channel=queue" for another."""

    def __init__(self) -> None:
        self.near: socket.socket | None = None
        self.far: socket.socket | None = None
        self.starts = 0
        self.channels: list[str] = []
        self.read_elsewhere: list[str] = []  # wake-ups another statement on the session read first

    @property
    def listening(self) -> bool:
        return self.near is not None

    def listen_start(self, *, channel: str) -> int:
        if self.near is None:
            self.starts += 1
            self.channels = []
            self.near, self.far = socket.socketpair()
        if channel not in self.channels:
            self.channels.append(channel)
        return self.near.fileno()

    def listen_stop(self, *, channel: str) -> None:
        self.channels.remove(channel)

    def listen_received(self) -> list[tuple[str, str]]:
        if self.near is None:
            raise TransientDatabaseError("listen_received: the LISTEN session is not open")
        self.near.setblocking(False)
        try:
            data = self.near.recv(4096)
        except BlockingIOError:
            data = b"-"
        if not data:  # the server ended the session
            self.lose()
            raise TransientDatabaseError("listen_received: the LISTEN session was lost")
        names = [n for n in data.decode().split(",") if n and n != "-"] + self.read_elsewhere
        self.read_elsewhere = []
        return [tuple(n.split("=", 1)) if "=" in n else (self.channels[0], n) for n in names]  # type: ignore[misc]

    def notify(self, channel: str, queue: str = "q") -> None:
        assert self.far is not None
        self.far.send(f"{channel}={queue},".encode())

    def lose(self) -> None:
        for end in (self.near, self.far):
            if end is not None:
                end.close()
        self.near = self.far = None


def rig() -> tuple[Listener, Session, list[float]]:
    session, woken = Session(), []
    listener = Listener(session, channel="akadze.x", enabled=True, on_wakeup=lambda: woken.append(time.monotonic()))
    return listener, session, woken


def test_a_wakeup_during_the_wait_is_handed_on_at_once_and_the_wait_goes_on() -> None:
    listener, session, woken = rig()
    listener.arm()
    assert listener.armed
    woken.clear()  # the arm's own wake-up (test below)
    assert session.far is not None
    threading.Timer(0.05, session.far.send, args=(b"q1,",)).start()
    started = time.monotonic()
    listener.wait(0.5)
    assert len(woken) == 1
    assert woken[0] - started < 0.4
    assert time.monotonic() - started >= 0.45  # a wake-up does not end the heartbeat's pause
    assert listener.wakeups == 1
    listener.close()
    session.lose()


def test_the_first_arm_wakes_the_consumer_for_what_was_published_before_listen_ran() -> None:
    """The heartbeat's thread arms LISTEN after its first maintenance round, while the consumer has
    already claimed and parked: a publish meanwhile notified a channel nobody listened on, and the
    consumer, not armed, would wait for its poll (1 s) to find it."""
    listener, session, woken = rig()
    listener.arm()
    assert listener.armed
    assert len(woken) == 1
    listener.close()
    session.lose()


def test_wakeups_read_by_the_heartbeats_statements_are_handed_on_at_the_next_wait() -> None:
    listener, session, woken = rig()
    listener.arm()
    woken.clear()  # the arm's own
    session.read_elsewhere = ["q"]
    assert session.far is not None
    session.far.send(b"-")  # the socket has something, as it does after a statement read a NOTIFY
    listener.wait(0.01)
    assert len(woken) == 1
    listener.close()
    session.lose()


def test_a_lost_session_is_rearmed_at_the_next_wait_and_the_rearm_wakes_the_consumer() -> None:
    listener, session, woken = rig()
    listener.arm()
    assert session.far is not None
    session.far.close()  # the server terminated the session
    woken.clear()  # the first arm's
    listener.wait(0.05)
    assert not listener.armed
    assert woken == []
    listener.wait(0.01)  # the next pause, after a beat reconnected the session
    assert listener.armed
    assert session.starts == 2
    assert len(woken) == 1, "missed wake-ups: the consumer must claim after a re-arm"
    listener.close()
    session.lose()


def test_interrupt_ends_a_wait_at_once() -> None:
    listener, session, _ = rig()
    listener.arm()
    threading.Timer(0.05, listener.interrupt).start()
    started = time.monotonic()
    listener.wait(30)
    assert time.monotonic() - started < 10
    listener.close()
    session.lose()


def test_disabled_listen_never_arms_and_waits_on_interrupt_only() -> None:
    session = Session()
    listener = Listener(session, channel="akadze.x", enabled=False)
    assert listener.arm() is None
    listener.interrupt()
    started = time.monotonic()
    listener.wait(30)
    assert time.monotonic() - started < 10
    assert session.starts == 0
    assert not listener.armed
    listener.close()
    session.lose()
