"""The wake-up side of a consumer's second session: between two heartbeats, its thread waits for
wake-ups instead of sleeping, and hands each one to the consumer.

One session per consumer thus does both jobs, the heartbeat and LISTEN (a worker holds two sessions:
this one and its command session). With the host relay (consume.relay) only one consumer per host
LISTENs, for all of them: its session's LISTEN covers every channel of the host, and the others wait
on their link to it. Everything here runs on the heartbeat's thread, except ``armed`` (read by the
consuming thread before it parks), ``interrupt`` (called by whoever stops the thread) and ``close``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Protocol

from kombu_akadze import polling
from kombu_akadze.consume import relay
from kombu_akadze.consume.wakeups import Waker
from kombu_akadze.errors import AkadzeError
from kombu_akadze.store.records import ClaimedMessage, is_handoff, read_handoff

logger = logging.getLogger("kombu_akadze")


class ListenSession(Protocol):
    """The session's LISTEN part (store.Store)."""

    @property
    def listening(self) -> bool: ...
    def listen_start(self, *, channel: str) -> int: ...
    def listen_stop(self, *, channel: str) -> None: ...
    def listen_received(self) -> list[tuple[str, str]]: ...


#: Listeners of this process, whose relay sockets a forked child must not keep (see _forked).
_LIVE: weakref.WeakSet[Listener] = weakref.WeakSet()


