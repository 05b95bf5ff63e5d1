-- 0010_generic_claim_plans: claim and claim_park keep one generic plan per session instead of planning
-- their statements again at every call. Their parameters (queue names, limits, the claimer, the time)
-- never change the plan that fits (the claim index, SKIP LOCKED), but PL/pgSQL's plan cache kept
-- choosing custom plans for them, and planning cost as much as running. Measured with pgbench on
-- PostgreSQL 15, one session: claim on an empty queue 4,025 -> 8,440 calls/s, claiming one message
-- from a 200,000-message backlog 2,230 -> 2,803/s.
ALTER FUNCTION {schema}.claim(text[], integer[], text, timestamptz)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION {schema}.claim_park(text[], integer[], text, timestamptz, text)
    SET plan_cache_mode = force_generic_plan;
