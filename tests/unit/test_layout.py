"""The layered tree keeps the documented public names: the transport's path, and the modules the docs of
0.1 named at the package's top level (now in integrations/, ops/ and store/)."""

from __future__ import annotations

import importlib

import pytest

import kombu_akadze
from kombu_akadze._moved import MOVED


def test_the_transport_class_path_celery_is_given_still_resolves() -> None:
    from kombu.transport import resolve_transport

    from kombu_akadze.transport.transport import Transport

    assert resolve_transport("kombu_akadze.transport:Transport") is Transport
    assert resolve_transport("akadze") is Transport
    assert kombu_akadze.Transport is Transport


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_answers_at_its_old_path_as_the_same_module(old: str, new: str) -> None:
    moved = importlib.import_module(f"kombu_akadze.{old}")
    assert moved is importlib.import_module(f"kombu_akadze.{new}")
    assert getattr(kombu_akadze, old) is moved  # `from kombu_akadze import outbox` too


def test_the_documented_spellings_work() -> None:
    from kombu_akadze.bootsteps import enable_mingle

    from kombu_akadze import django as akadze_django
    from kombu_akadze.integrations import bootsteps, django

    assert akadze_django is django
    assert enable_mingle is bootsteps.enable_mingle
