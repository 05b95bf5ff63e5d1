"""The settings the queue functions run with: planner settings that keep their plans on the indexes
(0005, 0010) and no JIT (0013: those settings price an unavoidable sort at 10^10, past jit_above_cost,
and a server with JIT compiled the hot path's statements at every call, 50 ms each)."""

from __future__ import annotations

from pathlib import Path

from kombu_akadze.store import Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())

#: The hot path: each one runs with JIT off and (but claim_park) with sorts and sequential scans off.
QUEUE_FUNCTIONS = {
    "ack(ids bigint[], run_counts integer[])",
    "ack(ids bigint[], run_counts integer[], claimer text)",
    "ack_claim(ack_ids bigint[], ack_run_counts integer[], claimer text, queues text[], limits integer[], "
    "at timestamp with time zone, channel text)",
    "claim(queues text[], limits integer[], claimer text, at timestamp with time zone)",
    "claim_park(queues text[], limits integer[], claimer text, at timestamp with time zone, channel text)",
}


def settings(store: Store) -> dict[str, set[str]]:
    rows = store.connection().execute(SQL["function_settings"], {"schema": store.schema}).fetchall()
    return {name: set(config or ()) for name, config in rows}


def test_every_function_of_the_schema_runs_without_jit(store: Store) -> None:
    found = settings(store)
    assert found.keys() >= QUEUE_FUNCTIONS, sorted(found)
    assert {name for name, config in found.items() if "jit=off" not in config} == set()


def test_the_hot_path_keeps_its_plans_on_the_indexes(store: Store) -> None:
    found = settings(store)
    for name in QUEUE_FUNCTIONS - {next(n for n in QUEUE_FUNCTIONS if n.startswith("claim_park("))}:
        # claim_park has none of its own: its claims run in claim, and it runs inside ack_claim
        assert {"enable_seqscan=off", "enable_sort=off", "enable_bitmapscan=off"} <= found[name], name


def test_the_functions_called_at_every_publish_and_claim_keep_one_generic_plan(store: Store) -> None:
    # plpgsql would otherwise plan their statements afresh at every call, for their array arguments
    # (0010, 0011, 0014: wake() alone cost a parked consumer's publish ~0.35 ms of planning)
    found = settings(store)
    every_call = {n for n in QUEUE_FUNCTIONS if not n.startswith("ack(ids bigint[], run_counts integer[])")}
    every_call.add("wake(queues text[])")
    assert {n for n in every_call if "plan_cache_mode=force_generic_plan" not in found[n]} == set()
