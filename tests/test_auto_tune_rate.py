"""tuner/search/auto_tune_rate.py: vLLM auto_tune's rate rule (every request at once,
then int(throughput) + 1 req/s down by 1 until the requirement is met) and the setting
it keeps, against stand-in attainment curves whose answers are known by hand."""

import math

import pytest

from tuner.objective.capacity import drive
from tuner.search.auto_tune_rate import auto_tune_pick, auto_tune_rates, rate_search


def _curve(saturation: float, crossing: float | None):
    """A setting whose run with every request at once finishes ``saturation`` req/s and
    whose attainment meets 0.9 at or below ``crossing`` req/s (never: None); each run
    simulates 10 iterations, and the throughput at a rate is 0.9 of it."""
    def metrics(r):
        ok = crossing is not None and r <= crossing
        return {"slo_attainment": 0.95 if ok else 0.5,
                "requests_per_s": saturation if math.isinf(r) else 0.9 * r,
                "iterations": 10.0}
    return metrics


def _drive(metrics):
    """The search's result and every rate it asked for, in order."""
    asked = []

    def run_many(rs):
        asked.extend(rs)
        return [metrics(r) for r in rs]
    return drive(rate_search(), run_many), asked


def test_the_rate_steps_down_by_one_from_the_truncated_throughput_plus_one():
    res, asked = _drive(_curve(6.7, 4.3))
    assert asked == [math.inf, 7.0, 6.0, 5.0, 4.0]  # int(6.7) + 1 = 7, then down by 1
    assert res["request_rate"] == 4.0 and res["met"]
    assert res["throughput_rps"] == pytest.approx(3.6)  # the run at 4 req/s
    assert res["runs"] == 5 and res["iterations"] == 50.0
    assert res["rungs"]["4"] == 0.95 and res["rungs"]["5"] == 0.5


def test_every_request_at_once_within_the_requirement_is_one_run():
    res, asked = _drive(_curve(6.7, math.inf))
    assert asked == [math.inf] and res["request_rate"] == math.inf and res["met"]
    assert res["throughput_rps"] == 6.7


def test_no_rate_down_to_one_meets_it():
    res, asked = _drive(_curve(2.2, None))
    assert asked == [math.inf, 3.0, 2.0, 1.0]
    assert res["request_rate"] is None and not res["met"] and res["runs"] == 4


def test_the_kept_setting_is_the_first_with_the_highest_throughput_among_those_met():
    curves = [_curve(6.7, 4.3), _curve(9.1, None), _curve(8.0, 5.5), _curve(8.2, 5.2)]
    res = auto_tune_rates(list(range(4)), lambda i, rs: [curves[i](r) for r in rs])
    assert [r["request_rate"] for r in res] == [4.0, None, 5.0, 5.0]
    assert auto_tune_pick(res) == 2  # 5 req/s ties with setting 3: the first kept
    assert auto_tune_pick([res[1]]) is None
