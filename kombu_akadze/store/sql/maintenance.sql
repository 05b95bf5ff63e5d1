-- Liveness and maintenance. Every consumer runs consumer_heartbeat (and, for its own rows,
-- lease_orphans); the passes after it run on one elected consumer for the whole fleet (see
-- lease/maintenance.py): rescue, delayed promotion, dead-letter routing, caps, queue expiry and
-- message TTL. Each pass is its own statement, used by production and tests alike, and safe when
-- two consumers run it at once (SKIP LOCKED, or re-checked conditions).
-- {schema} is the quoted schema name. %(now)s, where present, lets tests move the clock;
-- NULL means the database's now().

-- name: consumer_heartbeat
-- Register this consumer or mark it alive (one row however many messages it
-- holds) and mark the queues it consumes in use (queue expiry, auto_delete).
-- leader: whether this consumer is the oldest whose heartbeat is younger than
-- %(ttl)s seconds, i.e. the one that runs the fleet's maintenance passes. When
-- it dies, the next oldest takes over once its heartbeat is %(ttl)s s old.
-- ready: the consumed queues with a message claimable now. The heartbeat is the
-- safety poll of a consumer that waits for wake-ups: a wake-up that was lost (a
-- row written by hand, a woken consumer that died or was busy with another queue)
-- costs at most one heartbeat interval, and an idle consumer no extra statement.
WITH beat AS (
    INSERT INTO {schema}.consumers (id, hostname, pid, started_at, heartbeat_at)
    VALUES (%(id)s, %(hostname)s, %(pid)s,
            COALESCE(%(now)s::timestamptz, now()), COALESCE(%(now)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at
    RETURNING started_at
), touched AS (
    UPDATE {schema}.queues
    SET last_used_at = COALESCE(%(now)s::timestamptz, now()),
        consumed_at = COALESCE(consumed_at, COALESCE(%(now)s::timestamptz, now()))
    WHERE name = ANY(%(queues)s::text[])
    RETURNING 1
), unparked AS (
    -- A queue no longer consumed is no longer waited on.
    DELETE FROM {schema}.waiting AS w
    WHERE w.consumer = %(id)s AND w.queue <> ALL(%(queues)s::text[])
    RETURNING 1
)
SELECT NOT EXISTS (
           SELECT 1 FROM {schema}.consumers AS c, beat
           WHERE c.heartbeat_at > COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
             AND c.id <> %(id)s
             AND (c.started_at, c.id) < (beat.started_at, %(id)s::text)
       ) AS leader,
       ARRAY(SELECT q FROM unnest(%(queues)s::text[]) AS q
             WHERE EXISTS (SELECT 1 FROM {schema}.messages AS m
                           WHERE m.queue = q AND m.state = 'ready'
                             AND m.available_at <= COALESCE(%(now)s::timestamptz, now())
                             AND (m.expires_at IS NULL OR m.expires_at > COALESCE(%(now)s::timestamptz, now()))))
           AS ready,
       (SELECT count(*) FROM touched) AS queues, (SELECT count(*) FROM unparked) AS unparked;

-- name: consumer_unpark
-- A consumer about to stop (%(queues)s NULL), or that stopped consuming some
-- queues, is no longer parked there: no publish hands it another message. A
-- publish that picked it already holds the row lock this waits for, and commits
-- its handoff first (consumer_delete gives it back; a consumer still running
-- gives back what arrives for a queue it no longer consumes).
DELETE FROM {schema}.waiting
WHERE consumer = %(id)s AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]));

