"""gpuwarden.shared.lease: one meaning of ``held()`` — only what a replica can show."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuwarden.shared.lease import KafkaLease, LeaseBoard, MemoryLease, NoLease


async def test_no_lease_is_always_held() -> None:
    lease = NoLease()
    assert lease.held()
    await lease.start()
    await lease.stop()
    assert lease.held()


async def test_memory_lease_earliest_started_live_member_holds_it() -> None:
    board = LeaseBoard()
    a, b, never = MemoryLease(board), MemoryLease(board), MemoryLease(board)
    assert not a.held()  # not started: cannot hold it, even on a free board
    await b.start()
    await a.start()
    assert (a.held(), b.held(), never.held()) == (False, True, False)
    await b.stop()
    assert (a.held(), b.held()) == (True, False)
    await b.start()  # back at the end of the line
    await b.start()  # idempotent
    assert (a.held(), b.held()) == (True, False) and board.members == [a, b]
    await a.stop()
    await a.stop()
    assert (a.held(), b.held(), never.held()) == (False, True, False)
    await b.stop()
    assert not any(x.held() for x in (a, b, never)) and board.members == []


class FakeConsumer:
    def __init__(self) -> None:
        self.answered_ms: int | None = None
        self.assigned = True

    def last_poll_timestamp(self, tp: Any) -> int | None:
        assert self.assigned, "Partition is not assigned"
        assert (tp.topic, tp.partition) == ("p.remediator.lease.c1", 0)
        return self.answered_ms


async def test_kafka_lease_held_only_while_assigned_polling_and_answered_recently() -> None:
    now = {"t": 1_000.0}
    lease = KafkaLease("b:9092", "p.remediator.lease.c1", "g-lease", session_timeout_ms=10_000, clock=lambda: now["t"])
    assert lease.stale_after_s == 5.0
    assert not lease.held()  # never started
    consumer = FakeConsumer()
    task = asyncio.create_task(asyncio.sleep(3600))
    lease._consumer, lease._task = consumer, task
    assert not lease.held()  # a member, but not assigned the partition
    lease._owned = True
    assert not lease.held()  # assigned, but no answer from the broker yet
    consumer.answered_ms = 999_000  # 1 s ago
    assert lease.held()
    now["t"] = 1_004.0  # 5.0 s since the last answer: still within half the session timeout
    assert lease.held()
    now["t"] = 1_004.1  # the broker has been silent too long: cannot prove it holds the lease
    assert not lease.held()
    consumer.answered_ms = 1_004_000
    assert lease.held()
    consumer.assigned = False  # revoked before the listener ran
    assert not lease.held()
    consumer.assigned = True
    task.cancel()  # the membership task died
    await asyncio.gather(task, return_exceptions=True)
    assert not lease.held()
    lease._consumer = None
    lease._task = None
    await lease.stop()
    assert not lease.held() and not lease._owned
