"""Receive limits, as properties: whatever the mix of batch sizes, expired and fresh
messages, no claim path delivers a message more often than its queue's
max_receive_count (SQS's maxReceiveCount, hq's max_attempts), and every message that
reached it leaves for the dead-letter queue (or the archive) instead (migration 0019).
The same for partitioned queues' retryLimit: a message that failed more often than that
is not delivered again.

The paths: a standard receive (conveyor._claim), a pop, a FIFO receive (_claim_fifo), a
receive with an attempt id (ReceiveRequestAttemptId), a grouped receive of a standard
queue (_claim_grouped), pgmq's read and pop (the dialect runs the engine's claims), and
Queen's pop. Messages expire by having their visibility timeout moved into the past,
or by a claim with vt 0 (visible again at once)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conftest import create_database, drop_database, unique_name
from dialects import pgmq_support


@pytest.fixture(scope="module")
def pgmq_template(template_db: str) -> Iterator[str]:
    name = unique_name("conveyor_limits_tpl")
    pgmq_support.install_dialect(create_database(name, template=template_db))
    yield name
    drop_database(name)


@pytest.fixture
def sql(pgmq_template: str) -> Iterator[psycopg.Connection]:
    name = unique_name("conveyor_limits")
    dsn = create_database(name, template=pgmq_template)
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn
    drop_database(name)


def _rows(conn: psycopg.Connection, query: str, params: tuple[object, ...] = ()) -> list[tuple]:
    return conn.execute(query.encode(), params).fetchall()


def _expire(conn: psycopg.Connection, queue: str, ids: list[int]) -> None:
    """The visibility timeout of these messages runs out now (after every message sent so far
    became visible: they come after those in a receive's order)."""
    conn.execute("UPDATE conveyor.messages SET vt = clock_timestamp() "
                 "WHERE queue_id = (SELECT id FROM conveyor.queues WHERE name = %s) AND id = ANY (%s)", (queue, ids))


def test_a_receive_mixing_fresh_and_over_limit_messages_delivers_none_past_the_limit(sql):
    """Issue 25: max_receive_count 1, ids 1-4 received and expired, 5-6 fresh: a receive of 4
    took 5, 6 and then 3 and 4 a second time, while 1 and 2 went to the dead-letter queue."""
    sql.execute("SELECT conveyor.queue_create('dlq')")
    sql.execute("""SELECT conveyor.queue_create('q', '{"max_receive_count": 1, "dead_letter_queue": "dlq",
                                                      "visibility_timeout": 1}')""")
    sql.execute("SELECT conveyor.message_send_batch('q', array_fill('x'::text, ARRAY[6]))")
    assert _rows(sql, "SELECT id, receive_count FROM conveyor.message_receive('q', 1, 4) ORDER BY id") == [
        (1, 1), (2, 1), (3, 1), (4, 1)]
    _expire(sql, "q", [1, 2, 3, 4])
    assert _rows(sql, "SELECT id, receive_count FROM conveyor.message_receive('q', 1, 4) ORDER BY id") == [
        (5, 1), (6, 1)]
    assert _rows(sql, "SELECT source_queue_id, message_uuid IS NOT NULL FROM conveyor.messages m "
                      "JOIN conveyor.queues d ON d.id = m.queue_id AND d.name = 'dlq'") == [(2, True)] * 4


def test_the_reason_of_a_message_past_the_limit_reads_as_english(sql):
    for limit, reason in ((1, "reached max_receive_count (1 receive)"), (3, "reached max_receive_count (3 receives)")):
        queue = f"q{limit}"
        sql.execute("SELECT conveyor.queue_create(%s, jsonb_build_object('max_receive_count', %s))", (queue, limit))
        sql.execute("SELECT conveyor.message_send(%s, 'x')", (queue,))
        for _ in range(limit):
            sql.execute("SELECT conveyor.message_receive(%s, 0)", (queue,))
        assert _rows(sql, "SELECT * FROM conveyor.message_receive(%s, 0)", (queue,)) == []
        assert _rows(sql, "SELECT outcome, error FROM conveyor.archive a JOIN conveyor.queues q ON q.id = a.queue_id "
                          "WHERE q.name = %s", (queue,)) == [("failed", reason)]


# -- queues ---------------------------------------------------------------------------------

STANDARD_PATHS = ["receive", "pop", "grouped", "pgmq_read", "pgmq_pop", "pgmq_read_if", "pgmq_read_rr"]
FIFO_PATHS = ["receive", "pop", "attempt", "pgmq_read", "pgmq_read_rr"]

OPERATION = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 8)),
    st.tuples(st.just("receive"), st.integers(0, 4), st.integers(1, 8), st.sampled_from([0, 30])),
    st.tuples(st.just("expire"), st.integers(0, 2**12 - 1)),  # a bit per in-flight message
    st.tuples(st.just("retry_attempt")),
    st.tuples(st.just("delete"), st.integers(0, 2**12 - 1)),
)


