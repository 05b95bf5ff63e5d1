"""The settings the queue functions run with: planner settings that keep their plans on the indexes
(0005, 0010) and no JIT (0013: those settings price an unavoidable sort at 10^10, past jit_above_cost,
and a server with JIT compiled the hot path's statements at every call, 50 ms each). The handoff's two
SQL functions have no settings of their own (0022): PostgreSQL inlines them into publish's statements,
which run with JIT off, and it would not inline a function that has a SET clause. An ack looks its rows up
by primary key, never through the consumer's held rows (0023)."""

from __future__ import annotations

from pathlib import Path

import psycopg

from kombu_akadze.store import NewMessage, Store, sqlfiles
from kombu_akadze.store.records import ack_claim_params, split_tags

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


#: SQL functions inlined into the statements that call them (0022): they must have no settings (a SET clause
#: stops inlining) and run inside publish, which has JIT off.
INLINED = {
    "handoff_fits(queue text, body bytea, content_type text, content_encoding text, headers jsonb, properties jsonb)",
    "handoff_payload(m {schema}.messages, parked boolean)",
}


def inlined(store: Store) -> set[str]:
    return {name.replace("{schema}", store.schema) for name in INLINED}


def settings(store: Store) -> dict[str, set[str]]:
    rows = store.connection().execute(SQL["function_settings"], {"schema": store.schema}).fetchall()
    return {name: set(config or ()) for name, config in rows}


def test_every_function_of_the_schema_runs_without_jit(store: Store) -> None:
    found = settings(store)
    assert found.keys() >= QUEUE_FUNCTIONS, sorted(found)
    assert {name for name, config in found.items() if "jit=off" not in config} == inlined(store)
    assert {name: found[name] for name in inlined(store)} == {name: set() for name in inlined(store)}
    assert "jit=off" in found[next(name for name in found if name.startswith("publish("))]


def test_the_handoff_functions_are_inlined_into_the_statement_that_calls_them(store: Store) -> None:
    """Not called through the function manager (which would save and restore their settings and, a SQL
    function not inlined, parse and plan its body in every transaction): the plan shows their bodies."""
    schema = store.schema
    plan = "\n".join(
        row[0]
        for row in store.connection().execute(
            f'EXPLAIN (VERBOSE) SELECT "{schema}".handoff_payload(m, true), "{schema}".handoff_fits('
            "m.queue, m.body, m.content_type, m.content_encoding, m.headers, m.properties) "
            f'FROM "{schema}".messages AS m'
        )
    )
    assert "json_build_object" in plan, plan  # handoff_payload's body
    assert "octet_length" in plan, plan  # handoff_fits' body
    assert "handoff_payload" not in plan, plan
    assert "handoff_fits" not in plan, plan


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


def test_an_ack_looks_its_rows_up_by_primary_key_not_among_the_consumers_held_rows(pg_url: str, store: Store) -> None:
    """The ack's fence (state held, this owner) is messages_held_idx's predicate and key. Planned generically,
    an ack that said so walked that index over the consumer's entries and joined each against all the acked
    ids, a cost of rows held times rows acked (0023). Both acks (inside ack_claim, and alone) must find their
    rows through the primary key."""
    owner = "acker"
    for i in range(30):
        store.message_insert(NewMessage(queue="q", body=bytes([i])))
    held = store.message_claim(queues=["q"], limits=[30], owner=owner)
    assert len(held) == 30
    tags = [m.tag for m in held]
    with psycopg.connect(pg_url) as conn:  # one transaction: its own index scans, counted
        outcome = conn.execute(
            sqlfiles.render("message_ack_claim", schema=store.schema),
            ack_claim_params(tags[:10], [], [], owner, None, durable=False),
        ).fetchall()
        ids, run_counts = split_tags(tags[10:20])
        alone = conn.execute(
            sqlfiles.render("message_ack", schema=store.schema),
            {"ids": ids, "run_counts": run_counts, "owner": owner, "durable": False},
        ).fetchall()
        scans = conn.execute(SQL["index_scans_in_transaction"], {"schema": store.schema}).fetchone()
        conn.commit()
    assert sorted(row[0] for row in outcome if row[10] == "acked") == sorted(m.id for m in held[:10])
    assert sorted(row[0] for row in alone) == sorted(m.id for m in held[10:20])
    assert scans == (0, 20), "(messages_held_idx, messages_pkey) scans: one primary-key lookup per acked id"


def test_every_other_fenced_outcome_looks_its_rows_up_by_primary_key(pg_url: str, store: Store) -> None:
    """Release, refuse, requeue and bury carry the ack's fence, and their statements are prepared once they
    run often: planned generically, a fence written as two conditions walked messages_held_idx over every row
    the consumer holds (as the ack did before 0023), and requeue_or_bury's two statements every held row of
    the table (before 0024). Each finds its rows through the primary key."""
    owner = "outcomes"
    for i in range(40):
        store.message_insert(NewMessage(queue="q", body=bytes([i])))
    held = store.message_claim(queues=["q"], limits=[40], owner=owner)
    assert len(held) == 40
    batches = {
        name: [m.tag for m in held[i * 10 : i * 10 + 10]]
        for i, name in enumerate(("message_release", "message_refuse", "message_requeue", "message_bury"))
    }
    extra = {"message_requeue": {"max_attempts": 5, "exhausted_reason": "x"}, "message_bury": {"reason": "x"}}
    with psycopg.connect(pg_url) as conn:  # one transaction: its own index scans, counted
        conn.execute(SQL["generic_plans_in_transaction"])
        found = {}
        for name, tags in batches.items():
            ids, run_counts = split_tags(tags)
            before = conn.execute(SQL["index_scans_in_transaction"], {"schema": store.schema}).fetchone()
            rows = conn.execute(
                sqlfiles.render(name, schema=store.schema),
                {"ids": ids, "run_counts": run_counts, "owner": owner, **extra.get(name, {})},
                prepare=True,
            ).fetchall()
            after = conn.execute(SQL["index_scans_in_transaction"], {"schema": store.schema}).fetchone()
            assert before is not None
            assert after is not None
            found[name] = (sorted(row[0] for row in rows), after[0] - before[0])
        conn.commit()
    assert found == {name: (sorted(tag[0] for tag in tags), 0) for name, tags in batches.items()}, (
        "(ids, messages_held_idx scans) per outcome"
    )
