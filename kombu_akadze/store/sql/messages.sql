-- The messages table's transitions and reads: publish, claim, ack, release, requeue, bury.
-- {schema} is the quoted schema name. %(now)s, where present, lets tests move the clock;
-- NULL means the database's now().

-- name: message_insert
-- One message into a queue; a ready one wakes one consumer parked on its queue,
-- if any (function wake, migrations 0008 and 0009: no NOTIFY when nobody waits).
-- Due later (delay, or a far ETA as not_before): state 'delayed', promoted when
-- due. TTL from the message or the queue, whichever is shorter. A queue at its
-- x-max-length with x-overflow=reject-publish takes nothing (no row returned);
-- only such a queue counts its messages (function queue_has_room, migration 0012:
-- an inline count was a subplan built at every publish). One CTE, and the wake in
-- the select list, called only for a ready row: every plan node is built per execution.
-- Unless %(durable)s (a transient message under transient_async), it commits without waiting
-- for the WAL flush: set_config in v, which the WHERE reads so that it runs first.
WITH ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at)
    SELECT %(queue)s, %(priority)s, %(body)s, %(content_type)s, %(content_encoding)s,
           %(headers)s, %(properties)s,
           CASE WHEN v.avail > v.now_ THEN 'delayed' ELSE 'ready' END, v.avail,
           v.now_ + make_interval(secs => LEAST(%(ttl)s::float8, extract(epoch FROM q.message_ttl)::float8))
    FROM (SELECT COALESCE(%(now)s::timestamptz, now()) AS now_,
                 GREATEST(COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s),
                          COALESCE(%(not_before)s::timestamptz, '-infinity')) AS avail,
                 CASE WHEN NOT %(durable)s::boolean THEN set_config('synchronous_commit', 'off', true)
                      ELSE '' END AS sc) AS v
    LEFT JOIN {schema}.queues AS q ON q.name = %(queue)s
    WHERE v.sc IS NOT NULL
      AND (q.max_length IS NULL OR q.overflow <> 'reject-publish'
           OR {schema}.queue_has_room(q.name, q.max_length))
    RETURNING id, queue, state
)
SELECT ins.id, CASE WHEN ins.state = 'ready' THEN {schema}.wake(ARRAY[ins.queue]) END AS woken FROM ins;

-- name: message_route
-- Publish through an exchange in one round trip: a copy for every bound queue
-- that matches (direct: equal key, topic: pattern, fanout: all), each waking one parked consumer;
-- delay, TTL, x-max-length (queue_has_room) and durability as message_insert.
WITH v AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now_,
           GREATEST(COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s),
                    COALESCE(%(not_before)s::timestamptz, '-infinity')) AS avail,
           CASE WHEN NOT %(durable)s::boolean THEN set_config('synchronous_commit', 'off', true)
                ELSE '' END AS sc
), targets AS (
    SELECT DISTINCT b.queue
    FROM {schema}.bindings AS b
    JOIN {schema}.exchanges AS e ON e.name = b.exchange
    WHERE b.exchange = %(exchange)s
      AND (e.type = 'fanout'
           OR (e.type = 'direct' AND b.routing_key = %(routing_key)s)
           OR (e.type = 'topic' AND ('.' || %(routing_key)s) ~ b.pattern))
), ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at)
    SELECT t.queue, %(priority)s, %(body)s, %(content_type)s, %(content_encoding)s,
           %(headers)s, %(properties)s,
           CASE WHEN v.avail > v.now_ THEN 'delayed' ELSE 'ready' END, v.avail,
           v.now_ + make_interval(secs => LEAST(%(ttl)s::float8, extract(epoch FROM q.message_ttl)::float8))
    FROM targets AS t
    CROSS JOIN v
    LEFT JOIN {schema}.queues AS q ON q.name = t.queue
    WHERE v.sc IS NOT NULL
      AND (q.max_length IS NULL OR q.overflow <> 'reject-publish'
           OR {schema}.queue_has_room(q.name, q.max_length))
    RETURNING id, queue, state
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM ins WHERE state = 'ready')) AS n
)
SELECT ins.id, ins.queue, (SELECT count(*) FROM targets) AS targets FROM ins CROSS JOIN woken
UNION ALL
SELECT NULL, NULL, (SELECT count(*) FROM targets) WHERE NOT EXISTS (SELECT 1 FROM ins);

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
-- queues the claim came back short for (function ack_claim, migration 0011; the parking
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
                        %(queues)s::text[], %(limits)s::integer[], %(now)s::timestamptz, %(park)s::text) AS r
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
-- attempt given back, fenced on (id, run_count, owner).
WITH released AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL,
        attempts = GREATEST(m.attempts - 1, 0)
    FROM unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = %(owner)s
    RETURNING m.id, m.queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM released)) AS n
)
SELECT released.id FROM released CROSS JOIN woken;

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
        WHERE m.state = 'held' AND m.owner = %(owner)s
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
    WHERE m.state = 'held' AND m.owner = %(owner)s
    FOR UPDATE OF m
), %(reason)s::text) AS b(id);

-- name: message_get
-- One message row by id, for inspection and tests.
SELECT id, queue, priority, state, owner, run_count, attempts, available_at, claimed_at, created_at
FROM {schema}.messages WHERE id = %(id)s;

-- name: message_counts
-- Rows per queue and state, for inspection and tests.
SELECT queue, state, count(*) AS n FROM {schema}.messages GROUP BY queue, state ORDER BY queue, state;
