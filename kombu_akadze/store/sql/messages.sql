-- The messages table's transitions and reads: publish, claim, ack, release, requeue, bury.
-- {schema} is the quoted schema name. %(now)s, where present, lets tests move the clock;
-- NULL means the database's now().

-- name: message_insert
-- One message into a queue (function publish, migrations 0020 and 0021): its id, or NULL when the queue is at
-- its x-max-length with x-overflow=reject-publish and took nothing. A ready one is handed to (or wakes)
-- the consumer parked longest on its queue, if any; nobody parked, no NOTIFY. Due later (delay, or a
-- far ETA as not_before): 'delayed', promoted when due. Unless %(durable)s (a transient message under
-- transient_async), it commits without waiting for the WAL flush.
SELECT {schema}.publish(%(queue)s, %(priority)s::smallint, %(body)s, %(content_type)s, %(content_encoding)s,
                        %(headers)s::jsonb, %(properties)s::jsonb, %(delay)s::float8, %(ttl)s::float8,
                        %(not_before)s::timestamptz, %(durable)s::boolean, %(now)s::timestamptz) AS id;

-- name: message_route
-- Publish through an exchange in one round trip: a copy for every bound queue that matches (direct:
-- equal key, topic: pattern, fanout: all), each by the function publish as message_insert; a row per
-- matching queue, id NULL where a full queue (reject-publish) took nothing; no row, nothing matched.
-- The queues are published to in name order (the sorted subquery runs first), so two publishes to
-- the same queues take their locks in the same order.
SELECT t.queue,
       {schema}.publish(t.queue, %(priority)s::smallint, %(body)s, %(content_type)s, %(content_encoding)s,
                        %(headers)s::jsonb, %(properties)s::jsonb, %(delay)s::float8, %(ttl)s::float8,
                        %(not_before)s::timestamptz, %(durable)s::boolean, %(now)s::timestamptz) AS id
FROM (
    SELECT DISTINCT b.queue
    FROM {schema}.bindings AS b
    JOIN {schema}.exchanges AS e ON e.name = b.exchange
    WHERE b.exchange = %(exchange)s
      AND (e.type = 'fanout'
           OR (e.type = 'direct' AND b.routing_key = %(routing_key)s)
           OR (e.type = 'topic' AND ('.' || %(routing_key)s) ~ b.pattern))
    ORDER BY b.queue
) AS t;

-- name: message_insert_many
-- Many messages in one statement (arrays of equal length); each ready one wakes one
-- parked consumer of its queue while there are any.
WITH ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at)
    SELECT t.queue, t.priority, t.body, t.content_type, t.content_encoding, t.headers, t.properties,
           CASE WHEN t.delay > 0 THEN 'delayed' ELSE 'ready' END,
           COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => t.delay),
           COALESCE(%(now)s::timestamptz, now())
               + make_interval(secs => LEAST(t.ttl, extract(epoch FROM q.message_ttl)::float8))
    FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(bodies)s::bytea[],
                %(content_types)s::text[], %(content_encodings)s::text[], %(headers)s::jsonb[],
                %(properties)s::jsonb[], %(delays)s::float8[], %(ttls)s::float8[])
         AS t(queue, priority, body, content_type, content_encoding, headers, properties, delay, ttl)
    LEFT JOIN {schema}.queues AS q ON q.name = t.queue
    RETURNING id, queue, state
)
SELECT {schema}.wake(ARRAY(SELECT queue FROM ins WHERE state = 'ready')) AS notified;

