-- Every statement kombu-akadze runs at run time, one named block each.
-- {schema} is the quoted schema name. %(now)s, where present, lets tests move
-- the clock; NULL means the database's now().

-- name: message_insert
-- One message into a queue, plus a wake-up (payload: queue name) for listeners.
-- Due later (delay, or a far ETA as not_before): state 'delayed', promoted when
-- due. TTL from the message or the queue, whichever is shorter. A queue at its
-- x-max-length with x-overflow=reject-publish takes nothing (no row returned).
WITH v AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now_,
           GREATEST(COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s),
                    COALESCE(%(not_before)s::timestamptz, '-infinity')) AS avail
), ins AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at)
    SELECT %(queue)s, %(priority)s, %(body)s, %(content_type)s, %(content_encoding)s,
           %(headers)s, %(properties)s,
           CASE WHEN v.avail > v.now_ THEN 'delayed' ELSE 'ready' END, v.avail,
           v.now_ + make_interval(secs => LEAST(%(ttl)s::float8, extract(epoch FROM q.message_ttl)::float8))
    FROM v
    LEFT JOIN {schema}.queues AS q ON q.name = %(queue)s
    WHERE q.max_length IS NULL OR q.overflow <> 'reject-publish'
       OR (SELECT count(*) FROM {schema}.messages AS c
           WHERE c.queue = %(queue)s AND c.state IN ('ready', 'delayed')) < q.max_length
    RETURNING id, queue, state
)
SELECT ins.id FROM ins
LEFT JOIN LATERAL (SELECT pg_notify(%(channel)s, ins.queue) WHERE ins.state = 'ready') AS n ON true;

-- name: message_route
-- Publish through an exchange in one round trip: a copy for every bound queue
-- that matches (direct: equal key, topic: pattern, fanout: all), each woken;
-- delay, TTL and x-max-length as message_insert.
WITH v AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now_,
           GREATEST(COALESCE(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s),
                    COALESCE(%(not_before)s::timestamptz, '-infinity')) AS avail
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
    WHERE q.max_length IS NULL OR q.overflow <> 'reject-publish'
       OR (SELECT count(*) FROM {schema}.messages AS c
           WHERE c.queue = t.queue AND c.state IN ('ready', 'delayed')) < q.max_length
    RETURNING id, queue, state
)
SELECT ins.id, ins.queue, (SELECT count(*) FROM targets) AS targets FROM ins
LEFT JOIN LATERAL (SELECT pg_notify(%(channel)s, ins.queue) WHERE ins.state = 'ready') AS n ON true
UNION ALL
SELECT NULL, NULL, (SELECT count(*) FROM targets) WHERE NOT EXISTS (SELECT 1 FROM ins);

-- name: message_insert_many
-- Many messages in one statement (arrays of equal length), one wake-up per queue.
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
    RETURNING id, queue
), queues AS (
    SELECT DISTINCT queue FROM ins
)
SELECT count(*) AS notified FROM queues CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, queues.queue)) AS n;

-- name: message_route_many
-- A batch of publishes in one statement (arrays of equal length, in publish
-- order): each routed through its exchange's bindings ('' = the default
-- exchange: the routing key names the queue), delay and TTL as message_insert;
-- one wake-up per queue that got a ready message.
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
    SELECT pg_notify(%(channel)s, w.queue) FROM (SELECT DISTINCT queue FROM ins WHERE state = 'ready') AS w
)
SELECT (SELECT count(*) FROM ins) AS inserted, (SELECT count(DISTINCT ord) FROM targets) AS routed,
       (SELECT count(*) FROM woken) AS woken;

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
-- message_claim). Rows come back as claimed messages, then acked ids (acked = true).
-- Unless %(durable)s, it commits without waiting for the WAL flush (or a synchronous
-- standby): a server crash may undo the last fraction of a second of acks and
-- claims, so those messages run again; none is lost (see durable_acks). The
-- one-time filters make the set_config run before either branch, rows or not.
WITH relaxed AS (
    SELECT set_config('synchronous_commit',
                      CASE WHEN %(durable)s::boolean THEN current_setting('synchronous_commit') ELSE 'off' END,
                      true) AS sc
), acked AS (
    SELECT a.id FROM {schema}.ack(%(ack_ids)s::bigint[], %(ack_run_counts)s::integer[], %(owner)s::text) AS a(id)
), claimed AS (
    SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding,
           c.headers, c.properties, c.run_count, c.attempts
    FROM {schema}.claim(%(queues)s::text[], %(limits)s::integer[], %(owner)s::text, %(now)s::timestamptz) AS c
)
SELECT claimed.*, false AS acked FROM claimed WHERE (SELECT sc FROM relaxed) IS NOT NULL
UNION ALL
SELECT acked.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true FROM acked
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
)
SELECT released.id FROM released
CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, released.queue)) AS n;

