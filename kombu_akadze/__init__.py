"""kombu-akadze: PostgreSQL as a Celery/kombu broker with at-least-once, fenced delivery."""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES

from kombu_akadze import _moved

__version__ = "0.1.0"

#: ``broker_url = "akadze+postgresql://..."`` resolves here once this package is imported
#: (the ``celery`` CLI imports it through the celery.commands entry point).
#: kombu's failover switch() parses every alternate itself and looks its whole scheme up, so
#: "akadze+postgresql" must resolve as well as "akadze" (else KeyError: No such transport).
for _alias in ("akadze", "akadze+postgresql", "akadze+postgres"):
    TRANSPORT_ALIASES.setdefault(_alias, "kombu_akadze.transport:Transport")
_moved.install()


def attempt_of(request: Any) -> int | None:
    """The kombu-akadze attempt (1 on a first run) of a Celery task request (``self.request``) or a kombu
    message; None on other brokers. It travels in delivery_info, so the published headers stay as sent."""
    info = getattr(request, "delivery_info", None) or {}
    if "akadze_attempt" not in info:  # Celery keeps four delivery_info keys; the full one is in properties
        info = (getattr(request, "properties", None) or {}).get("delivery_info") or {}
    attempt = info.get("akadze_attempt")
    return int(attempt) if attempt is not None else None


def message_id_of(request: Any) -> int | None:
    """The row id of a Celery task request's or a kombu message's message (stable across redeliveries)."""
    info = getattr(request, "delivery_info", None) or {}
    if "akadze_message_id" not in info:
        info = (getattr(request, "properties", None) or {}).get("delivery_info") or {}
    message_id = info.get("akadze_message_id")
    return int(message_id) if message_id is not None else None


def __getattr__(name: str) -> object:
    if name == "Transport":
        from kombu_akadze.transport import Transport

        return Transport
    raise AttributeError(name)


__all__ = ["Transport", "__version__", "attempt_of", "message_id_of"]