-- name: consumer_delete
-- Forget a consumer that stopped cleanly, after it released what it knew it held
-- and unparked (consumer_unpark, a statement before, so this one's snapshot sees
-- every handoff committed to it). Still held under its id: messages handed over
-- (migration 0018) whose notification it never read. Those go back to ready in
-- place, the attempt given back as message_release does, each waking a consumer.
WITH unparked AS (
    DELETE FROM {schema}.waiting WHERE consumer = %(id)s RETURNING 1
), released AS (
    UPDATE {schema}.messages AS m
    SET state = 'ready', owner = NULL, claimed_at = NULL, attempts = GREATEST(m.attempts - 1, 0)
    WHERE m.state = 'held' AND m.owner = %(id)s
    RETURNING m.queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM released)) AS n FROM (SELECT count(*) FROM unparked) AS u
), gone AS (
    DELETE FROM {schema}.consumers WHERE id = %(id)s RETURNING 1
)
SELECT (SELECT count(*) FROM released) AS released, (SELECT n FROM woken) AS woken,
       (SELECT count(*) FROM gone) AS gone;

-- name: consumer_delete_idle
-- Forget a consumer whose process exits without closing its connection (a CLI
-- client, a script that got its result), only while no message is held under
-- its id: a held row keeps its consumer, and rescue returns it after the ttl as
-- after a crash. Returns how many consumer rows went (0 or 1).
WITH idle AS (
    SELECT NOT EXISTS (SELECT 1 FROM {schema}.messages AS m
                       WHERE m.state = 'held' AND m.owner = %(id)s) AS yes
), unparked AS (
    DELETE FROM {schema}.waiting AS w USING idle WHERE idle.yes AND w.consumer = %(id)s RETURNING 1
), gone AS (
    DELETE FROM {schema}.consumers AS c USING idle WHERE idle.yes AND c.id = %(id)s RETURNING 1
)
SELECT count(*) AS forgotten FROM gone;

-- name: lease_rescue
-- Return the messages of dead consumers (heartbeat older than %(ttl)s seconds)
-- to ready, spending the attempt, or to dead letters once max_attempts is used
-- up (function requeue_or_bury, migration 0007); and forget those consumers.
-- Held rows whose consumer row is gone count too once claimed longer than the
-- TTL ago (the claimed_at guard keeps a fresh claim racing this statement safe).
-- %(id)s, the consumer running the pass, is never its own target. SKIP LOCKED:
-- concurrent rescuers split the work instead of counting an attempt twice.
WITH dead_consumers AS (
    DELETE FROM {schema}.consumers
    WHERE heartbeat_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
      AND id IS DISTINCT FROM %(id)s::text
    RETURNING id
), rescued AS (
    SELECT r.message_id, r.outcome, r.queue
    FROM {schema}.requeue_or_bury(ARRAY(
        SELECT m.id
        FROM {schema}.messages AS m
        WHERE m.state = 'held'
          AND m.owner IS DISTINCT FROM %(id)s::text
          AND (m.owner IN (SELECT id FROM dead_consumers)
               OR (m.claimed_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
                   AND NOT EXISTS (SELECT 1 FROM {schema}.consumers AS c WHERE c.id = m.owner)))
        FOR UPDATE OF m SKIP LOCKED
    ), %(max_attempts)s::integer, %(exhausted_reason)s::text) AS r
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM rescued WHERE outcome = 'ready')) AS n
)
SELECT message_id AS id, outcome FROM rescued CROSS JOIN woken
UNION ALL
SELECT NULL, 'consumer_gone' FROM dead_consumers;

-- name: waiting_prune
-- Consumers silent for %(ttl)s seconds (or gone) are no longer parked: a wake-up
-- sent to one would be lost until the safety poll of another. Runs before
-- lease_rescue, whose wake-ups then go to live consumers.
WITH gone AS (
    DELETE FROM {schema}.waiting AS w
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.consumers AS c
        WHERE c.id = w.consumer
          AND c.heartbeat_at >= COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s))
    RETURNING 1
)
SELECT count(*) AS unparked FROM gone;