-- name: message_requeue
-- Abnormal end of a run (reject with requeue): the attempt stays spent; ready
-- again in place, or dead letters once max_attempts is used up. Fenced on
-- (id, run_count, owner).
WITH target AS (
    SELECT m.id, m.attempts >= COALESCE(q.max_attempts, %(max_attempts)s) AS exhausted
    FROM {schema}.messages AS m
    JOIN unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
      ON m.id = t.id AND m.run_count = t.run_count
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.state = 'held' AND m.owner = %(owner)s
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
-- Move held messages to dead letters with a reason (reject without requeue).
-- Fenced on (id, run_count, owner).
WITH dead AS (
    DELETE FROM {schema}.messages AS m
    USING unnest(%(ids)s::bigint[], %(run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = %(owner)s
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
-- Register this consumer or mark it alive: one row however many messages it
-- holds; the queues it consumes are marked in use (queue expiry, auto_delete).
WITH beat AS (
    INSERT INTO {schema}.consumers (id, hostname, pid, started_at, heartbeat_at)
    VALUES (%(id)s, %(hostname)s, %(pid)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
    RETURNING heartbeat_at
), touched AS (
    UPDATE {schema}.queues
    SET last_used_at = COALESCE(%(now)s::timestamptz, now()),
        consumed_at = COALESCE(consumed_at, COALESCE(%(now)s::timestamptz, now()))
    WHERE name = ANY(%(queues)s::text[])
    RETURNING 1
)
SELECT (SELECT heartbeat_at FROM beat) AS heartbeat_at, (SELECT count(*) FROM touched) AS queues;

-- name: consumer_maintain
-- The heartbeat and the maintenance pass in one round trip (an idle worker's
-- main cost): mark this consumer alive and its queues in use; rescue the
-- messages of consumers silent for %(ttl)s seconds (attempt spent; dead letters
-- once max_attempts is used up) and forget those consumers; delete expired or
-- abandoned queues; expire ready messages past their TTL. This consumer's own
-- row and messages are never its own rescue's targets.
-- Reconcile: %(tracked)s lists the ids the transport holds (claimed, delivered, or
-- with an outcome still to write); NULL skips the check (a claim is in flight).
-- Rows held under this consumer's id, claimed more than %(ttl)s s ago and not
-- listed, are returned as orphans: the reply of a claim that committed was lost
-- (the connection dropped after the commit), so nobody will deliver or settle
-- them while this consumer lives. %(orphan_ids)s / %(orphan_run_counts)s are the
-- orphans of the previous pass, less any tracked since: still held by this
-- consumer in that same run, they go back to ready, the attempt given back.
WITH beat AS (
    INSERT INTO {schema}.consumers (id, hostname, pid, started_at, heartbeat_at)
    VALUES (%(id)s, %(hostname)s, %(pid)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
    RETURNING heartbeat_at
), touched AS (
    UPDATE {schema}.queues
    SET last_used_at = COALESCE(%(now)s::timestamptz, now()),
        consumed_at = COALESCE(consumed_at, COALESCE(%(now)s::timestamptz, now()))
    WHERE name = ANY(%(queues)s::text[])
    RETURNING 1
), dead_consumers AS (
    DELETE FROM {schema}.consumers
    WHERE heartbeat_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
      AND id <> %(id)s
    RETURNING id
), orphans AS (
    SELECT m.id, m.run_count
    FROM {schema}.messages AS m
    WHERE %(tracked)s::bigint[] IS NOT NULL
      AND m.state = 'held' AND m.owner = %(id)s
      AND m.claimed_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
      AND m.id <> ALL(%(tracked)s::bigint[])
), unstranded AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL, attempts = GREATEST(m.attempts - 1, 0)
    FROM unnest(%(orphan_ids)s::bigint[], %(orphan_run_counts)s::integer[]) AS t(id, run_count)
    WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = %(id)s
      AND m.id <> ALL(%(tracked)s::bigint[])
    RETURNING m.id, m.queue
), target AS (
    SELECT m.id, m.attempts >= COALESCE(q.max_attempts, %(max_attempts)s) AS exhausted
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.state = 'held'
      AND (m.owner IN (SELECT id FROM dead_consumers)
           OR (m.owner <> %(id)s
               AND m.claimed_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
               AND NOT EXISTS (SELECT 1 FROM {schema}.consumers AS c WHERE c.id = m.owner)))
    FOR UPDATE OF m SKIP LOCKED
), exhausted AS (
    DELETE FROM {schema}.messages AS m USING target
    WHERE m.id = target.id AND target.exhausted
    RETURNING m.*
), buried AS (
    INSERT INTO {schema}.dead_letters
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         run_count, attempts, reason, last_owner, created_at)
    SELECT id, queue, priority, body, content_type, content_encoding, headers, properties,
           run_count, attempts, %(exhausted_reason)s, owner, created_at
    FROM exhausted
    RETURNING 1
), requeued AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL
    FROM target
    WHERE m.id = target.id AND NOT target.exhausted
    RETURNING m.queue
), promoted AS (
    UPDATE {schema}.messages AS m SET state = 'ready'
    WHERE m.state = 'delayed' AND m.available_at <= COALESCE(%(now)s::timestamptz, now())
    RETURNING m.queue
), dl_candidates AS (
    -- Dead letters of queues that name a dead-letter exchange (RabbitMQ's DLX) are re-published
    -- there; with no matching binding they stay in dead letters (never dropped).
    SELECT d.id, q.arguments->>'x-dead-letter-exchange' AS dlx,
           COALESCE(q.arguments->>'x-dead-letter-routing-key',
                    d.properties->'delivery_info'->>'routing_key', d.queue) AS dlrk
    FROM {schema}.dead_letters AS d
    JOIN {schema}.queues AS q ON q.name = d.queue
    WHERE q.arguments ? 'x-dead-letter-exchange'
    FOR UPDATE OF d SKIP LOCKED
), dl_targets AS (
    SELECT c.id, b.queue AS target
    FROM dl_candidates AS c
    JOIN {schema}.bindings AS b ON b.exchange = c.dlx
    JOIN {schema}.exchanges AS e ON e.name = b.exchange
    WHERE e.type = 'fanout'
       OR (e.type = 'direct' AND b.routing_key = c.dlrk)
       OR (e.type = 'topic' AND ('.' || c.dlrk) ~ b.pattern)
    UNION
    SELECT c.id, c.dlrk FROM dl_candidates AS c
    WHERE c.dlx = '' AND EXISTS (SELECT 1 FROM {schema}.queues AS q2 WHERE q2.name = c.dlrk)
), dl_moved AS (
    DELETE FROM {schema}.dead_letters AS d
    USING (SELECT DISTINCT id FROM dl_targets) AS t
    WHERE d.id = t.id
    RETURNING d.*
), dl_routed AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties, state, available_at)
    SELECT t.target, m.priority, m.body, m.content_type, m.content_encoding,
           m.headers || jsonb_build_object('x-death',
               COALESCE(m.headers->'x-death', '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object(
                      'queue', m.queue, 'reason', m.reason, 'count', m.attempts,
                      'time', COALESCE(%(now)s::timestamptz, now())))),
           m.properties, 'ready', COALESCE(%(now)s::timestamptz, now())
    FROM dl_moved AS m
    JOIN dl_targets AS t ON t.id = m.id
    RETURNING queue
), woken AS (
    SELECT pg_notify(%(channel)s, r.queue)
    FROM (SELECT queue FROM requeued UNION SELECT queue FROM promoted UNION SELECT queue FROM dl_routed
          UNION SELECT queue FROM unstranded) AS r
), capped AS (
    -- x-max-length with drop-head: the oldest ready messages beyond the cap are dropped.
    DELETE FROM {schema}.messages AS m
    USING (
        SELECT c.id FROM (
            SELECT x.id, row_number() OVER (PARTITION BY x.queue ORDER BY x.id DESC) AS nth, q.max_length
            FROM {schema}.messages AS x JOIN {schema}.queues AS q ON q.name = x.queue
            WHERE q.max_length IS NOT NULL AND q.overflow = 'drop-head' AND x.state IN ('ready', 'delayed')
        ) AS c WHERE c.nth > c.max_length
    ) AS over
    WHERE m.id = over.id
    RETURNING 1
), gone AS (
    DELETE FROM {schema}.queues AS q
    WHERE (q.expires IS NOT NULL AND q.last_used_at < COALESCE(%(now)s::timestamptz, now()) - q.expires)
       OR ((q.auto_delete OR q.exclusive) AND q.consumed_at IS NOT NULL
           AND q.last_used_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s))
    RETURNING q.name
), dropped AS (
    DELETE FROM {schema}.messages AS m USING gone WHERE m.queue = gone.name RETURNING 1
), unbound AS (
    DELETE FROM {schema}.bindings AS b USING gone WHERE b.queue = gone.name RETURNING 1
), expired AS (
    DELETE FROM {schema}.messages AS m
    WHERE m.expires_at < COALESCE(%(now)s::timestamptz, now()) AND m.state = 'ready'
    RETURNING m.*
), expired_buried AS (
    INSERT INTO {schema}.dead_letters
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         run_count, attempts, reason, last_owner, created_at)
    SELECT e.id, e.queue, e.priority, e.body, e.content_type, e.content_encoding, e.headers, e.properties,
           e.run_count, e.attempts, 'expired (message TTL)', e.owner, e.created_at
    FROM expired AS e
    JOIN {schema}.queues AS q ON q.name = e.queue
    WHERE q.arguments ? 'x-dead-letter-exchange' OR q.arguments ? 'x-dead-letter-routing-key'
    RETURNING 1
)
SELECT (SELECT count(*) FROM requeued) AS requeued, (SELECT count(*) FROM buried) AS dead,
       (SELECT count(*) FROM dead_consumers) AS consumers_gone, (SELECT count(*) FROM woken) AS woken,
       (SELECT count(*) FROM gone) AS queues, (SELECT count(*) FROM dropped) AS dropped,
       (SELECT count(*) FROM unbound) AS bindings, (SELECT count(*) FROM expired) AS expired,
       (SELECT count(*) FROM expired_buried) AS buried, (SELECT count(*) FROM touched) AS touched,
       (SELECT count(*) FROM promoted) AS promoted, (SELECT count(*) FROM capped) AS capped,
       (SELECT count(*) FROM dl_routed) AS dead_lettered,
       (SELECT count(*) FROM unstranded) AS unstranded,
       ARRAY(SELECT id FROM orphans ORDER BY id) AS orphan_ids,
       ARRAY(SELECT run_count FROM orphans ORDER BY id) AS orphan_run_counts,
       -- Dead rows of the messages table that nothing else will vacuum: counted only while the
       -- server's autovacuum is off (the consumer then vacuums, see vacuum.py); 0 otherwise.
       -- Only a role that may vacuum the table (its owner, a member of it, a superuser) sees them.
       (SELECT COALESCE(max(s.n_dead_tup), 0) FROM pg_stat_user_tables AS s
        JOIN pg_class AS c ON c.oid = s.relid
        WHERE s.schemaname = %(schema)s AND s.relname = 'messages'
          AND NOT current_setting('autovacuum')::boolean
          AND pg_has_role(c.relowner, 'USAGE')) AS unvacuumed;