def _claim(conn: psycopg.Connection, path: str, queue: str, qty: int, vt: int, attempt: str,
           tag: str = "") -> list[tuple]:
    """(id, message_uuid, receive_count) of what one call of a path delivered."""
    columns = "id, message_uuid, receive_count"
    if path == "receive":
        return _rows(conn, f"SELECT {columns} FROM conveyor.message_receive(%s, %s, %s)", (queue, vt, qty))
    if path == "pop":
        return _rows(conn, f"SELECT {columns} FROM conveyor.message_pop(%s, %s)", (queue, qty))
    if path == "grouped":
        return _rows(conn, f"SELECT {columns} FROM conveyor.message_receive_fifo(%s, %s, %s)", (queue, vt, qty))
    if path == "attempt":
        return _rows(conn, f"SELECT {columns} FROM conveyor.message_receive_attempt(%s, %s, %s, %s)",
                     (queue, attempt, vt, qty))
    # pgmq reports read_ct; the message's uuid is the engine's
    if path == "pgmq_read":
        rows = _rows(conn, "SELECT r.msg_id, r.read_ct FROM pgmq.read(%s, %s, %s) r", (queue, vt, qty))
    elif path == "pgmq_read_if":  # a conditional read (every body of the scenario matches)
        rows = _rows(conn, "SELECT r.msg_id, r.read_ct FROM pgmq.read(%s, %s, %s, %s) r",
                     (queue, vt, qty, Jsonb({"t": tag})))
    elif path == "pgmq_read_rr":  # grouped, round-robin across the groups
        rows = _rows(conn, "SELECT r.msg_id, r.read_ct FROM pgmq.read_grouped_rr(%s, %s, %s) r", (queue, vt, qty))
    else:
        rows = _rows(conn, "SELECT r.msg_id, r.read_ct + 1 FROM pgmq.pop(%s, %s) r", (queue, qty))
    return [(i, f"{queue}/{i}", count) for i, count in rows]


def _uuids(conn: psycopg.Connection, queue: str) -> dict[int, str]:
    return {mid: str(muid) for mid, muid in _rows(conn, "SELECT m.id, m.message_uuid FROM conveyor.messages m "
                            "JOIN conveyor.queues q ON q.id = m.queue_id WHERE q.name = %s", (queue,))}


