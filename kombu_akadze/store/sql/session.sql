-- Statements a session runs on itself: they touch no table.

-- name: session_timeouts_set
-- Bound how long every statement of this session may wait for a lock and run in all
-- (transport options lock_timeout, statement_timeout; '0' turns one off, NULL keeps the
-- server's setting). Set once per connection, for the session: a statement past either
-- fails with 55P03 / 57014, a transient error the caller retries. A SET after connect
-- rather than libpq's "options", which PgBouncer refuses unless told to ignore it.
SELECT set_config('lock_timeout', COALESCE(%(lock_timeout)s, current_setting('lock_timeout')), false),
       set_config('statement_timeout', COALESCE(%(statement_timeout)s, current_setting('statement_timeout')), false);