-- name: message_route_many
-- A batch of publishes in one statement (arrays of equal length, in publish
-- order): each routed through its exchange's bindings ('' = the default
-- exchange: the routing key names the queue), delay and TTL as message_insert;
-- each ready copy wakes one parked consumer of its queue while there are any.
WITH t AS (
    SELECT *
    FROM unnest(%(exchanges)s::text[], %(routing_keys)s::text[], %(priorities)s::smallint[],
                %(bodies)s::bytea[], %(content_types)s::text[], %(content_encodings)s::text[],
                %(headers)s::jsonb[], %(properties)s::jsonb[], %(ttls)s::float8[],
                %(not_befores)s::timestamptz[])
         WITH ORDINALITY AS t(exchange, routing_key, priority, body, content_type, content_encoding,
                              headers, properties, ttl, not_before, ord)
), targets AS (
    SELECT t.ord, b.queue
    FROM t
    JOIN {schema}.bindings AS b ON b.exchange = t.exchange
    JOIN {schema}.exchanges AS e ON e.name = b.exchange
    WHERE e.type = 'fanout'
       OR (e.type = 'direct' AND b.routing_key = t.routing_key)
       OR (e.type = 'topic' AND ('.' || t.routing_key) ~ b.pattern)
    UNION
    SELECT t.ord, t.routing_key FROM t WHERE t.exchange = ''
), ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at)
    SELECT x.queue, t.priority, t.body, t.content_type, t.content_encoding, t.headers, t.properties,
           CASE WHEN COALESCE(t.not_before, '-infinity') > COALESCE(%(now)s::timestamptz, now())
                THEN 'delayed' ELSE 'ready' END,
           GREATEST(COALESCE(%(now)s::timestamptz, now()), COALESCE(t.not_before, '-infinity')),
           COALESCE(%(now)s::timestamptz, now())
               + make_interval(secs => LEAST(t.ttl, extract(epoch FROM q.message_ttl)::float8))
    FROM targets AS x
    JOIN t ON t.ord = x.ord
    LEFT JOIN {schema}.queues AS q ON q.name = x.queue
    ORDER BY t.ord
    RETURNING id, queue, state
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM ins WHERE state = 'ready')) AS n
)
SELECT (SELECT count(*) FROM ins) AS inserted, (SELECT count(DISTINCT ord) FROM targets) AS routed,
       (SELECT n FROM woken) AS woken;

-- name: message_claim
-- Hold up to limits[i] ready messages of queues[i] for one consumer (function
-- claim, migration 0005: priority first, then publish order, SKIP LOCKED, run_count
-- bumped, an attempt spent; planned to walk the indexes whatever the statistics).
SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding,
       c.headers, c.properties, c.run_count, c.attempts
FROM {schema}.claim(%(queues)s::text[], %(limits)s::integer[], %(owner)s::text, %(now)s::timestamptz) AS c;

-- name: message_ack_claim
-- The hot path in one round trip: delete the runs this consumer finished
-- (fenced on (id, run_count, owner), as message_ack) and claim the next messages (as
-- message_claim); given a park channel (the consumer's wake-up channel) it parks on the
-- queues the claim came back short for, with the slots it has left there, which publishes
-- then fill by handing messages over (function ack_claim, migrations 0011 and 0018; the parking
-- protocol of claim_park, migration 0008). Rows come back by kind: 'claimed' messages,
-- 'acked' ids, and 'retry' queues that could not be parked on (claim again at once).
-- Unless %(durable)s, it commits without waiting for the WAL flush (or a synchronous
-- standby): a server crash may undo the last fraction of a second of acks and claims, so
-- those messages run again; none is lost (see durable_acks). The one-time filter makes the
-- set_config run before the function, rows or not.
WITH relaxed AS (
    SELECT set_config('synchronous_commit',
                      CASE WHEN %(durable)s::boolean THEN current_setting('synchronous_commit') ELSE 'off' END,
                      true) AS sc
)
SELECT r.id, r.queue, r.priority, r.body, r.content_type, r.content_encoding,
       r.headers, r.properties, r.run_count, r.attempts, r.kind
FROM {schema}.ack_claim(%(ack_ids)s::bigint[], %(ack_run_counts)s::integer[], %(owner)s::text,
                        %(queues)s::text[], %(limits)s::integer[], %(now)s::timestamptz, %(park)s::text,
                        true) AS r
WHERE (SELECT sc FROM relaxed) IS NOT NULL;

-- name: message_ack
-- Delete the messages this consumer finished, fenced on (id, run_count, owner)
-- (function ack, migration 0006): a run that was rescued and re-claimed since, or
-- a run a failed-over server lost and gave again to another consumer, is left alone.
-- Committed without waiting for the WAL flush unless %(durable)s (as message_ack_claim).
SELECT a.id FROM {schema}.ack(%(ids)s::bigint[], %(run_counts)s::integer[], %(owner)s::text) AS a(id)
WHERE set_config('synchronous_commit',
                 CASE WHEN %(durable)s::boolean THEN current_setting('synchronous_commit') ELSE 'off' END,
                 true) IS NOT NULL;

-- name: message_release
-- Graceful give-back (shutdown, connection close): ready again in place, the
-- attempt given back, fenced on (id, run_count, owner). The owner fence is one
-- (... AND ...) IS TRUE condition here and in the three outcomes below, as in the
-- ack (0023 and 0024): a generic plan then looks the ids up by primary key and
-- never walks messages_held_idx over every row the consumer holds.
WITH released AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL,
        attempts = GREATEST(m.attempts - 1, 0)
    FROM unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND (m.state = 'held' AND m.owner = %(owner)s) IS TRUE
    RETURNING m.id, m.queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM released)) AS n
)
SELECT released.id FROM released CROSS JOIN woken;

