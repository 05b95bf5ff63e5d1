-- 0019_handoff_fits_when_parked: the size check of a handoff (handoff_fits: the body's base64 and the
-- headers and properties as text, against the 8,000-byte notification) runs inside handoff_pick once the
-- look at waiting found someone parked, instead of in every publish statement: a publish into a queue
-- nobody waits on (every consumer busy, or none) no longer renders its headers and properties as text
-- for nothing. handoff_pick takes the message's parts instead of the verdict; the 0018 form stays, unused.
CREATE FUNCTION {schema}.handoff_pick(q text, go boolean, body bytea, content_type text,
                                      content_encoding text, headers jsonb, properties jsonb)
RETURNS TABLE (to_consumer text, to_channel text, handoff boolean, still_parked boolean)
LANGUAGE plpgsql
VOLATILE
ROWS 1
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    picked record;
BEGIN
    IF go IS NOT TRUE THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema_hex}:' || q, 1634427002));
    IF NOT EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = q) THEN
        RETURN;
    END IF;
    SELECT w.consumer, w.channel, w.slots INTO picked
    FROM {schema}.waiting AS w
    WHERE w.queue = q
    ORDER BY w.since
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    handoff := picked.slots IS NOT NULL
               AND {schema}.handoff_fits(q, body, content_type, content_encoding, headers, properties);
    IF handoff AND picked.slots > 1 THEN
        UPDATE {schema}.waiting AS w SET slots = w.slots - 1, since = clock_timestamp()
        WHERE w.queue = q AND w.consumer = picked.consumer;
    ELSE
        DELETE FROM {schema}.waiting AS w WHERE w.queue = q AND w.consumer = picked.consumer;
    END IF;
    to_consumer := picked.consumer;
    to_channel := picked.channel;
    still_parked := handoff AND picked.slots > 1;
    RETURN NEXT;
END
$$;
