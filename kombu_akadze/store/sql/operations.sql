-- Operations: stats, dead letters (list, replay, purge), table size, vacuum and reindex.

-- name: deadletter_list
-- Dead letters, newest first, optionally of one queue.
SELECT id, queue, reason, run_count, attempts, headers, created_at, dead_at
FROM {schema}.dead_letters
WHERE %(queue)s::text IS NULL OR queue = %(queue)s
ORDER BY dead_at DESC, id DESC
LIMIT %(limit)s;

-- name: queue_stats
-- Per queue (declared, with messages, or with dead letters): ready now, held,
-- delayed, dead letters, seconds the oldest ready message has been claimable,
-- messages running or waiting again after a run that ended without an outcome
-- (attempts > 0: a rescued lease, a requeue);
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
           count(*) FILTER (WHERE m.attempts > 0) AS retried,
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
       COALESCE(msg.retried, 0) AS retried,
       extract(epoch FROM clock.now - msg.oldest_ready_at)::float8 AS oldest_ready_age_seconds,
       alive.consumers_alive,
       clock.now AS taken_at
FROM clock CROSS JOIN alive
LEFT JOIN names ON true
LEFT JOIN msg ON msg.queue = names.queue
LEFT JOIN dead ON dead.queue = names.queue
ORDER BY names.queue;

-- name: fleet_stats
-- The fleet's figures that cost nothing per message, for the metrics: rows
-- inserted into and deleted from messages, and inserted into dead_letters, as
-- PostgreSQL's own table statistics count them (cumulative since the server's
-- last statistics reset; a backend reports its counts at the end of a
-- transaction, at most about a second late when busy); and the maintenance
-- leader: the oldest consumer whose heartbeat is within %(ttl)s seconds, the
-- rule of consumer_heartbeat. %(schema)s is the schema's name (not quoted).
WITH clock AS (
    SELECT COALESCE(%(now)s::timestamptz, now()) AS now
), tables AS (
    SELECT s.relname, s.n_tup_ins, s.n_tup_del
    FROM pg_stat_user_tables AS s
    WHERE s.schemaname = %(schema)s AND s.relname IN ('messages', 'dead_letters')
), leader AS (
    SELECT c.id, c.hostname, c.pid
    FROM {schema}.consumers AS c CROSS JOIN clock
    WHERE c.heartbeat_at > clock.now - make_interval(secs => %(ttl)s)
    ORDER BY c.started_at, c.id
    LIMIT 1
)
SELECT COALESCE((SELECT t.n_tup_ins FROM tables AS t WHERE t.relname = 'messages'), 0) AS messages_inserted,
       COALESCE((SELECT t.n_tup_del FROM tables AS t WHERE t.relname = 'messages'), 0) AS messages_deleted,
       COALESCE((SELECT t.n_tup_ins FROM tables AS t WHERE t.relname = 'dead_letters'), 0) AS dead_lettered,
       (SELECT leader.id FROM leader) AS leader_id,
       (SELECT leader.hostname FROM leader) AS leader_hostname,
       (SELECT leader.pid FROM leader) AS leader_pid;

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
    SELECT {schema}.wake(ARRAY(SELECT queue FROM back)) AS n
)
SELECT back.id, 'replayed' AS outcome FROM back CROSS JOIN woken
UNION ALL
SELECT gone.id, 'already_live' AS outcome FROM gone WHERE gone.id NOT IN (SELECT back.id FROM back);

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
