"""The reference docs name every transport option, and the README names its two commands."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from kombu_akadze.options import Options

ROOT = Path(__file__).resolve().parents[2]


def test_every_transport_option_is_documented() -> None:
    text = (ROOT / "docs" / "options.md").read_text()
    missing = [f.name for f in fields(Options) if f"`{f.name}`" not in text]
    assert missing == []


def test_readme_gives_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text
    assert "make test" in text
