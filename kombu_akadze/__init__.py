"""kombu-akadze: PostgreSQL as a Celery/kombu broker with at-least-once, fenced delivery."""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from kombu_akadze import _moved

__version__ = "0.1.0"

#: ``broker_url = "akadze+postgresql://..."`` resolves here once this package is imported
#: (the ``celery`` CLI imports it through the celery.commands entry point).
TRANSPORT_ALIASES.setdefault("akadze", "kombu_akadze.transport:Transport")
_moved.install()


def __getattr__(name: str) -> object:
    if name == "Transport":
        from kombu_akadze.transport import Transport

        return Transport
    raise AttributeError(name)


__all__ = ["Transport", "__version__"]
