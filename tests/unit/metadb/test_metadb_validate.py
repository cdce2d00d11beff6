"""The checks every repository call applies before SQL: pure functions, no database."""

from __future__ import annotations

import pytest

from triplane.metadb import InvalidInputError, PayloadTooLargeError
from triplane.metadb import validate as v
from triplane.metadb.tasks import task_changes


@pytest.mark.parametrize("bad", ["", None, 7, "x" * 129, "a\x00b"])
def test_check_id_refuses_malformed_ids(bad: object) -> None:
    with pytest.raises(InvalidInputError, match="job_id"):
        v.check_id("job_id", bad)


def test_check_id_accepts_the_longest_allowed() -> None:
    assert v.check_id("job_id", "j" * 128) == "j" * 128


def test_unknown_state_lists_the_known_ones() -> None:
    with pytest.raises(InvalidInputError, match=r"unknown state 'exploded' \(known states: \['pending'"):
        v.check_state("state", "exploded", v.TASK_STATES)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", True])
def test_times_must_be_finite_numbers(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        v.check_time("at", bad)


def test_json_size_bounds_and_refuses_non_json() -> None:
    assert v.json_size("p", {"a": [1, 2]}, 100) == len('{"a":[1,2]}')
    with pytest.raises(PayloadTooLargeError, match="at most 10"):
        v.json_size("p", {"a": "x" * 20}, 10)
    with pytest.raises(InvalidInputError, match="not JSON"):
        v.json_size("p", {"a": {1, 2}}, 100)
    with pytest.raises(InvalidInputError, match="not JSON"):
        v.json_size("p", float("nan"), 100)
    with pytest.raises(InvalidInputError, match="NUL"):
        v.json_size("p", "a\x00", 100)


def test_long_errors_are_clipped_keeping_the_head() -> None:
    clipped = v.clip_error("ValueError: bad\n" + "frame\n" * 10_000)
    assert clipped is not None and len(clipped) <= v.MAX_ERROR_CHARS
    assert clipped.startswith("ValueError: bad") and "chars cut" in clipped
    assert v.clip_error("short") == "short" and v.clip_error(None) is None


def test_task_changes_checks_every_field() -> None:
    assert task_changes("dispatched", {"attempt": 2, "node": "n1", "started_at": 3}) == {
        "state": "dispatched", "attempt": 2, "node": "n1", "started_at": 3.0}
    with pytest.raises(InvalidInputError, match=r"unknown task fields \['colour'\]"):
        task_changes("dispatched", {"colour": "red"})
    with pytest.raises(InvalidInputError, match="error_kind"):
        task_changes("failed", {"error_kind": "cosmic"})


def test_index_and_shape_are_lists_of_non_negative_ints() -> None:
    assert v.check_ints("index", (0, 3)) == [0, 3]
    for bad in ([-1], [1.5], "01", list(range(17))):
        with pytest.raises(InvalidInputError):
            v.check_ints("index", bad)
