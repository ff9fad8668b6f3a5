"""The rules of handler steps (atlantis/steps.py), each refusal a clear StepError with the
kind its attempt fails with: names, values, durations and wake times, and the caps. Their
effect in a real attempt (the job's error kind and message) is tests/test_handler_steps.py's.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from atlantis.errors import StepError
from atlantis.limits import MAX_STEP_BYTES, MAX_STEP_RECORDS
from atlantis.steps import (
    _Rules,
    check_name,
    encode,
    sleep_seconds,
    wake_time,
)
from atlantis.store.steps import Fence, Opened


def _refused(call: object, *args: object) -> StepError:
    assert callable(call)
    with pytest.raises(StepError) as info:
        call(*args)
    return info.value


@pytest.mark.parametrize("name", ["", "x" * 201, "a\x00b", 7, None])
def test_a_bad_step_name_is_refused(name: object) -> None:
    error = _refused(check_name, name)
    assert "a handler step's name must be a non-empty string of at most 200 characters" in str(error)
    assert error.kind == "steps"


def test_a_good_step_name_is_kept() -> None:
    assert check_name("page-7") == "page-7"


@pytest.mark.parametrize(("value", "why"), [
    ({1, 2}, "is not JSON-serializable"),
    ("x" * 70_000, "bytes"),
    ({"ratio": math.inf}, "NaN or an infinity"),
])
def test_a_value_that_cannot_be_recorded_is_refused_with_kind_result(value: object,
                                                                    why: str) -> None:
    error = _refused(encode, "page-1", value)
    assert str(error).startswith("handler step 'page-1': its value cannot be recorded: ")
    assert why in str(error) and error.kind == "result"


def test_values_are_recorded_as_json_and_none_as_null() -> None:
    assert encode("a", None) == "null"
    assert encode("a", {"n": 1, "xs": (1, 2)}) == '{"n":1,"xs":[1,2]}'


@pytest.mark.parametrize("duration", [-1, math.nan, math.inf, -math.inf, timedelta(seconds=-2)])
def test_a_sleep_of_no_finite_duration_is_refused(duration: object) -> None:
    error = _refused(sleep_seconds, duration)
    assert "ctx.sleep needs a finite duration of at least 0 seconds" in str(error)


@pytest.mark.parametrize("duration", ["5", True, None])
def test_a_sleep_of_no_number_is_refused(duration: object) -> None:
    assert "ctx.sleep needs a timedelta or a number of seconds" in str(
        _refused(sleep_seconds, duration))


def test_sleep_durations_are_seconds() -> None:
    assert sleep_seconds(timedelta(minutes=2)) == 120.0
    assert sleep_seconds(0) == 0.0


def test_a_naive_wake_time_is_refused() -> None:
    error = _refused(wake_time, datetime(2030, 1, 1))
    assert "ctx.sleep_until needs a datetime with a time zone" in str(error)
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert wake_time(when) is when


def _rules(count: int, size: int) -> _Rules:
    rules = _Rules(Fence(1, "00000000-0000-0000-0000-000000000000", 1), "postgresql:///x")
    rules.loaded(Opened("ok", []), "first")
    rules.count, rules.bytes = count, size
    return rules


def test_the_caps_on_a_jobs_records_are_refused_with_kind_result() -> None:
    error = _refused(_rules(MAX_STEP_RECORDS, 0).room, "page-1", "1")
    assert "the job already holds 100000 step records, the most a job may hold" in str(error)
    assert error.kind == "result"
    error = _refused(_rules(0, MAX_STEP_BYTES - 1).room, "page-1", "12")
    assert "the job's step records would pass 64 MiB in all" in str(error)
    _rules(MAX_STEP_RECORDS - 1, MAX_STEP_BYTES - 2).room("page-1", "12")  # just fits


def test_a_name_used_twice_in_one_run_is_refused_naming_it() -> None:
    rules = _rules(0, 0)
    rules.begin("page-1")
    error = _refused(rules.begin, "page-1")
    assert "handler step 'page-1' was already used in this run" in str(error)


def test_no_step_runs_after_the_run_ended() -> None:
    rules = _rules(0, 0)
    rules.suspend("nap", datetime(2030, 1, 1, tzinfo=UTC))
    assert "this run has ended" in str(_refused(rules.begin, "after"))


def test_a_recorded_name_run_as_another_kind_is_refused() -> None:
    rules = _rules(0, 0)
    rules.loaded(Opened("ok", [("nap", "sleep", '{"until": "2030-01-01T00:00:00+00:00"}')]),
                 "first")
    error = _refused(rules.recorded, "nap", "step")
    assert "'nap' was recorded by ctx.sleep and is now run by ctx.run_step" in str(error)


def test_no_step_runs_inside_a_transaction_step() -> None:
    rules = _rules(0, 0)
    rules.inside = "page-1"
    error = _refused(rules.begin, "nested")
    assert "handler step 'nested' inside transaction step 'page-1': steps do not nest" in str(
        error)


@pytest.mark.parametrize(("held", "error"), [("lost", "LeaseLost"), ("missing", "StepError")])
def test_a_run_that_does_not_hold_its_job_reads_no_record(held: str, error: str) -> None:
    rules = _Rules(Fence(1, "00000000-0000-0000-0000-000000000000", 1), "postgresql:///x")
    with pytest.raises(BaseException) as info:
        rules.loaded(Opened(held, []), "first")
    assert type(info.value).__name__ == error and rules.found is None