-- name: consumer_delete
-- Forget a consumer that stopped cleanly (after it released what it held).
DELETE FROM {schema}.consumers WHERE id = %(id)s;

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
  AND available_at <= COALESCE(%(now)s::timestamptz, now());

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
-- Messages of a queue that a consumer could claim now (RabbitMQ's "ready").
SELECT count(*) AS ready FROM {schema}.messages
WHERE queue = %(name)s AND state = 'ready'
  AND available_at <= COALESCE(%(now)s::timestamptz, now());

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

-- name: queue_expire
-- Queue lifetime and message TTL: delete queues unused past x-expires, and
-- auto_delete/exclusive queues no live consumer touched for %(ttl)s seconds
-- (with their messages and bindings); expire ready messages past their TTL,
-- into dead letters when their queue names a dead-letter exchange.
WITH gone AS (
    DELETE FROM {schema}.queues AS q
    WHERE (q.expires IS NOT NULL AND q.last_used_at < COALESCE(%(now)s::timestamptz, now()) - q.expires)
       OR ((q.auto_delete OR q.exclusive) AND q.consumed_at IS NOT NULL
           AND q.last_used_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s))
    RETURNING q.name
), dropped AS (
    DELETE FROM {schema}.messages AS m USING gone WHERE m.queue = gone.name RETURNING 1
), unbound AS (
    DELETE FROM {schema}.bindings AS b USING gone WHERE b.queue = gone.name RETURNING 1
), expired AS (
    DELETE FROM {schema}.messages AS m
    WHERE m.expires_at < COALESCE(%(now)s::timestamptz, now()) AND m.state = 'ready'
    RETURNING m.*
), buried AS (
    INSERT INTO {schema}.dead_letters
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         run_count, attempts, reason, last_owner, created_at)
    SELECT e.id, e.queue, e.priority, e.body, e.content_type, e.content_encoding, e.headers, e.properties,
           e.run_count, e.attempts, 'expired (message TTL)', e.owner, e.created_at
    FROM expired AS e
    JOIN {schema}.queues AS q ON q.name = e.queue
    WHERE q.arguments ? 'x-dead-letter-exchange' OR q.arguments ? 'x-dead-letter-routing-key'
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS queues, (SELECT count(*) FROM dropped) AS dropped,
       (SELECT count(*) FROM unbound) AS bindings, (SELECT count(*) FROM expired) AS expired,
       (SELECT count(*) FROM buried) AS buried;

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

