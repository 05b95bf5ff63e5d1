-- Every statement kombu-akadze runs at run time, one named block each.
-- {schema} is the quoted schema name. %(now)s, where present, lets tests move
-- the clock; NULL means the database's now().

-- name: message_insert
-- One message into a queue, plus a wake-up (payload: queue name) for listeners.
WITH ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties, available_at)
    VALUES (%(queue)s, %(priority)s, %(body)s, %(content_type)s, %(content_encoding)s,
            %(headers)s, %(properties)s,
            COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s))
    RETURNING id, queue
)
SELECT ins.id FROM ins CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, ins.queue)) AS n;

-- name: message_insert_many
-- Many messages in one statement (arrays of equal length), one wake-up per queue.
WITH ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties, available_at)
    SELECT t.queue, t.priority, t.body, t.content_type, t.content_encoding, t.headers, t.properties,
           COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => t.delay)
    FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(bodies)s::bytea[],
                %(content_types)s::text[], %(content_encodings)s::text[], %(headers)s::jsonb[],
                %(properties)s::jsonb[], %(delays)s::float8[])
         AS t(queue, priority, body, content_type, content_encoding, headers, properties, delay)
    RETURNING id, queue
), queues AS (
    SELECT DISTINCT queue FROM ins
)
SELECT count(*) AS notified FROM queues CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, queues.queue)) AS n;

-- name: message_claim
-- Hold up to limits[i] ready messages of queues[i] for one consumer: priority
-- first, then publish order; SKIP LOCKED so concurrent claimers never wait on
-- or share a row. Every claim bumps run_count (the fence) and spends an attempt.
WITH picked AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[], %(limits)s::integer[]) AS q(name, lim)
    CROSS JOIN LATERAL (
        SELECT m.id
        FROM {schema}.messages AS m
        WHERE m.queue = q.name
          AND m.state = 'ready'
          AND m.available_at <= COALESCE(%(now)s::timestamptz, now())
        ORDER BY m.priority DESC, m.id
        LIMIT q.lim
        FOR UPDATE SKIP LOCKED
    ) AS c
)
UPDATE {schema}.messages AS m
SET state = 'held',
    owner = %(owner)s,
    run_count = m.run_count + 1,
    attempts = m.attempts + 1,
    claimed_at = COALESCE(%(now)s::timestamptz, now())
FROM picked
WHERE m.id = picked.id
RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding,
          m.headers, m.properties, m.run_count, m.attempts;

-- name: message_ack
-- Delete the messages this consumer finished, fenced on (id, run_count): a run
-- that was rescued and re-claimed since does not match and is left alone.
DELETE FROM {schema}.messages AS m
USING unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held'
RETURNING m.id;

-- name: message_release
-- Graceful give-back (shutdown, connection close): ready again in place, the
-- attempt given back, fenced on (id, run_count).
WITH released AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL,
        attempts = GREATEST(m.attempts - 1, 0)
    FROM unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held'
    RETURNING m.id, m.queue
)
SELECT released.id FROM released
CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, released.queue)) AS n;

-- name: message_requeue
-- Abnormal end of a run (reject with requeue): the attempt stays spent; ready
-- again in place, or dead letters once max_attempts is used up. Fenced.
WITH target AS (
    SELECT m.id, m.attempts >= COALESCE(q.max_attempts, %(max_attempts)s) AS exhausted
    FROM {schema}.messages AS m
    JOIN unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
      ON m.id = t.id AND m.run_count = t.run_count
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.state = 'held'
    FOR UPDATE OF m
), dead AS (
    DELETE FROM {schema}.messages AS m USING target
    WHERE m.id = target.id AND target.exhausted
    RETURNING m.*
), buried AS (
    INSERT INTO {schema}.dead_letters
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         run_count, attempts, reason, last_owner, created_at)
    SELECT id, queue, priority, body, content_type, content_encoding, headers, properties,
           run_count, attempts, %(exhausted_reason)s, owner, created_at
    FROM dead
    RETURNING id
), requeued AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL
    FROM target
    WHERE m.id = target.id AND NOT target.exhausted
    RETURNING m.id, m.queue
)
SELECT requeued.id, 'ready' AS outcome FROM requeued
CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, requeued.queue)) AS n
UNION ALL
SELECT buried.id, 'dead' AS outcome FROM buried;

-- name: message_bury
-- Move held messages to dead letters with a reason (reject without requeue). Fenced.
WITH dead AS (
    DELETE FROM {schema}.messages AS m
    USING unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held'
    RETURNING m.*
)
INSERT INTO {schema}.dead_letters
    (id, queue, priority, body, content_type, content_encoding, headers, properties,
     run_count, attempts, reason, last_owner, created_at)
SELECT id, queue, priority, body, content_type, content_encoding, headers, properties,
       run_count, attempts, %(reason)s, owner, created_at
