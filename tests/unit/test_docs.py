"""The reference docs name every transport option, and the README names its two commands."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import kombu_akadze.transport.transport
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


def test_the_removal_invariant_names_every_exit_rabbitmq_has() -> None:
    """TTL expiry, drop-head, purge, queue delete and x-expires remove rows too (tests/integration/
    test_removals.py): no text may claim that only an ack does, and the transport and the delivery
    semantics both state the real invariant."""
    texts = {
        str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    }
    texts["transport.py"] = kombu_akadze.transport.transport.__doc__ or ""
    wrong = [name for name, text in texts.items() if "Nothing leaves" in text or "except a fenced ack" in text]
    assert wrong == []
    for name in ("transport.py", "docs/delivery-semantics.md"):
        flat = " ".join(texts[name].split())
        assert "by a rule" in flat, name
        assert "message TTL" in flat, name
        assert "never leaves except by its own fenced outcome" in flat, name


def test_the_comparison_page_names_only_tests_that_exist() -> None:
    """Each akadze cell of docs/comparison.md rests on a named test: a renamed or removed test fails here."""
    text = (ROOT / "docs" / "comparison.md").read_text()
    named = set(re.findall(r"`(test_[^`\s]+)`", text))
    defined = {
        m
        for path in (ROOT / "tests").rglob("test_*.py")
        for m in re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), re.M)
    }
    assert len(named) >= 8
    assert sorted(named - defined) == []


def test_both_migration_pages_give_the_same_order() -> None:
    """Akadze workers, then producers, then the RabbitMQ workers stop, then the move (see the walk-through for
    why); the two pages once disagreed."""
    steps = [r"Start akadze workers", r"Switch the producers", r"Stop the RabbitMQ workers", r"[Mm]ove"]
    for page in ("docs/migrate-from-rabbitmq.md", "examples/migrate_from_rabbitmq.md"):
        text = (ROOT / page).read_text()
        numbered = [re.search(rf"^(## )?\d\. {step}", text, re.M) for step in steps]
        assert all(numbered), (page, [step for step, m in zip(steps, numbered, strict=True) if m is None])
        numbers = [int(re.sub(r"\D", "", m.group(0))) for m in numbered if m]
        assert numbers == sorted(set(numbers)), (page, numbers)
