"""RabbitMQ's image-resize work queue ported to Celery on kombu-akadze (see README.md here)."""
