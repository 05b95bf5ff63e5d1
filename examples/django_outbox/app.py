"""Transactional enqueue with Django: an order row and its confirmation task commit together, or neither does.

    AKADZE_URL=postgresql://... python -m examples.django_outbox.app            # place two orders
    AKADZE_URL=postgresql://... celery -A examples.django_outbox.app worker     # send the confirmations

With ``apply_async`` the task could run before the order is committed (the worker finds no
row) or be sent for an order that is then rolled back. ``kombu_akadze.integrations.django.enqueue`` writes
the message in the same transaction as the order: after the commit both exist, after a
rollback neither does, and there is no ``transaction.on_commit`` window in which a crash loses
the task.

Environment: AKADZE_URL (the database of the orders and of the queue), AKADZE_TRANSPORT_OPTIONS
(JSON, e.g. {"schema": "akadze"}), DJANGO_OUTBOX_SEARCH_PATH (schema of the orders table; default public).
"""

from __future__ import annotations

import json
import os
import sys

import django
from celery import Celery
from django.conf import settings
from django.db import connection, transaction
from psycopg.conninfo import conninfo_to_dict

from kombu_akadze.integrations import django as akadze_django

SEND_CONFIRMATION = "examples.django_outbox.send_confirmation"


def configure() -> None:
    """Django settings for the example, from the environment (a real project has settings.py)."""
    if settings.configured:
        return
    url = os.environ.get("AKADZE_URL")
    if not url:
        raise SystemExit("set AKADZE_URL to the libpq URL of a PostgreSQL database, e.g. postgresql://localhost/app")
    params = conninfo_to_dict(url)
    search_path = os.environ.get("DJANGO_OUTBOX_SEARCH_PATH")
    database = {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 when it is installed (Django 4.2+)
        "NAME": params.get("dbname", ""),
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
        "OPTIONS": {"options": f"-c search_path={search_path}"} if search_path else {},
    }
    settings.configure(
        DATABASES={"default": database},
        INSTALLED_APPS=["examples.django_outbox"],
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
    )
    django.setup()


configure()

from examples.django_outbox.models import Order  # noqa: E402  (models need the settings above)

app = Celery("examples.django_outbox")
app.conf.update(
    broker_url="akadze+" + os.environ["AKADZE_URL"],
    broker_transport_options=json.loads(os.environ.get("AKADZE_TRANSPORT_OPTIONS") or "{}"),
    task_acks_late=True,
    task_ignore_result=True,
)


class PaymentDeclinedError(Exception):
    pass


@app.task(name=SEND_CONFIRMATION)
def send_confirmation(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)  # always there: the order committed with this message
    return f"confirmation sent for {order}"


def place_order(item: str, *, payment_ok: bool = True) -> Order:
    """Save the order and enqueue its confirmation in one transaction."""
    with transaction.atomic():
        order = Order.objects.create(item=item)
        akadze_django.enqueue(send_confirmation, (order.pk,))
        if not payment_ok:
            raise PaymentDeclinedError(f"payment for {item!r} declined")
    return order


def create_tables() -> None:
    """The example's one table (a real project runs `manage.py migrate`)."""
    if Order._meta.db_table not in connection.introspection.table_names():
        with connection.schema_editor() as editor:
            editor.create_model(Order)


def main() -> int:
    create_tables()
    order = place_order("a book")
    print(f"order {order.pk} placed: it and its confirmation task are committed together")
    try:
        place_order("a yacht", payment_ok=False)
    except PaymentDeclinedError as exc:
        print(f"{exc}: the order and its task were rolled back together")
    print(f"orders in the table: {Order.objects.count()}; now run: celery -A examples.django_outbox.app worker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
