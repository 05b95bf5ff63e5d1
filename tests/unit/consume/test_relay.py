"""The host's wake-up relay, without a database: each consumer's LISTEN session is the fake of
test_listener (a socket pair), the relay sockets are real. One consumer of a host becomes the hub and
LISTENs for the others, each wake-up reaches the consumer it was meant for and nobody else, and when
the hub goes its consumers claim and one of them takes its place."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from kombu_akadze.consume import relay
from kombu_akadze.consume.listener import Listener
from kombu_akadze.integrations.testing import eventually
from tests.unit.consume.test_listener import Session

pytestmark = pytest.mark.skipif(not relay.supported(), reason="the wake-up relay needs Linux's abstract sockets")


class Consumer:
    """One consumer: its session, its listener, and its heartbeat thread's waits in a loop."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.session = Session()
        self.woken = 0
        self.listener = Listener(
            self.session, channel=f"akadze.{name}", enabled=True, on_wakeup=self._woke, relay_key=key
        )
        self._stop = threading.Event()
        self.listener.arm()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _woke(self) -> None:
        self.woken += 1

    def _pump(self) -> None:
        while not self._stop.is_set():
            self.listener.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self.listener.interrupt()
        self._thread.join(10)
        self.listener.close()
        self.session.lose()


@pytest.fixture
def host() -> Iterator[list[Consumer]]:
    """Consumers of one host, server and schema (a relay key of this test's own)."""
    key = f"test\0{uuid.uuid4()}"
    made = [Consumer(key, name) for name in ("a", "b", "c")]
    yield made
    for consumer in made:
        if not consumer._stop.is_set():
            consumer.close()


def test_one_consumer_listens_for_the_host_and_each_wakeup_reaches_only_its_consumer(host: list[Consumer]) -> None:
    hub, *linked = host
    assert [c.listener.role for c in host] == ["hub", "linked", "linked"]
    # The hub's session LISTENs on every consumer's channel; the others' sessions never open.
    eventually(lambda: sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"], timeout=10, what="LISTEN")
    assert [c.session.starts for c in host] == [1, 0, 0]
    eventually(lambda: all(c.listener.armed for c in host), timeout=10, what="every consumer armed")
    before = [c.woken for c in host]

    hub.session.notify("akadze.b")
    eventually(lambda: linked[0].woken == before[1] + 1, timeout=10, what="b woken through the hub")
    hub.session.notify("akadze.a")
    eventually(lambda: hub.woken == before[0] + 1, timeout=10, what="the hub's own wake-up")
    assert linked[1].woken == before[2], "c was not parked: nothing for it"
    assert linked[0].listener.wakeups == 1
    assert hub.listener.relayed == 1


def test_a_consumer_that_goes_is_unlistened(host: list[Consumer]) -> None:
    hub, b, _ = host
    eventually(lambda: len(hub.session.channels) == 3, timeout=10, what="LISTEN for all three")
    b.close()
    eventually(lambda: sorted(hub.session.channels) == ["akadze.a", "akadze.c"], timeout=10, what="UNLISTEN of b")


def test_when_the_hub_goes_its_consumers_claim_and_one_takes_its_place(host: list[Consumer]) -> None:
    hub, b, c = host
    eventually(lambda: b.listener.armed and c.listener.armed, timeout=10, what="armed through the hub")
    woken = (b.woken, c.woken)
    hub.close()
    eventually(lambda: b.woken > woken[0] and c.woken > woken[1], timeout=10, what="both claim: wake-ups may be lost")
    eventually(
        lambda: sorted(x.listener.role for x in (b, c)) == ["hub", "linked"], timeout=10, what="a new hub, linked to"
    )
    new_hub, other = (b, c) if b.listener.role == "hub" else (c, b)
    eventually(lambda: sorted(new_hub.session.channels) == ["akadze.b", "akadze.c"], timeout=10, what="LISTEN again")
    eventually(lambda: other.listener.armed, timeout=10, what="armed through the new hub")
    before = other.woken
    new_hub.session.notify(other.listener.channel)
    eventually(lambda: other.woken == before + 1, timeout=10, what="a wake-up through the new hub")


def test_a_lost_hub_session_disarms_its_consumers_until_it_is_listening_again(host: list[Consumer]) -> None:
    hub, b, _ = host
    eventually(lambda: b.listener.armed, timeout=10, what="armed")
    assert hub.session.far is not None
    hub.session.far.close()  # the server ended the hub's session
    eventually(lambda: hub.session.starts == 2, timeout=10, what="the hub's LISTEN session opened again")
    eventually(lambda: b.listener.armed, timeout=10, what="armed again")
    assert sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"]


def test_a_forked_child_does_not_keep_the_hub_socket(host: list[Consumer]) -> None:
    hub = host[0]
    assert hub.listener.hub is not None
    pid = os.fork()
    if pid == 0:  # the child: the relay sockets it inherited are closed, the parent's hub stands
        os._exit(0 if hub.listener.hub is None and hub.listener.role != "hub" else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert hub.listener.role == "hub"
    # The child closing its copy did not take the address: a consumer still links to the parent's hub.
    late = Consumer(hub.key, "d")
    try:
        assert late.listener.role == "linked"
        eventually(lambda: "akadze.d" in hub.session.channels, timeout=10, what="LISTEN for d")
    finally:
        late.close()


def test_another_relay_key_is_another_hub() -> None:
    one = Consumer(f"test\0{uuid.uuid4()}", "x")
    two = Consumer(f"test\0{uuid.uuid4()}", "y")
    try:
        assert (one.listener.role, two.listener.role) == ("hub", "hub")
    finally:
        one.close()
        two.close()


def test_a_stranger_on_the_socket_is_dropped(host: list[Consumer]) -> None:
    hub = host[0]
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(hub_key_address(hub))
    stranger.sendall(b"X nonsense\n")
    stranger.settimeout(10)
    assert stranger.recv(16) == b"", "the hub hangs up on what is not a registration"
    stranger.close()
    assert sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"]


def hub_key_address(consumer: Consumer) -> bytes:
    assert consumer.listener.relay is not None
    return consumer.listener.relay
