"""kombu-akadze inside other frameworks: transactional enqueue (outbox, Django, SQLAlchemy), batch
publishing, Celery bootsteps, an embedded server and pytest helpers for users' own tests."""