-- ==== operations (stats, dead letters, prune) ====

-- name: queue_stats
-- Per queue (declared, with messages, or with dead letters): ready now, held,
-- delayed, dead letters, seconds the oldest ready message has been claimable;
-- and consumers whose heartbeat is within %(ttl)s seconds, schema-wide.
-- "Ready" matches the claim: expired rows that queue_expire has not swept yet
-- are not counted.
WITH clock AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now
), msg AS (
    SELECT m.queue,
           count(*) FILTER (WHERE m.state IN ('ready', 'delayed') AND m.available_at <= clock.now
                              AND (m.expires_at IS NULL OR m.expires_at > clock.now)) AS ready,
           count(*) FILTER (WHERE m.state = 'held') AS held,
           count(*) FILTER (WHERE m.state IN ('ready', 'delayed') AND m.available_at > clock.now) AS delayed,
           min(m.available_at) FILTER (WHERE m.state IN ('ready', 'delayed') AND m.available_at <= clock.now
                                         AND (m.expires_at IS NULL OR m.expires_at > clock.now)) AS oldest_ready_at
    FROM {schema}.messages AS m CROSS JOIN clock
    GROUP BY m.queue
), dead AS (
    SELECT d.queue, count(*) AS dead FROM {schema}.dead_letters AS d GROUP BY d.queue
), names AS (
    SELECT q.name AS queue FROM {schema}.queues AS q
    UNION SELECT msg.queue FROM msg
    UNION SELECT dead.queue FROM dead
), alive AS (
    SELECT count(*) AS consumers_alive
    FROM {schema}.consumers AS c CROSS JOIN clock
    WHERE c.heartbeat_at >= clock.now - make_interval(secs => %(ttl)s)
)
-- LEFT JOIN from the one-row clock/alive: an empty schema still reports its consumers (queue NULL).
SELECT names.queue,
       COALESCE(msg.ready, 0) AS ready,
       COALESCE(msg.held, 0) AS held,
       COALESCE(msg.delayed, 0) AS delayed,
       COALESCE(dead.dead, 0) AS dead,
       extract(epoch FROM clock.now - msg.oldest_ready_at)::float8 AS oldest_ready_age_seconds,
       alive.consumers_alive,
       clock.now AS taken_at
