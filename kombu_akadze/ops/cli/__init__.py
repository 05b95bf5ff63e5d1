"""The ``akadze`` command line (also ``celery akadze``)."""

from __future__ import annotations

from kombu_akadze.ops.cli.main import akadze, main

__all__ = ["akadze", "main"]