def _run_queue_scenario(conn: psycopg.Connection, fifo: bool, limit: int, with_dlq: bool,
                        operations: list[tuple]) -> None:
    tag = uuid.uuid4().hex[:8]
    queue, dlq = f"q{tag}" + (".fifo" if fifo else ""), f"d{tag}" + (".fifo" if fifo else "")
    attrs: dict[str, object] = {"max_receive_count": limit}
    if fifo:
        attrs["content_based_deduplication"] = True
    if with_dlq:
        conn.execute("SELECT conveyor.queue_create(%s)", (dlq,))
        attrs["dead_letter_queue"] = dlq
    conn.execute("SELECT conveyor.queue_create(%s, %s::jsonb)", (queue, Jsonb(attrs)))
    paths = FIFO_PATHS if fifo else STANDARD_PATHS
    sent: dict[int, str] = {}  # id -> uuid
    deliveries: Counter[str] = Counter()  # uuid -> deliveries seen
    in_flight: dict[int, str] = {}
    gone: set[str] = set()  # deleted or popped by the consumer
    attempt, attempt_rows = "", set()
    n = 0
    for op in operations:
        if op[0] == "send":
            bodies = [f'{{"t": "{tag}", "n": {n + i}}}' for i in range(op[1])]
            groups = [f"g{(n + i) % 3}" for i in range(op[1])]
            n += op[1]
            conn.execute("SELECT conveyor.message_send_batch(%s, %s::text[], group_ids => %s::text[], "
                         "content_types => %s::text[])", (queue, bodies, groups, ["application/json"] * len(bodies)))
            sent |= _uuids(conn, queue)
        elif op[0] in ("receive", "retry_attempt"):
            if op[0] == "receive":
                path, qty, vt = paths[op[1] % len(paths)], op[2], op[3]
                if path == "attempt":
                    attempt = uuid.uuid4().hex
            elif attempt:
                path, qty, vt = "attempt", 6, 30  # a retry of the last receive with an attempt id
            else:
                continue
            got = _claim(conn, path, queue, qty, vt, attempt, tag)
            for mid, muid, count in got:
                muid = sent[mid] if path.startswith("pgmq") else str(muid)
                assert count <= limit, f"{path} delivered message {mid} with receive count {count} > {limit}"
                assert muid not in gone
                if not (op[0] == "retry_attempt" and (mid, count) in attempt_rows and count == deliveries[muid]):
                    deliveries[muid] += 1  # else the same delivery again (ReceiveRequestAttemptId)
                assert deliveries[muid] <= limit, f"{path} delivered message {mid} {deliveries[muid]} times"
                assert count == deliveries[muid], "receive counts follow the deliveries"
                if path.endswith("pop"):
                    gone.add(muid)
                    in_flight.pop(mid, None)
                elif vt > 0:
                    in_flight[mid] = muid
                else:
                    in_flight.pop(mid, None)
            if path == "attempt":
                attempt_rows = {(mid, count) for mid, _, count in got}
        elif op[0] == "expire":
            chosen = [mid for k, mid in enumerate(sorted(in_flight)) if op[1] >> k & 1]
            _expire(conn, queue, chosen)
            for mid in chosen:
                del in_flight[mid]
        elif op[0] == "delete":
            chosen = [mid for k, mid in enumerate(sorted(in_flight)) if op[1] >> k & 1]
            deleted = [r[0] for r in _rows(conn, "SELECT conveyor.message_delete(%s, %s::bigint[])", (queue, chosen))]
            for mid in deleted:
                gone.add(in_flight.pop(mid))
    # every message is in the queue, consumed, or moved after reaching the limit, once
    left = {str(u) for u in _uuids(conn, queue).values()}
    if with_dlq:
        moved = [str(r[0]) for r in _rows(conn, "SELECT m.message_uuid FROM conveyor.messages m "
                                                "JOIN conveyor.queues q ON q.id = m.queue_id WHERE q.name = %s", (dlq,))]
    else:
        moved = [str(r[0]) for r in _rows(conn, "SELECT a.message_uuid FROM conveyor.archive a JOIN conveyor.queues q "
                                                "ON q.id = a.queue_id WHERE q.name = %s AND a.outcome = 'failed'",
                                          (queue,))]
    assert left | set(moved) | gone == set(sent.values()) and len(moved) == len(set(moved))
    assert not (left & set(moved)) and not (set(moved) & gone) and not (left & gone)
    assert all(deliveries[u] == limit for u in moved), "only messages received max_receive_count times move"


ISSUE_25 = [("send", 6), ("receive", 0, 4, 0), ("receive", 0, 4, 30)]  # fresh 5, 6 before expired 1-4


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fifo=st.booleans(), limit=st.integers(1, 3), with_dlq=st.booleans(),
       operations=st.lists(OPERATION, min_size=1, max_size=20))
@example(fifo=False, limit=1, with_dlq=True, operations=ISSUE_25)
@example(fifo=False, limit=1, with_dlq=False, operations=[(op[0], 3, *op[2:]) if op[0] == "receive" else op
                                                          for op in ISSUE_25])  # through pgmq.read
@example(fifo=False, limit=2, with_dlq=True, operations=[("send", 6), ("receive", 0, 4, 0), ("receive", 0, 4, 0),
                                                         ("receive", 2, 6, 30)])  # grouped
@example(fifo=True, limit=1, with_dlq=True, operations=[("send", 6), ("receive", 0, 4, 0), ("receive", 2, 4, 30),
                                                        ("retry_attempt",)])
def test_no_claim_path_delivers_a_message_past_max_receive_count(sql, fifo, limit, with_dlq, operations):
    _run_queue_scenario(sql, fifo, limit, with_dlq, operations)



# -- partitioned queues (Queen) -------------------------------------------------------------

PQ_OPERATION = st.one_of(
    st.tuples(st.just("push"), st.integers(1, 6), st.sampled_from(["p0", "p1"])),
    st.tuples(st.just("pop"), st.integers(1, 6), st.sampled_from([None, "p0", "p1"])),
    st.tuples(st.just("ack"), st.integers(0, 2**8 - 1), st.sampled_from(["completed", "failed", "retry", "dlq"])),
    st.tuples(st.just("expire")),
)