-- name: lease_orphans
-- Reconcile, detection half: rows held under this consumer's id, claimed more
-- than %(ttl)s s ago (two heartbeat intervals, at most heartbeat_ttl), that the
-- transport does not hold (%(tracked)s: ids it has claimed, delivered, or with an
-- outcome still to write). The reply of a claim that committed was lost (the
-- connection dropped after the commit), or the notification of a handoff (the
-- LISTEN session went between the park and the publish), so nobody will deliver
-- or settle them while this consumer lives. Seen at two passes in a row, they are
-- given back with message_release (fenced on the same run).
SELECT m.id, m.run_count
FROM {schema}.messages AS m
WHERE m.state = 'held' AND m.owner = %(id)s
  AND m.claimed_at < COALESCE(%(now)s::timestamptz, now()) - make_interval(secs => %(ttl)s)
  AND m.id <> ALL(%(tracked)s::bigint[])
ORDER BY m.id;

-- name: lease_unseen
-- Adoption (consume/adoption.py): every row held under this consumer's id that the transport does not
-- hold (%(tracked)s), whatever its age, asked once the consumer's LISTEN is armed again after its session
-- or relay hub was replaced. A publish that handed a message over meanwhile wrote the row held under
-- this id and sent its notification to nobody; the consumer delivers what it finds here as handed over.
SELECT m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers, m.properties,
       m.run_count, m.attempts
FROM {schema}.messages AS m
WHERE m.state = 'held' AND m.owner = %(id)s
  AND m.id <> ALL(%(tracked)s::bigint[])
ORDER BY m.id;

-- name: message_promote
-- Delayed messages whose time has come become ready, each waking one parked consumer.
WITH promoted AS (
    UPDATE {schema}.messages AS m SET state = 'ready'
    WHERE m.state = 'delayed' AND m.available_at <= COALESCE(%(now)s::timestamptz, now())
    RETURNING m.queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM promoted)) AS n
)
SELECT (SELECT count(*) FROM promoted) AS promoted, (SELECT n FROM woken) AS woken;

