-- What the worker-semantics tests read of the broker's tables (tests/acceptance/semantics.py).
-- {schema} is replaced by the quoted schema name.

-- name: messages
-- Every message row, with the Celery task id from its headers and seconds until it is due (database clock).
SELECT id, queue, state, owner, run_count, attempts, headers->>'id' AS task_id, claimed_at,
       extract(epoch FROM available_at - now())::float8 AS due_in
FROM {schema}.messages ORDER BY id;

-- name: consumers
-- Registered consumers and the age of their last heartbeat, in seconds (database clock).
SELECT id, pid, heartbeat_at, extract(epoch FROM now() - heartbeat_at)::float8 AS age
FROM {schema}.consumers;
