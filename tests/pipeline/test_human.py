"""What the pipeline's commands print, for people (issue 29, item 13): `4 rows in 4
file(s) in 13.2s (0 rows/s)` and `p50 140768.078 ms` were the before."""

from __future__ import annotations

import pytest

from conveyor.pipeline import human


@pytest.mark.parametrize("n, seconds, text", [
    (4, 13.2, "0.30 rows/s"), (4, 1.0, "4.0 rows/s"), (200_000, 1.6, "125,000 rows/s"), (0, 2.0, "0 rows/s"),
    (1, 0.0, "0 rows/s")])
def test_a_rate_never_rounds_to_zero_when_something_was_done(n, seconds, text):
    assert human.rate(n, seconds) == text


@pytest.mark.parametrize("ms, text", [
    (3.25, "3.2 ms"), (85.4, "85 ms"), (1_400, "1.4 s"), (140_768.078, "2 min 21 s"), (3 * 3_600_000 + 300_000, "3 h 05 min"),
    (2 * 86_400_000 + 4 * 3_600_000, "2 d 4 h")])
def test_durations_read_in_the_unit_that_fits(ms, text):
    assert human.milliseconds(ms) == text


def test_counts_agree_with_their_number():
    assert [human.count(1, "row"), human.count(4, "file"), human.count(1_234, "micro-batch", "micro-batches")] == [
        "1 row", "4 files", "1,234 micro-batches"]