FROM clock CROSS JOIN alive
LEFT JOIN names ON true
LEFT JOIN msg ON msg.queue = names.queue
LEFT JOIN dead ON dead.queue = names.queue
ORDER BY names.queue;

-- name: deadletter_find
-- Dead letters matching the filters, newest first, without bodies. Filters
-- (here and below; NULL = any): ids, queue, task = headers->>'task', reason
-- (case-insensitive substring), older_than (seconds before now, by dead_at).
SELECT d.id, d.queue, d.headers->>'task' AS task, d.reason, d.run_count, d.attempts,
       d.last_owner, d.created_at, d.dead_at, octet_length(d.body) AS body_size
FROM {schema}.dead_letters AS d
WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
  AND (%(task)s::text IS NULL OR d.headers->>'task' = %(task)s)
  AND (%(reason)s::text IS NULL OR strpos(lower(d.reason), lower(%(reason)s)) > 0)
  AND (%(older_than)s::float8 IS NULL
       OR d.dead_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
ORDER BY d.dead_at DESC, d.id DESC
LIMIT %(limit)s;

-- name: deadletter_count
-- How many dead letters match the filters (what a purge or replay would touch).
SELECT count(*) AS n
FROM {schema}.dead_letters AS d
WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
  AND (%(task)s::text IS NULL OR d.headers->>'task' = %(task)s)
  AND (%(reason)s::text IS NULL OR strpos(lower(d.reason), lower(%(reason)s)) > 0)
  AND (%(older_than)s::float8 IS NULL
       OR d.dead_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s));

