-- Queues, exchanges and bindings, shared by every process; and the LISTEN of one schema.

-- name: queue_declare
-- Make a queue known or redeclare it (lifetime and TTL from its arguments; a
-- given max_attempts overrides the stored one); returns its ready count.
WITH up AS (
    INSERT INTO {schema}.queues AS q
        (name, max_attempts, arguments, durable, auto_delete, exclusive, expires, message_ttl,
         max_length, overflow, last_used_at)
    VALUES (%(name)s, %(max_attempts)s, %(arguments)s, %(durable)s, %(auto_delete)s, %(exclusive)s,
            make_interval(secs => %(expires)s::float8), make_interval(secs => %(message_ttl)s::float8),
            %(max_length)s, %(overflow)s, COALESCE(%(now)s::timestamptz, now()))
    -- A redeclaration with arguments replaces them; a plain one (e.g. Celery declaring a queue
    -- by name before publishing) keeps what the queue was declared with.
    ON CONFLICT (name) DO UPDATE
    SET max_attempts = COALESCE(EXCLUDED.max_attempts, q.max_attempts),
        arguments = CASE WHEN EXCLUDED.arguments = '{}'::jsonb THEN q.arguments ELSE EXCLUDED.arguments END,
        durable = EXCLUDED.durable,
        auto_delete = EXCLUDED.auto_delete,
        exclusive = EXCLUDED.exclusive,
        expires = CASE WHEN EXCLUDED.arguments = '{}'::jsonb THEN q.expires ELSE EXCLUDED.expires END,
        message_ttl = CASE WHEN EXCLUDED.arguments = '{}'::jsonb THEN q.message_ttl ELSE EXCLUDED.message_ttl END,
        max_length = CASE WHEN EXCLUDED.arguments = '{}'::jsonb THEN q.max_length ELSE EXCLUDED.max_length END,
        overflow = CASE WHEN EXCLUDED.arguments = '{}'::jsonb THEN q.overflow ELSE EXCLUDED.overflow END,
        last_used_at = EXCLUDED.last_used_at
    RETURNING name
)
SELECT count(*) AS ready FROM {schema}.messages
WHERE queue = %(name)s AND state = 'ready'
  AND available_at <= COALESCE(%(now)s::timestamptz, now())
  AND (expires_at IS NULL OR expires_at > COALESCE(%(now)s::timestamptz, now()));

-- name: queue_touch
-- Mark queues in use now (a consumer started on them).
UPDATE {schema}.queues
SET last_used_at = COALESCE(%(now)s::timestamptz, now()),
    consumed_at = COALESCE(consumed_at, COALESCE(%(now)s::timestamptz, now()))
WHERE name = ANY(%(queues)s::text[]);

-- name: queue_exists
-- Whether a queue was declared.
SELECT EXISTS (SELECT 1 FROM {schema}.queues WHERE name = %(name)s) AS present;

-- name: queue_size
-- Messages of a queue that a consumer could claim now (RabbitMQ's "ready"): an expired message
-- no longer counts, as on RabbitMQ, though the message_expire pass removes its row later.
SELECT count(*) AS ready FROM {schema}.messages
WHERE queue = %(name)s AND state = 'ready'
  AND available_at <= COALESCE(%(now)s::timestamptz, now())
  AND (expires_at IS NULL OR expires_at > COALESCE(%(now)s::timestamptz, now()));

-- name: queue_purge
-- Delete a queue's ready messages (held ones stay with their consumers), as RabbitMQ does.
WITH gone AS (
    DELETE FROM {schema}.messages WHERE queue = %(name)s AND state IN ('ready', 'delayed') RETURNING 1
)
SELECT count(*) AS purged FROM gone;

-- name: queue_delete
-- Drop a queue, its bindings and every message in it (an explicit action, as on RabbitMQ).
WITH gone AS (
    DELETE FROM {schema}.messages WHERE queue = %(name)s RETURNING 1
), unbound AS (
    DELETE FROM {schema}.bindings WHERE queue = %(name)s RETURNING 1
), q AS (
    DELETE FROM {schema}.queues WHERE name = %(name)s RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM q) AS queues,
       (SELECT count(*) FROM unbound) AS bindings;

-- name: exchange_declare
-- Make an exchange known to every process (redeclaring updates it).
INSERT INTO {schema}.exchanges AS e (name, type, durable, auto_delete, arguments)
VALUES (%(name)s, %(type)s, %(durable)s, %(auto_delete)s, %(arguments)s)
ON CONFLICT (name) DO UPDATE
SET type = EXCLUDED.type, durable = EXCLUDED.durable, auto_delete = EXCLUDED.auto_delete,
    arguments = EXCLUDED.arguments
WHERE (e.type, e.durable, e.auto_delete, e.arguments)
      IS DISTINCT FROM (EXCLUDED.type, EXCLUDED.durable, EXCLUDED.auto_delete, EXCLUDED.arguments);

-- name: exchange_exists
-- Whether an exchange was declared.
SELECT EXISTS (SELECT 1 FROM {schema}.exchanges WHERE name = %(name)s) AS present;

-- name: exchanges_unbound
-- Which of these exchanges no queue is bound to (a process's event-route cache, refreshed on a
-- consumer's heartbeat session: see transport.exchanges).
SELECT x.name
FROM unnest(%(names)s::text[]) AS x(name)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.bindings AS b WHERE b.exchange = x.name);

-- name: exchange_delete
-- Drop an exchange and its bindings (queues and their messages stay).
WITH unbound AS (
    DELETE FROM {schema}.bindings WHERE exchange = %(name)s RETURNING 1
), e AS (
    DELETE FROM {schema}.exchanges WHERE name = %(name)s RETURNING 1
)
SELECT (SELECT count(*) FROM e) AS exchanges, (SELECT count(*) FROM unbound) AS bindings;

-- name: binding_declare
-- Bind a queue to an exchange with a routing key (idempotent).
INSERT INTO {schema}.bindings (exchange, routing_key, queue, pattern, arguments)
VALUES (%(exchange)s, %(routing_key)s, %(queue)s, %(pattern)s, %(arguments)s)
ON CONFLICT (exchange, routing_key, queue) DO NOTHING;

-- name: binding_delete
-- Unbind a queue from an exchange for one routing key.
DELETE FROM {schema}.bindings
WHERE exchange = %(exchange)s AND routing_key = %(routing_key)s AND queue = %(queue)s;

-- name: binding_list
-- Every binding, for inspection.
SELECT b.queue, b.exchange, b.routing_key, e.type
FROM {schema}.bindings AS b LEFT JOIN {schema}.exchanges AS e ON e.name = b.exchange
ORDER BY b.exchange, b.routing_key, b.queue;

-- name: listen_start
-- Subscribe this session to the wake-ups of one consumer (its own channel: see wake).
LISTEN {channel};

-- name: listen_stop
-- No more wake-ups of that channel on this session (a consumer of the host's relay went).
UNLISTEN {channel};

