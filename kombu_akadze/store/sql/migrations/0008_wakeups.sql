-- 0008_wakeups: a message that becomes ready wakes at most one consumer of its queue, one that is
-- waiting for it, on that consumer's own channel; nobody waits: no NOTIFY at all. A consumer whose
-- claim came back short parks here (claim_park) and LISTENs on its own channel; busy consumers
-- claim again as they ack, and need no wake-up. Before this, every ready message was a NOTIFY on
-- one channel per schema that woke every listening consumer of every queue, each running a claim,
-- and a NOTIFY in a durable commit serialises concurrent publishers on PostgreSQL's notify lock.

-- One row per (queue, consumer) parked on it; longest parked is woken first.
CREATE TABLE {schema}.waiting (
    queue     text NOT NULL,
    consumer  text NOT NULL,
    channel   text NOT NULL,
    since     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, consumer)
);

CREATE INDEX waiting_consumer_idx ON {schema}.waiting (consumer);

ALTER TABLE {schema}.waiting SET (
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_cost_delay = 0
);

-- Wake one parked consumer per entry of queues (a queue named twice wakes two), longest parked
-- first; the rows of those woken go (they park again when they run dry). How many were woken.
-- A consumer parking on one of these queues right now finishes first (the advisory lock in lock
-- space 1634427002, 'akdz', shared here, exclusive in claim_park), so it is either seen parked
-- here or its re-check in claim_park sees what this transaction published: no lost wake-up.
CREATE FUNCTION {schema}.wake(queues text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $$
DECLARE
    woken integer;
BEGIN
    IF queues IS NULL OR cardinality(queues) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1634427002, hashtext(s.q))
    FROM (SELECT DISTINCT q FROM unnest(queues) AS q ORDER BY q) AS s;
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

-- claim, and park on the queues it came back short for: the consumer then waits on its own
-- channel instead of polling. Parking takes the queue's lock exclusively, without waiting: a
-- queue whose lock a publisher holds right now is not parked on and is returned as a row with a
-- NULL id ("claim again at once": its message is being committed). After parking, one more
-- claim with a fresh snapshot takes whatever was committed before the lock was taken; a queue
-- that yields something there is unparked again. channel NULL: a plain claim.
CREATE FUNCTION {schema}.claim_park(queues text[], limits integer[], claimer text, at timestamptz, channel text)
RETURNS SETOF {schema}.messages
LANGUAGE plpgsql
VOLATILE
ROWS 10
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
    FROM (SELECT q, pg_try_advisory_xact_lock(1634427002, hashtext(q)) AS locked
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
