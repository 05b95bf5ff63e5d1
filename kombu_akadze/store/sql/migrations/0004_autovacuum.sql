-- 0004_autovacuum: the queue tables churn (every message is an INSERT, an UPDATE per claim and a
-- DELETE at ack), so PostgreSQL's default trigger of 20 % dead rows lets them bloat between
-- vacuums. Vacuum them after a fixed number of dead rows instead, without cost-based pauses,
-- so space is reused by new messages and the claim index stays small.

ALTER TABLE {schema}.messages SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

-- One row per consumer, rewritten at every heartbeat.
ALTER TABLE {schema}.consumers SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

ALTER TABLE {schema}.queues SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);