-- name: deadletter_get
-- One dead letter, every column.
SELECT d.id, d.queue, d.priority, d.body, d.content_type, d.content_encoding, d.headers, d.properties,
       d.run_count, d.attempts, d.reason, d.last_owner, d.created_at, d.dead_at
FROM {schema}.dead_letters AS d
WHERE d.id = %(id)s;

-- name: deadletter_replay
-- Matching dead letters back into messages as ready with attempts reset, in one
-- statement: delete + insert under the SAME id, so a replay that is repeated or
-- races another one never makes a second copy (SKIP LOCKED: a concurrent replay
-- takes other rows; ON CONFLICT: an id already live stays as it is). run_count
-- is kept so a stale (id, run_count) tag from a run before the burial can never
-- match the replayed message's next claim.
WITH picked AS (
    SELECT d.id
    FROM {schema}.dead_letters AS d
    WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
      AND (%(task)s::text IS NULL OR d.headers->>'task' = %(task)s)
      AND (%(reason)s::text IS NULL OR strpos(lower(d.reason), lower(%(reason)s)) > 0)
      AND (%(older_than)s::float8 IS NULL
           OR d.dead_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
    ORDER BY d.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.dead_letters AS d USING picked
    WHERE d.id = picked.id
    RETURNING d.*
), back AS (
    INSERT INTO {schema}.messages
        (id, queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, run_count, attempts, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT g.id, g.queue, g.priority, g.body, g.content_type, g.content_encoding, g.headers, g.properties,
           'ready', COALESCE(%(now)s::timestamptz, now()), g.run_count, 0, g.created_at
    FROM gone AS g
    ON CONFLICT (id) DO NOTHING
    RETURNING id, queue
), woken AS (
    SELECT DISTINCT back.queue FROM back
)
SELECT back.id, 'replayed' AS outcome FROM back
UNION ALL
SELECT gone.id, 'already_live' AS outcome FROM gone WHERE gone.id NOT IN (SELECT back.id FROM back)
UNION ALL
SELECT NULL, 'notified' FROM woken CROSS JOIN LATERAL (SELECT pg_notify(%(channel)s, woken.queue)) AS n;

-- name: deadletter_purge
-- Delete the dead letters matching the filters (prune = older_than N days); returns how many.
WITH gone AS (
    DELETE FROM {schema}.dead_letters AS d
    WHERE (%(ids)s::bigint[] IS NULL OR d.id = ANY(%(ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR d.queue = %(queue)s)
      AND (%(task)s::text IS NULL OR d.headers->>'task' = %(task)s)
      AND (%(reason)s::text IS NULL OR strpos(lower(d.reason), lower(%(reason)s)) > 0)
      AND (%(older_than)s::float8 IS NULL
           OR d.dead_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s))
    RETURNING 1
)
SELECT count(*) AS purged FROM gone;

-- name: messages_size
-- Bytes of the messages heap and of all its indexes, read from the catalog (no table scan).
SELECT pg_relation_size(c.oid) AS heap_bytes, pg_indexes_size(c.oid) AS index_bytes
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = 'messages';

-- name: lock_timeout_set
-- How long the statements of this transaction wait for a lock before giving up (55P03).
SELECT set_config('lock_timeout', %(timeout)s, true);

-- name: messages_reindex
-- Rebuild the indexes of the messages table. A drained backlog leaves them at their peak size
-- (VACUUM frees index pages for reuse but never returns them); the caller runs this only on a
-- small heap, because while REINDEX reads it, writes and every use of the index being rebuilt wait.
REINDEX TABLE {schema}.messages;

-- name: messages_vacuum
-- What autovacuum would do to the messages table (dead rows gone, an empty tail truncated), for
-- servers that run with autovacuum off. Takes no lock that claims or publishes wait for; when another
-- consumer's VACUUM holds the table, this one is skipped instead of queueing behind it.
VACUUM (SKIP_LOCKED) {schema}.messages;
