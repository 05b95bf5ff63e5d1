-- 0006_owner_fence: the ack fenced on the owner too, not only on (id, run_count). A claim that a
-- server lost (a crash before its WAL reached a standby that was then promoted) leaves the row as it
-- was before the claim; the next claim gives the message the same run_count again, to another
-- consumer, and the first consumer's late ack of its lost run would match and delete the newer run.
-- With the owner in the fence it changes nothing and the newer run stands. The two-argument ack of
-- 0005 stays for workers of the previous release during a rolling upgrade.

-- Delete the runs consumer claimer finished, fenced on (id, run_count, owner). The ids deleted.
CREATE FUNCTION {schema}.ack(ids bigint[], run_counts integer[], claimer text)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY WITH acked AS (
        DELETE FROM {schema}.messages AS m
        USING unnest(ids, run_counts) AS t(id, run_count)
        WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = claimer
        RETURNING m.id
    )
    SELECT acked.id FROM acked;
END
$$;