-- name: deadletter_route
-- Dead letters of queues that name a dead-letter exchange (RabbitMQ's DLX) are
-- published there with an x-death entry, as RabbitMQ does; with no matching
-- binding they stay in dead letters (never dropped). Each wakes one parked consumer.
WITH candidates AS (
    SELECT d.id, q.arguments->>'x-dead-letter-exchange' AS dlx,
           COALESCE(q.arguments->>'x-dead-letter-routing-key',
                    d.properties->'delivery_info'->>'routing_key', d.queue) AS dlrk
    FROM {schema}.dead_letters AS d
    JOIN {schema}.queues AS q ON q.name = d.queue
    WHERE q.arguments ? 'x-dead-letter-exchange'
    FOR UPDATE OF d SKIP LOCKED
), targets AS (
    SELECT c.id, b.queue AS target
    FROM candidates AS c
    JOIN {schema}.bindings AS b ON b.exchange = c.dlx
    JOIN {schema}.exchanges AS e ON e.name = b.exchange
    WHERE e.type = 'fanout'
       OR (e.type = 'direct' AND b.routing_key = c.dlrk)
       OR (e.type = 'topic' AND ('.' || c.dlrk) ~ b.pattern)
    UNION
    SELECT c.id, c.dlrk FROM candidates AS c
    WHERE c.dlx = '' AND EXISTS (SELECT 1 FROM {schema}.queues AS q2 WHERE q2.name = c.dlrk)
), moved AS (
    DELETE FROM {schema}.dead_letters AS d
    USING (SELECT DISTINCT id FROM targets) AS t
    WHERE d.id = t.id
    RETURNING d.*
), routed AS (
    INSERT INTO {schema}.messages
        (queue, priority, body, content_type, content_encoding, headers, properties, state, available_at)
    SELECT t.target, m.priority, m.body, m.content_type, m.content_encoding,
           m.headers || jsonb_build_object('x-death',
               COALESCE(m.headers->'x-death', '[]'::jsonb)
               || jsonb_build_array(jsonb_build_object(
                      'queue', m.queue, 'reason', m.reason, 'count', m.attempts,
                      'time', COALESCE(%(now)s::timestamptz, now())))),
           m.properties, 'ready', COALESCE(%(now)s::timestamptz, now())
    FROM moved AS m
    JOIN targets AS t ON t.id = m.id
    RETURNING queue
), woken AS (
    SELECT {schema}.wake(ARRAY(SELECT queue FROM routed)) AS n
)
SELECT (SELECT count(*) FROM routed) AS dead_lettered, (SELECT n FROM woken) AS woken;

-- name: queue_cap
-- x-max-length with drop-head: the oldest waiting (ready or delayed) messages
-- beyond the cap are dropped, as RabbitMQ drops its queue's head. Only rows
-- still waiting when locked: a row a claim is taking is skipped (SKIP LOCKED)
-- and the state is checked again on the locked row, so a message that became
-- held meanwhile is never dropped under its consumer.
WITH over AS (
    SELECT c.id FROM (
        SELECT x.id, row_number() OVER (PARTITION BY x.queue ORDER BY x.id DESC) AS nth, q.max_length
        FROM {schema}.messages AS x JOIN {schema}.queues AS q ON q.name = x.queue
        WHERE q.max_length IS NOT NULL AND q.overflow = 'drop-head' AND x.state IN ('ready', 'delayed')
    ) AS c WHERE c.nth > c.max_length
), locked AS (
    SELECT m.id FROM {schema}.messages AS m
    WHERE m.id IN (SELECT id FROM over) AND m.state IN ('ready', 'delayed')
    FOR UPDATE OF m SKIP LOCKED
), capped AS (
    DELETE FROM {schema}.messages AS m USING locked
    WHERE m.id = locked.id AND m.state IN ('ready', 'delayed')
    RETURNING 1
)
SELECT count(*) AS capped FROM capped;

-- name: queue_expire
-- Queue lifetime: delete queues unused past x-expires, and auto_delete/exclusive
-- queues no live consumer touched for %(ttl)s seconds, with their messages and
-- bindings (as RabbitMQ deletes an expired queue with its contents).
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
)
SELECT (SELECT count(*) FROM gone) AS queues, (SELECT count(*) FROM dropped) AS dropped,
       (SELECT count(*) FROM unbound) AS bindings;

-- name: message_expire
-- Message TTL: ready messages past their expiry leave the queue, into dead
-- letters (function bury) when their queue names a dead-letter exchange or
-- routing key, else dropped, as RabbitMQ does. Held messages are never expired.
WITH expired AS (
    SELECT m.id, COALESCE(q.arguments ? 'x-dead-letter-exchange'
                          OR q.arguments ? 'x-dead-letter-routing-key', false) AS dlx
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.expires_at < COALESCE(%(now)s::timestamptz, now()) AND m.state = 'ready'
    FOR UPDATE OF m SKIP LOCKED
), dropped AS (
    DELETE FROM {schema}.messages AS m USING expired AS e
    WHERE m.id = e.id AND NOT e.dlx AND m.state = 'ready'
    RETURNING 1
), buried AS (
    SELECT b.id FROM {schema}.bury(ARRAY(SELECT id FROM expired WHERE dlx), 'expired (message TTL)') AS b(id)
)
SELECT (SELECT count(*) FROM dropped) + (SELECT count(*) FROM buried) AS expired,
       (SELECT count(*) FROM buried) AS buried;

-- name: messages_unvacuumed
-- Dead rows of the messages table that nothing else will vacuum: counted only
-- while the server's autovacuum is off (a consumer then vacuums, see
-- lease/vacuum.py); 0 otherwise. Only a role that may vacuum the table (its
-- owner, a member of it, a superuser) sees them.
SELECT COALESCE(max(s.n_dead_tup), 0) AS unvacuumed
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE s.schemaname = %(schema)s AND s.relname = 'messages'
  AND NOT current_setting('autovacuum')::boolean
  AND pg_has_role(c.relowner, 'USAGE');
