-- 0017_wake_lock_per_schema: the queue lock that orders a publish's wake-up against a consumer's park
-- (0008, 0009) is keyed by the schema as well as the queue. It was keyed by the queue name alone, so
-- two deployments in one database (the schema transport option) that share a queue name, Celery's
-- default 'celery' say, shared the lock: while one's publisher held it (from its wake() to its
-- commit), the other's idle consumers could not park on their own queue, came back with 'retry' and
-- claimed again after 10 ms, backing off to 1 s, for as long as the first kept publishing. The key
-- is now one bigint: a hash of the schema name (in hex, as the migration writes it in) and the queue
-- name, seeded with the lock space's old first key, 1634427002 ('akdz'). wake, ack_claim and
-- claim_park (still called by workers of earlier releases) change together, in this one migration,
-- so every holder of the lock uses the same key from its commit on. Bodies otherwise as 0016, 0015
-- and 0008 (with the settings 0010 and 0013 gave claim_park).
CREATE OR REPLACE FUNCTION {schema}.wake(queues text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    woken integer;
BEGIN
    IF queues IS NULL OR cardinality(queues) = 0 THEN
        RETURN 0;
    ELSIF cardinality(queues) = 1 THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema_hex}:' || queues[1], 1634427002));
        IF NOT EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = queues[1]) THEN
            RETURN 0;
        END IF;
        WITH picked AS (
            SELECT w.queue, w.consumer FROM {schema}.waiting AS w
            WHERE w.queue = queues[1]
            ORDER BY w.since
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM {schema}.waiting AS w USING picked
            WHERE w.queue = picked.queue AND w.consumer = picked.consumer
            RETURNING w.channel, w.queue
        )
        SELECT count(*) INTO woken FROM (SELECT pg_notify(g.channel, g.queue) FROM gone AS g) AS n;
        RETURN woken;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema_hex}:' || s.q, 1634427002))
    FROM (SELECT DISTINCT q FROM unnest(queues) AS q ORDER BY q) AS s;
    IF NOT EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = ANY (queues)) THEN
        RETURN 0;
    END IF;
    WITH wanted AS (
        SELECT q, count(*) AS n FROM unnest(queues) AS q GROUP BY q
    ), picked AS (
        SELECT p.queue, p.consumer
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT w.queue, w.consumer FROM {schema}.waiting AS w
            WHERE w.queue = wanted.q
            ORDER BY w.since
            LIMIT wanted.n
            FOR UPDATE SKIP LOCKED
        ) AS p
    ), gone AS (
        DELETE FROM {schema}.waiting AS w USING picked
        WHERE w.queue = picked.queue AND w.consumer = picked.consumer
        RETURNING w.channel, w.queue
    )
    SELECT count(*) INTO woken FROM (SELECT pg_notify(g.channel, g.queue) FROM gone AS g) AS n;
    RETURN woken;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.ack_claim(
    ack_ids bigint[], ack_run_counts integer[], claimer text,
    queues text[], limits integer[], at timestamptz, channel text)
RETURNS TABLE (id bigint, queue text, priority smallint, body bytea, content_type text,
               content_encoding text, headers jsonb, properties jsonb, run_count integer,
               attempts integer, kind text)
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    took integer;
    late integer;
    i integer;
    parked boolean;