def _pq(conn: psycopg.Connection, function: str, arg: object) -> object:
    return conn.execute(f"SELECT conveyor.{function}(%s::jsonb)".encode(), (Jsonb(arg),)).fetchone()[0]


def _run_partitioned_scenario(conn: psycopg.Connection, retry_limit: int, operations: list[tuple]) -> None:
    queue = f"pq{uuid.uuid4().hex[:8]}"
    conn.execute("SELECT conveyor.pqueue_configure(%s, jsonb_build_object('retryLimit', %s))", (queue, retry_limit))
    failures: Counter[str] = Counter()  # transaction id -> failed acks accepted
    finished: set[str] = set()  # completed or dead-lettered
    last: list[dict] = []
    n = 0
    for op in operations:
        if op[0] == "push":
            _pq(conn, "pqueue_push", [{"queue": queue, "partition": op[2], "payload": n + i, "transactionId": f"t{n + i}"}
                                      for i in range(op[1])])
            n += op[1]
        elif op[0] == "pop":
            request = {"queue": queue, "batch": op[1]} | ({"partition": op[2]} if op[2] else {})
            got = _pq(conn, "pqueue_pop", request)["messages"]
            last = got or last
            for m in got:
                assert m["transactionId"] not in finished, f"{m['transactionId']} delivered after it was finished"
                assert m["retryCount"] == failures[m["transactionId"]] <= retry_limit, m
        elif op[0] == "ack":
            chosen = [m for k, m in enumerate(last) if op[1] >> k & 1]
            answers = _pq(conn, "pqueue_ack", [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                                "leaseId": m["leaseId"], "status": op[2]} for m in chosen])
            for m, a in zip(chosen, answers, strict=True):
                if not a["success"]:
                    continue
                if a["outcome"] in ("retry", "dlq") and op[2] != "dlq":
                    failures[m["transactionId"]] += 1
                if a["outcome"] in ("completed", "dlq"):
                    finished.add(m["transactionId"])
                assert (a["outcome"] == "dlq") == (op[2] == "dlq" or failures[m["transactionId"]] > retry_limit)
        else:
            conn.execute("UPDATE conveyor.partition_cursors x SET lease_expires_at = clock_timestamp() "
                         "FROM conveyor.pqueues q WHERE q.id = x.queue_id AND q.name = %s AND x.lease_id IS NOT NULL",
                         (queue,))
    dead = {r[0]: r[1] for r in _rows(conn, "SELECT d.transaction_id, d.failures FROM conveyor.partition_dead_letters d "
                                            "JOIN conveyor.pqueues q ON q.id = d.queue_id WHERE q.name = %s", (queue,))}
    assert all(count <= retry_limit + 1 for count in dead.values())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(retry_limit=st.integers(0, 2), operations=st.lists(PQ_OPERATION, min_size=1, max_size=25))
def test_a_partitioned_queue_delivers_no_message_past_its_retry_limit(sql, retry_limit, operations):
    _run_partitioned_scenario(sql, retry_limit, operations)


def test_pgmqs_conditional_read_delivers_none_past_the_limit(sql):
    """The issue's scenario through pgmq's conditional read (pgmq dialect 0005's own claim):
    the first candidates past the limit are dead-lettered, and the pick after them must not
    take the other expired ones again."""
    sql.execute("SELECT conveyor.queue_create('dlq')")
    sql.execute("""SELECT conveyor.queue_create('q', '{"max_receive_count": 1, "dead_letter_queue": "dlq"}')""")
    sql.execute("SELECT * FROM pgmq.send_batch('q', array_fill('{\"k\": 1}'::jsonb, ARRAY[6]))")
    read = "SELECT msg_id, read_ct FROM pgmq.read('q', 30, 4, '{\"k\": 1}'::jsonb) ORDER BY msg_id"
    assert _rows(sql, read) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    _expire(sql, "q", [1, 2, 3, 4])  # candidates 5, 6, 1, 2: 1 and 2 leave for the dead-letter queue
    assert _rows(sql, read) == [(5, 1), (6, 1)]  # and 3 and 4 are not delivered a second time
    assert _rows(sql, "SELECT count(*) FROM conveyor.messages m JOIN conveyor.queues d ON d.id = m.queue_id "
                      "WHERE d.name = 'dlq'") == [(2,)]
