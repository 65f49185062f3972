"""The Fuser on its own: batching under load, answers per request, error isolation."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import errors
from conveyor.server.fusion import BatchPolicy, Fuser, Static, Vegas


class Recorder:
    """A fake SQL call that records its batches (the Fuser is pure asyncio)."""

    def __init__(self, delay: float = 0.01) -> None:
        self.calls: list[list[list[int]]] = []
        self.delay = delay

    async def __call__(self, key: str, requests):
        self.calls.append(list(requests))
        await asyncio.sleep(self.delay)
        if any(-1 in r for r in requests):
            raise errors.InvalidInput("negative")
        return [[x * 10 for x in r] for r in requests]


async def test_idle_lane_runs_inline_one_call_per_request():
    run = Recorder()
    fuser = Fuser(run, max_inflight=2, size=len)
    assert await fuser.submit("q", [1]) == [10]
    assert await fuser.submit("q", [2, 3]) == [20, 30]
    assert run.calls == [[[1]], [[2, 3]]]


async def test_concurrent_requests_fuse_and_each_gets_its_own_answer():
    run = Recorder()
    fuser = Fuser(run, max_inflight=1, size=len)
    results = await asyncio.gather(*(fuser.submit("q", [i, i]) for i in range(50)))
    assert results == [[i * 10, i * 10] for i in range(50)]
    assert len(run.calls) < 5, "50 concurrent requests took a handful of calls"
    assert sum(len(c) for c in run.calls) == 50


async def test_batches_respect_max_batch_and_keys_are_separate():
    run = Recorder()
    fuser = Fuser(run, max_inflight=1, max_batch=10, size=len)
    await asyncio.gather(*(fuser.submit(f"q{i % 2}", [i] * 3) for i in range(20)))
    for call in run.calls:
        assert sum(len(r) for r in call) <= 10 or len(call) == 1


async def test_bad_input_fails_only_the_culprit():
    run = Recorder()
    fuser = Fuser(run, max_inflight=1, size=len)
    blocker = asyncio.create_task(fuser.submit("q", [0]))  # occupies the slot
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(fuser.submit("q", [v])) for v in (1, -1, 2)]
    await blocker
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert done[0] == [10] and done[2] == [20]
    assert isinstance(done[1], errors.InvalidInput)


async def test_other_errors_reach_every_request_of_the_batch():
    async def broken(key, requests):
        await asyncio.sleep(0.01)
        raise errors.Unavailable("down")

    fuser = Fuser(broken, max_inflight=1)
    results = await asyncio.gather(*(fuser.submit("q", i) for i in range(5)), return_exceptions=True)
    assert all(isinstance(r, errors.Unavailable) for r in results)


async def test_cancelled_caller_does_not_cancel_the_batch():
    run = Recorder(delay=0.05)
    fuser = Fuser(run, max_inflight=1, size=len)
    first = asyncio.create_task(fuser.submit("q", [1]))
    await asyncio.sleep(0)
    second = asyncio.create_task(fuser.submit("q", [2]))
    third = asyncio.create_task(fuser.submit("q", [3]))
    await asyncio.sleep(0)
    second.cancel()
    assert await first == [10] and await third == [30]
    await fuser.drain(1)
    assert [[2], [3]] in run.calls, "the cancelled request was still sent with its batch"


async def test_drain_waits_for_queued_batches():
    run = Recorder(delay=0.02)
    fuser = Fuser(run, max_inflight=1, size=len)
    tasks = [asyncio.create_task(fuser.submit("q", [i])) for i in range(10)]
    await asyncio.sleep(0)
    await fuser.drain(5)
    assert all(t.done() for t in tasks)


def test_max_inflight_must_allow_progress():
    with pytest.raises(TypeError):
        Fuser()  # type: ignore[call-arg]


async def test_pending_work_is_bounded_and_the_excess_refused_at_once():
    """Beyond max_pending units waiting (over every key), a request is refused with
    Throttled instead of queued; what was accepted is answered as usual."""
    run = Recorder(delay=0.05)
    fuser = Fuser(run, max_inflight=1, max_pending=10, size=len)
    outcomes = await asyncio.gather(*(fuser.submit(f"q{i % 2}", [i, i]) for i in range(20)),
                                    return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, errors.Throttled)]
    served = [o for o in outcomes if not isinstance(o, BaseException)]
    assert refused and len(refused) + len(served) == 20
    # two lanes run one call each inline, ten units (five requests) wait: the rest is refused
    assert len(served) == 7 and fuser._pending == 0
    assert await fuser.submit("q0", [1]) == [10]  # drained: accepted again


async def test_a_batch_policy_holds_for_the_preferred_size():
    run = Recorder(delay=0.001)
    fuser = Fuser(run, max_inflight=4, size=len, policy=BatchPolicy(preferred=5, max_hold=10.0))
    results = await asyncio.gather(*(fuser.submit("q", [i]) for i in range(5)))
    assert results == [[i * 10] for i in range(5)]
    assert run.calls == [[[0], [1], [2], [3], [4]]]  # held until five waited, then one call


async def test_a_batch_policy_sends_what_waits_after_the_maximum_hold():
    run = Recorder(delay=0.001)
    fuser = Fuser(run, max_inflight=4, size=len, policy=BatchPolicy(preferred=100, max_hold=0.05))
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.gather(fuser.submit("q", [1]), fuser.submit("q", [2])) == [[10], [20]]
    assert 0.04 <= loop.time() - started < 1.0
    assert run.calls == [[[1], [2]]]


def test_vegas_grows_while_calls_do_not_queue_and_shrinks_when_they_do():
    vegas = Vegas(current=2, highest=10)
    for _ in range(20):
        vegas.observe(0.010)  # every call as fast as the fastest: nothing queues
    assert vegas.limit() == 10
    for _ in range(20):
        vegas.observe(0.040)  # four times the base round trip: calls wait in the database
    assert vegas.limit() < 10
    assert Static(3).limit() == 3


async def test_vegas_controls_calls_in_flight_per_key():
    run = Recorder(delay=0.005)
    fuser = Fuser(run, size=len, concurrency=lambda: Vegas(current=1, highest=4))
    await asyncio.gather(*(fuser.submit("q", [i]) for i in range(200)))
    assert 1 <= fuser.controller("q").limit() <= 4