BEGIN
    IF cardinality(ack_ids) > 0 THEN
        RETURN QUERY WITH acked AS (
            DELETE FROM {schema}.messages AS m
            USING unnest(ack_ids, ack_run_counts) AS t(id, run_count)
            WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = claimer
            RETURNING m.id
        )
        SELECT a.id, NULL::text, NULL::smallint, NULL::bytea, NULL::text, NULL::text, NULL::jsonb,
               NULL::jsonb, NULL::integer, NULL::integer, 'acked'::text
        FROM acked AS a;
    END IF;
    -- Each queue in turn, as 0011 did for one: = ANY(ARRAY(...)) keeps the update a primary-key lookup
    -- of the picked ids (as claim). A queue the claim came back short for is parked on at once: its
    -- lock taken without waiting (a publisher holds it: a 'retry' row), the park recorded, then the
    -- same claim once more, a new statement, so a fresh snapshot: whatever was committed before the
    -- lock was taken.
    FOR i IN 1 .. LEAST(COALESCE(cardinality(queues), 0), COALESCE(cardinality(limits), 0)) LOOP
        took := 0;
        parked := false;
        LOOP
            RETURN QUERY WITH claimed AS (
                UPDATE {schema}.messages AS m
                SET state = 'held',
                    owner = claimer,
                    run_count = m.run_count + 1,
                    attempts = m.attempts + 1,
                    claimed_at = COALESCE(at, now())
                WHERE m.id = ANY (ARRAY(
                    SELECT p.id
                    FROM {schema}.messages AS p
                    WHERE p.queue = queues[i]
                      AND p.state = 'ready'
                      AND p.available_at <= COALESCE(at, now())
                      AND (p.expires_at IS NULL OR p.expires_at > COALESCE(at, now()))
                    ORDER BY p.priority DESC, p.id
                    LIMIT limits[i] - took
                    FOR UPDATE SKIP LOCKED
                ))
                RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers,
                          m.properties, m.run_count, m.attempts
            )
            SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding, c.headers,
                   c.properties, c.run_count, c.attempts, 'claimed'::text
            FROM claimed AS c;
            GET DIAGNOSTICS late = ROW_COUNT;
            took := took + late;
            IF parked THEN
                IF late > 0 THEN
                    DELETE FROM {schema}.waiting AS w WHERE w.consumer = claimer AND w.queue = queues[i];
                END IF;
                EXIT;
            END IF;
            EXIT WHEN channel IS NULL OR (took < limits[i]) IS NOT TRUE;
            IF NOT pg_try_advisory_xact_lock(hashtextextended('{schema_hex}:' || queues[i], 1634427002)) THEN
                RETURN QUERY SELECT NULL::bigint, queues[i], NULL::smallint, NULL::bytea, NULL::text,
                                    NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                                    'retry'::text;
                EXIT;
            END IF;
            INSERT INTO {schema}.waiting (queue, consumer, channel)
            VALUES (queues[i], claimer, channel)
            ON CONFLICT (queue, consumer) DO NOTHING;
            parked := true;
        END LOOP;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.claim_park(queues text[], limits integer[], claimer text, at timestamptz, channel text)
RETURNS SETOF {schema}.messages
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    got {schema}.messages[];
    late {schema}.messages[];
    short text[];
    wanted integer[];
    parked text[];
    busy text[];
    marker {schema}.messages;
    qname text;
BEGIN
    got := ARRAY(SELECT c FROM {schema}.claim(queues, limits, claimer, at) AS c);
    RETURN QUERY SELECT * FROM unnest(got);
    IF channel IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(x.name ORDER BY x.name), array_agg(x.lim - x.n ORDER BY x.name) INTO short, wanted
    FROM (
        SELECT q.name, q.lim, (SELECT count(*) FROM unnest(got) AS g WHERE g.queue = q.name)::integer AS n
        FROM unnest(queues, limits) AS q(name, lim)
    ) AS x
    WHERE x.n < x.lim;
    IF short IS NULL THEN
        RETURN;
    END IF;
    SELECT array_agg(s.q ORDER BY s.q) FILTER (WHERE s.locked), array_agg(s.q ORDER BY s.q) FILTER (WHERE NOT s.locked)
    INTO parked, busy
    FROM (SELECT q, pg_try_advisory_xact_lock(hashtextextended('{schema_hex}:' || q, 1634427002)) AS locked
          FROM unnest(short) AS q ORDER BY q) AS s;
    IF parked IS NOT NULL THEN
        INSERT INTO {schema}.waiting (queue, consumer, channel)
        SELECT q, claimer, channel FROM unnest(parked) AS q
        ON CONFLICT (queue, consumer) DO NOTHING;
        late := ARRAY(
            SELECT c FROM {schema}.claim(
                parked,
                ARRAY(SELECT w FROM unnest(short, wanted) AS s(q, w) WHERE s.q = ANY (parked) ORDER BY s.q),
                claimer, at) AS c);
        IF cardinality(late) > 0 THEN
            DELETE FROM {schema}.waiting AS w
            WHERE w.consumer = claimer AND w.queue IN (SELECT l.queue FROM unnest(late) AS l);
            RETURN QUERY SELECT * FROM unnest(late);
        END IF;
    END IF;
    IF busy IS NOT NULL THEN
        FOREACH qname IN ARRAY busy LOOP
            marker.queue := qname;
            RETURN NEXT marker;
        END LOOP;
    END IF;
END
$$;
