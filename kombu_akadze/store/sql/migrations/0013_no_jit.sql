-- 0013_no_jit: the queue functions never JIT-compile their statements. They run with enable_sort,
-- enable_seqscan and enable_bitmapscan off (0005: so their plans walk the indexes whatever the
-- statistics say), and the planner prices a disabled node it cannot avoid (the sort of a few queue
-- names, say) at 10^10: far past jit_above_cost, so a server with JIT available (PostgreSQL's default
-- since 12, where LLVM is installed) compiled those statements at every call. Measured on PostgreSQL 15
-- (one session): ack_claim on two queues that parks (a Celery worker with remote control consumes its
-- task queue and its pidbox queue, and parks whenever it goes idle) 50 ms a call with jit on, 0.4 ms with
-- jit off; a worker's ack landed ~50 ms after its task ended instead of ~4 ms.
ALTER FUNCTION {schema}.ack(bigint[], integer[]) SET jit = off;
ALTER FUNCTION {schema}.ack(bigint[], integer[], text) SET jit = off;
ALTER FUNCTION {schema}.ack_claim(bigint[], integer[], text, text[], integer[], timestamptz, text) SET jit = off;
ALTER FUNCTION {schema}.claim(text[], integer[], text, timestamptz) SET jit = off;
ALTER FUNCTION {schema}.claim_park(text[], integer[], text, timestamptz, text) SET jit = off;
ALTER FUNCTION {schema}.bury(bigint[], text) SET jit = off;
ALTER FUNCTION {schema}.requeue_or_bury(bigint[], integer, text) SET jit = off;
ALTER FUNCTION {schema}.wake(text[]) SET jit = off;
ALTER FUNCTION {schema}.queue_has_room(text, integer) SET jit = off;