-- name: message_refuse
-- A handed-over message its consumer does not take (no free slot, or no channel
-- consuming its queue any more), given back as it arrives: ready in place, and the
-- run it was handed as undone too (run_count and attempt back), since no task and
-- no outcome ever saw that run. Fenced on (id, run_count, owner).
WITH refused AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL,
        attempts = GREATEST(m.attempts - 1, 0), run_count = m.run_count - 1
    FROM unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND (m.state = 'held' AND m.owner = %(owner)s) IS TRUE
    RETURNING m.id, m.queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM refused)) AS n
)
SELECT refused.id FROM refused CROSS JOIN woken;

-- name: message_requeue
-- Abnormal end of a run (reject with requeue): the attempt stays spent; ready
-- again in place, or dead letters once max_attempts is used up (function
-- requeue_or_bury, migration 0007). Fenced on (id, run_count, owner).
WITH outcome AS (
    SELECT r.message_id AS id, r.outcome, r.queue
    FROM {schema}.requeue_or_bury(ARRAY(
        SELECT m.id
        FROM {schema}.messages AS m
        JOIN unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
          ON m.id = t.id AND m.run_count = t.run_count
        WHERE (m.state = 'held' AND m.owner = %(owner)s) IS TRUE
        FOR UPDATE OF m
    ), %(max_attempts)s::integer, %(exhausted_reason)s::text) AS r
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM outcome WHERE outcome = 'ready')) AS n
)
SELECT outcome.id, outcome.outcome FROM outcome CROSS JOIN woken;

-- name: message_bury
-- Move held messages to dead letters with a reason (reject without requeue;
-- function bury, migration 0007). Fenced on (id, run_count, owner).
SELECT b.id
FROM {schema}.bury(ARRAY(
    SELECT m.id
    FROM {schema}.messages AS m
    JOIN unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
      ON m.id = t.id AND m.run_count = t.run_count
    WHERE (m.state = 'held' AND m.owner = %(owner)s) IS TRUE
    FOR UPDATE OF m
), %(reason)s::text) AS b(id);

-- name: message_get
-- One message row by id, for inspection and tests.
SELECT id, queue, priority, state, owner, run_count, attempts, available_at, claimed_at, created_at
FROM {schema}.messages WHERE id = %(id)s;

-- name: message_counts
-- Rows per queue and state, for inspection and tests.
SELECT queue, state, count(*) AS n FROM {schema}.messages GROUP BY queue, state ORDER BY queue, state;