FROM dead
RETURNING id;

-- name: lease_rescue
-- Return the messages of dead consumers (heartbeat older than %(ttl)s seconds)
-- to ready, spending the attempt, or to dead letters once max_attempts is used
-- up; and forget those consumers. Held rows whose consumer row is gone count
-- too once claimed longer than the TTL ago (the claimed_at guard keeps a fresh
-- claim racing this statement safe). SKIP LOCKED: concurrent rescuers split the
-- work instead of counting an attempt twice.
WITH dead_consumers AS (
    DELETE FROM {schema}.consumers
    WHERE heartbeat_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
    RETURNING id
), target AS (
    SELECT m.id, m.attempts >= COALESCE(q.max_attempts, %(max_attempts)s) AS exhausted
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.state = 'held'
      AND (m.owner IN (SELECT id FROM dead_consumers)
           OR (m.claimed_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
               AND NOT EXISTS (SELECT 1 FROM {schema}.consumers AS c WHERE c.id = m.owner)))
    FOR UPDATE OF m SKIP LOCKED
), dead AS (
    DELETE FROM {schema}.messages AS m USING target
    WHERE m.id = target.id AND target.exhausted
    RETURNING m.*
), buried AS (
    INSERT INTO {schema}.dead_letters
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         run_count, attempts, reason, last_owner, created_at)
    SELECT id, queue, priority, body, content_type, content_encoding, headers, properties,
           run_count, attempts, %(exhausted_reason)s, owner, created_at
    FROM dead
    RETURNING id
), requeued AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL
    FROM target
    WHERE m.id = target.id AND NOT target.exhausted
    RETURNING m.id, m.queue
)
SELECT requeued.id, 'ready' AS outcome FROM requeued
CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, requeued.queue)) AS n
UNION ALL
SELECT buried.id, 'dead' AS outcome FROM buried
UNION ALL
SELECT NULL, 'consumer_gone' FROM dead_consumers;

-- name: consumer_heartbeat
-- Register this consumer or mark it alive: one row, however many messages it holds.
INSERT INTO {schema}.consumers (id, hostname, pid, started_at, heartbeat_at)
VALUES (%(id)s, %(hostname)s, %(pid)s,
        COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
RETURNING heartbeat_at;

-- name: consumer_delete
-- Forget a consumer that stopped cleanly (after it released what it held).
DELETE FROM {schema}.consumers WHERE id = %(id)s;

-- name: queue_declare
-- Make a queue known (idempotent); a given max_attempts overrides the stored one.
INSERT INTO {schema}.queues (name, max_attempts, arguments)
VALUES (%(name)s, %(max_attempts)s, %(arguments)s)
ON CONFLICT (name) DO UPDATE SET max_attempts = EXCLUDED.max_attempts
WHERE EXCLUDED.max_attempts IS NOT NULL;

-- name: queue_exists
-- Whether a queue was declared.
SELECT EXISTS (SELECT 1 FROM {schema}.queues WHERE name = %(name)s) AS present;

-- name: queue_size
-- Messages of a queue that a consumer could claim now (RabbitMQ's "ready").
SELECT count(*) AS ready FROM {schema}.messages
WHERE queue = %(name)s AND state = 'ready'
  AND available_at <= COALESCE(%(now)s::timestamptz, now());

-- name: queue_purge
-- Delete a queue's ready messages (held ones stay with their consumers), as RabbitMQ does.
WITH gone AS (
    DELETE FROM {schema}.messages WHERE queue = %(name)s AND state = 'ready' RETURNING 1
)
SELECT count(*) AS purged FROM gone;

-- name: queue_delete
-- Drop a queue and every message in it (an explicit operator/application action).
WITH gone AS (
    DELETE FROM {schema}.messages WHERE queue = %(name)s RETURNING 1
), q AS (
    DELETE FROM {schema}.queues WHERE name = %(name)s RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM q) AS queues;

-- name: message_get
-- One message row by id, for inspection and tests.
SELECT id, queue, priority, state, owner, run_count, attempts, available_at, claimed_at, created_at
FROM {schema}.messages WHERE id = %(id)s;

-- name: message_counts
-- Rows per queue and state, for inspection and tests.
SELECT queue, state, count(*) AS n FROM {schema}.messages GROUP BY queue, state ORDER BY queue, state;

-- name: deadletter_list
-- Dead letters, newest first, optionally of one queue.
SELECT id, queue, reason, run_count, attempts, headers, created_at, dead_at
FROM {schema}.dead_letters
WHERE %(queue)s::text IS NULL OR queue = %(queue)s
ORDER BY dead_at DESC, id DESC
LIMIT %(limit)s;

-- name: listen_start
-- Subscribe this session to the wake-ups of one schema.
LISTEN {channel};
