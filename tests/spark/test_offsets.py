"""Per-partition offsets of a partitioned queue (conveyor.spark.offsets) and the packing of
position ranges into Spark partitions: pure functions, no Spark and no database."""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.spark import offsets, slices

BOTH = (offsets.EARLIEST, offsets.LATEST)


def test_starting_offsets_words_and_json():
    heads = {"a": 10, "b": 4, "c": 0}
    earliest = offsets.parse("earliest", "q", "startingOffsets", default=offsets.EARLIEST, allowed=BOTH)
    latest = offsets.parse(" LATEST ", "q", "startingOffsets", default=offsets.EARLIEST, allowed=BOTH)
    assert offsets.resolve(earliest, heads, "q", "x") == {"a": 0, "b": 0, "c": 0}
    assert offsets.resolve(latest, heads, "q", "x") == {"a": 10, "b": 4, "c": 0}
    named = offsets.parse('{"q": {"a": 7, "b": -1}}', "q", "startingOffsets", default=offsets.EARLIEST, allowed=BOTH)
    assert named == offsets.Spec(offsets.EARLIEST, (("a", 7), ("b", offsets.LATEST)))
    # partitions not named start at their beginning, as new partitions do
    assert offsets.resolve(named, heads, "q", "x") == {"a": 7, "b": 4, "c": 0}


@pytest.mark.parametrize(("text", "allowed", "message"), [
    ("latest", (offsets.EARLIEST,), "cannot be latest here"),
    ("soon", BOTH, "must be earliest or latest or a JSON object"),
    ('{"other": {"a": 1}}', BOTH, r'a JSON object \{"q": \{"<partition>": <position>\}\}'),
    ('{"q": {"a": 1}, "r": {}}', BOTH, "a JSON object"),
    ('{"q": [1]}', BOTH, "a JSON object"),
    ('{"q": {"a": 1.5}}', BOTH, "position of partition 'a' must be a whole number"),
    ('{"q": {"a": true}}', BOTH, "must be a whole number"),
    ('{"q": {"a": -3}}', BOTH, "must be a whole number >= 0 or -2 or -1, got -3"),
    ('{"q": {"a": -1}}', (offsets.EARLIEST,), "must be a whole number >= 0 or -2, got -1"),
])
def test_bad_specs_are_refused(text, allowed, message):
    with pytest.raises(errors.InvalidInput, match=message):
        offsets.parse(text, "q", "startingOffsets", default=offsets.EARLIEST, allowed=allowed)


def test_resolve_refuses_positions_the_queue_does_not_have():
    ahead = offsets.Spec(offsets.EARLIEST, (("a", 11),))
    with pytest.raises(errors.InvalidInput, match="partition 'a' of 'q' has no message 11 yet"):
        offsets.resolve(ahead, {"a": 10}, "q", "startingOffsets")
    with pytest.raises(errors.InvalidInput, match="names partition 'z', which the partitioned queue 'q' does not"):
        offsets.resolve(offsets.Spec(offsets.EARLIEST, (("z", 1),)), {"a": 10}, "q", "startingOffsets")


def test_offsets_round_trip_in_a_fixed_order_and_refuse_other_queues():
    made = offsets.offset("q", {"b": 2, "a": 1})
    assert list(made["q"]) == ["a", "b"]
    assert offsets.positions(made, "q") == {"a": 1, "b": 2}
    for wrong in ({"r": {"a": 1}}, {"q": {"a": "1"}}, {"q": {"a": -1}}, {"q": 3}, {"stream": "q", "tick": 1}):
        with pytest.raises(errors.InvalidInput, match="belongs to another query"):
            offsets.positions(wrong, "q")


def test_a_checkpoint_ahead_of_the_queue_is_refused():
    offsets.check({"a": 5}, {"a": 5, "b": 1}, "q")
    with pytest.raises(errors.InvalidInput, match=r"has only 3 messages.*new checkpoint location"):
        offsets.check({"a": 5}, {"a": 3}, "q")
    with pytest.raises(errors.InvalidInput, match="no longer exists"):
        offsets.check({"a": 5}, {"b": 9}, "q")


def test_limit_spreads_by_what_each_partition_has_waiting():
    start = {"a": 0, "b": 10, "c": 0}
    end = {"a": 100, "b": 60, "c": 10, "d": 1}
    assert offsets.limit(start, end, None) == end
    assert offsets.limit(start, end, 1000) == end
    # 161 waiting, 40 allowed: 100 -> 24.8 -> 24, 50 -> 12.4 -> 12, 10 -> 2.4 -> 2, 1 -> 0.25 -> 1
    assert offsets.limit(start, end, 40) == {"a": 24, "b": 22, "c": 2, "d": 1}
    # a share under one message still moves its partition: nothing starves
    assert offsets.limit({"a": 0, "b": 0}, {"a": 1000, "b": 1}, 10) == {"a": 9, "b": 1}


def test_pack_cuts_and_groups_ranges_by_message_count():
    assert slices.pack([], 4) == []
    assert slices.pack([(1, 5, 5)], 4) == []
    assert slices.pack([(1, 0, 100)], 4) == [[(1, 0, 25)], [(1, 25, 50)], [(1, 50, 75)], [(1, 75, 100)]]
    # many small partitions share a slice; a big one is cut where a slice is full
    assert slices.pack([(1, 0, 3), (2, 10, 12), (3, 0, 7)], 3) == [
        [(1, 0, 3), (2, 10, 11)], [(2, 11, 12), (3, 0, 3)], [(3, 3, 7)]]
    packed = slices.pack([(i, 0, i) for i in range(1, 30)], 4)
    assert len(packed) == 4
    covered = sorted((pid, s) for group in packed for pid, a, b in group for s in range(a + 1, b + 1))
    assert covered == sorted((i, s) for i in range(1, 30) for s in range(1, i + 1))