class Listener:
    """LISTEN on one consumer's own wake-up channel (directly, or through the host's relay), re-armed
    whenever its session or its relay was replaced."""

    def __init__(
        self,
        store: ListenSession,
        *,
        channel: str,
        enabled: bool,
        on_wakeup: Callable[[], None] = lambda: None,
        on_handoff: Callable[[ClaimedMessage, bool], None] | None = None,
        on_armed: Callable[[], None] = lambda: None,
        relay_key: str | None = None,
    ) -> None:
        self.store = store
        #: This consumer's own wake-up channel: publishers notify it only while it is parked.
        self.channel = channel
        self.enabled = enabled
        #: Called on a wake-up, and when LISTEN is armed again after a lost session or relay (wake-ups
        #: may have been missed meanwhile): the consumer claims.
        self.on_wakeup = on_wakeup
        #: Called with each message a publish handed over (already held by this consumer) and whether
        #: the consumer is still parked (see store.read_handoff); None: it is treated as a wake-up, and
        #: the reconcile gives it back.
        self.on_handoff = on_handoff
        #: Called each time LISTEN runs for this consumer again (its own session, or the hub said so), after
        #: on_wakeup: a handoff sent while it did not reached nobody, and is adopted (transport.consumer).
        self.on_armed = on_armed
        #: The relay's address (None: this consumer LISTENs on its own session).
        self.relay = relay.address(relay_key) if relay_key is not None and relay.supported() else None
        #: The session's socket while LISTEN runs on it (this consumer's own, or as the host's hub).
        self.fd: int | None = None
        self.hub: relay.Hub | None = None
        self.link: relay.Link | None = None
        #: The hub said LISTEN runs for us (a consumer linked to a hub).
        self._link_armed = False
        self.wakeups = 0
        #: Messages handed over to this consumer so far.
        self.handoffs = 0
        #: LISTEN sessions opened so far.
        self.sessions = 0
        #: Wake-ups this consumer relayed to others of its host, as their hub.
        self.relayed = 0
        self._interrupt = Waker()
        _LIVE.add(self)

    @property
    def role(self) -> str:
        """'hub' (LISTENs for the host), 'linked' (to a hub), 'own' (LISTENs alone) or 'off'."""
        if self.hub is not None:
            return "hub"
        if self.link is not None:
            return "linked"
        return "own" if self.fd is not None else "off"

    @property
    def armed(self) -> bool:
        """LISTEN runs for this consumer as things are now: it may park and wait for a wake-up."""
        if self.link is not None:
            return self._link_armed
        return self.fd is not None and self.store.listening

    def arm(self) -> int | None:
        """Join the host's relay, or LISTEN again if the session is new (reconnected) or was lost; the
        session's socket, None when disabled, linked to a hub, or unreachable."""
        if not self.enabled:
            return None
        if self.hub is None and self.link is None and self.relay is not None:
            self._join()
        if self.link is not None:
            return None
        if self.armed:
            return self.fd
        try:
            self.fd = self.store.listen_start(channel=self.channel)
            if self.hub is not None:
                for channel in self.hub.channels():
                    self.store.listen_start(channel=channel)
        except AkadzeError as exc:
            self.fd = None
            logger.warning("kombu-akadze LISTEN could not be armed, polling meanwhile: %s", exc)
            if self.hub is not None:
                self.hub.send_all(relay.DISARMED)
            return None
        self.sessions += 1
        if self.hub is not None:
            self.hub.send_all(relay.ARMED)
        # Wake-ups may have been missed before LISTEN ran: after a lost session, and at the first arm
        # too, which comes after the consumer has started (its first claim may have parked already, and
        # a publish meanwhile notified nobody): the consumer claims, instead of waiting for its poll.
        self.on_wakeup()
        self.on_armed()
        return self.fd

    def _join(self) -> None:
        """Become the host's hub, or link to the one there is (a hub that went a moment ago may still
        be in the way of the first bind: one more try each way)."""
        assert self.relay is not None
        for _ in range(2):
            self.hub = relay.Hub.bind(self.relay)
            if self.hub is not None:
                logger.info("kombu-akadze: this consumer LISTENs for the consumers of its host (wake-up relay)")
                return
            self.link = relay.Link.connect(self.relay, self.channel)
            if self.link is not None:
                self._link_armed = False
                if self.fd is not None:  # it LISTENed alone before: the hub does it now
                    self._unlisten(self.channel)
                    self.fd = None
                return

    def drain(self) -> int:
        """Hand the wake-ups that arrived (or were read by the session's other statements) to their
        consumers, without blocking; how many were this consumer's."""
        if self.fd is None:
            return 0
        try:
            received = self.store.listen_received()
        except AkadzeError as exc:
            logger.warning("kombu-akadze LISTEN session lost, re-arming: %s", exc)
            self.fd = None
            if self.hub is not None:
                self.hub.send_all(relay.DISARMED)
            return 0
        own = 0
        for channel, payload in received:
            if channel == self.channel or self.hub is None:
                if is_handoff(payload):
                    self._handoff(payload)
                else:
                    own += 1
            elif self.hub.hand(channel, payload) if is_handoff(payload) else self.hub.send(channel, relay.WAKE):
                self.relayed += 1
        if own:
            self.wakeups += own
            self.on_wakeup()
        return own

    def _handoff(self, payload: str | None) -> None:
        """A message handed over to this consumer: to on_handoff. One that cannot be read (or with no one
        to take it) is a wake-up: the consumer claims, and its reconcile gives the row back."""
        try:
            handoff = read_handoff(payload or "")
        except ValueError as exc:
            logger.warning("kombu-akadze: a handoff notification could not be read (%s); claiming instead", exc)
            self.on_wakeup()
            return
        self.handoffs += 1
        if self.on_handoff is None:
            self.on_wakeup()
        else:
            self.on_handoff(handoff.message, handoff.parked)

    def wait(self, timeout: float) -> None:
        """Wait *timeout* seconds (the heartbeat's pause), handing on wake-ups as they come; returns early
        on interrupt(). The session is re-armed first if it was lost, and a lost session seen meanwhile
        is not re-armed before the next wait: the heartbeat's backoff paces reconnects."""
        deadline = time.monotonic() + max(timeout, 0.0)
        self.arm()
        self.drain()  # what the heartbeat's statements read
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            fds = [self._interrupt.fileno(), *self._fds()]
            try:
                ready = polling.readable(fds, remaining)
            except (OSError, ValueError):  # a socket was closed under us
                self.fd = None
                continue
            if self._interrupt.fileno() in ready:
                self._interrupt.drain()
                return
            for fd in ready:
                self._readable(fd)

    def _fds(self) -> list[int]:
        fds = [] if self.fd is None else [self.fd]
        if self.hub is not None:
            fds += [self.hub.fileno(), *self.hub.peer_fds()]
        if self.link is not None:
            fds.append(self.link.fileno())
        return fds

    def _readable(self, fd: int) -> None:
        if fd == self.fd:
            self.drain()
        elif self.link is not None and fd == self.link.fileno():
            self._from_hub()
        elif self.hub is not None:
            if fd == self.hub.fileno():
                self.hub.accept()
                return
            joined, left = self.hub.read(fd)
            if joined is not None and self.armed:
                try:
                    self.store.listen_start(channel=joined)
                except AkadzeError as exc:  # the next wait re-arms every channel and tells them
                    logger.warning("kombu-akadze LISTEN session lost, re-arming: %s", exc)
                    self.fd = None
                    self.hub.send_all(relay.DISARMED)
                    return
                self.hub.send(joined, relay.ARMED)
            if left is not None:
                self._unlisten(left)

    def _from_hub(self) -> None:
        assert self.link is not None
        events = self.link.read()
        if events is None:  # the hub went: claim (wake-ups may be lost), and take its place or find the next
            self.link.close()
            self.link = None
            self._link_armed = False
            self.on_wakeup()
            self.arm()
            return
        woken = armed = 0
        for code, payload in events:
            if code == relay.DISARMED:
                self._link_armed = False
            elif code == relay.ARMED:
                self._link_armed = True
                woken += 1
                armed += 1
            elif code == relay.WAKE:
                self.wakeups += 1
                woken += 1
            elif code == relay.HANDOFF:
                self._handoff(payload)
        if woken:
            self.on_wakeup()
        if armed and self._link_armed:
            self.on_armed()

    def _unlisten(self, channel: str) -> None:
        if not self.armed:
            return
        try:
            self.store.listen_stop(channel=channel)
        except AkadzeError as exc:
            logger.info("kombu-akadze UNLISTEN failed (the session is re-armed at the next wait): %s", exc)
            self.fd = None

    def interrupt(self) -> None:
        """End the current wait() now (from any thread)."""
        self._interrupt.wake()

    def close(self) -> None:
        self.fd = None
        self._close_relay()
        self._interrupt.close()

    def _close_relay(self) -> None:
        hub, link, self.hub, self.link = self.hub, self.link, None, None
        self._link_armed = False
        if hub is not None:
            hub.close()
        if link is not None:
            link.close()


def _forked() -> None:
    """In a forked child (a prefork pool process): close the relay sockets it inherited, or a hub's
    bound socket would outlive its worker and keep the host's consumers linked to nobody."""
    for listener in list(_LIVE):
        with contextlib.suppress(Exception):
            listener._close_relay()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
