"""The example's one model."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "django_outbox"

    def __str__(self) -> str:
        return f"order {self.pk}: {self.item}"
