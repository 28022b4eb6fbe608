"""Batched exact evaluation: ``models.simulate_until_done_many`` equals each run alone,
and ``tuner.objective.evaluate.evaluate_many`` (goodput searches in lockstep, rounds
batched per system) equals ``evaluate`` job by job, in one compiled program per system."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import (get_system, metrics, simulate_until_done, simulate_until_done_many,
                    trace_guard, validate_params)
from tuner.objective.capacity import HINT_STEP, capacity_search, drive
from tuner.objective.evaluate import compile_ahead, evaluate, evaluate_many
from tuner.scenario import ScenarioSpec, build_scenario

SPEC = ScenarioSpec(n_requests=120, n_slots=32, max_batch=32)


def _close(a: dict, b: dict, rel=1e-4):
    """Every numeric metric of ``a`` and ``b`` equal within float32 round-off (vmap may
    reassociate sums); NaN equals NaN."""
    bad = [k for k, v in a.items() if isinstance(v, float)
           and not (v == pytest.approx(b[k], rel=rel, abs=1e-6)
                    or (v != v and b[k] != b[k]))]
    return bad


def test_a_batch_runs_each_lane_as_if_alone():
    sc = build_scenario(SPEC)
    # lanes of very different length: all at once, and a light load (many iterations)
    scs = [sc.at_rate(math.inf), sc.at_rate(0.5), sc.at_rate(3.0)]
    system = "paged"
    opts = sc.options(system, record=True)
    p = {k: jnp.asarray(v) for k, v in
         validate_params(get_system(system), {}, sc.cfg.max_len, sc.hw).items()}
    alone = []
    for s in scs:
        x = s.inputs(system)
        st = simulate_until_done(x, s.hw, p, opts)
        alone.append({k: float(v) for k, v in metrics(st, x, opts).items()})
    assert alone[1]["iterations"] > 2 * alone[0]["iterations"]  # the lanes differ
    x = jax.tree.map(lambda *xs: jnp.stack(xs), *[s.inputs(system) for s in scs])
    pb = jax.tree.map(lambda v: jnp.stack([v] * len(scs)), p)
    ms = simulate_until_done_many(x, sc.hw, pb, opts)
    for j, a in enumerate(alone):
        got = {k: float(v[j]) for k, v in ms.items()}
        assert a["completed"] == got["completed"] == float(np.sum(sc.workload.valid))
        assert not _close(a, got), (j, _close(a, got))


def test_lockstep_searches_equal_each_search_alone():
    base = ScenarioSpec(n_requests=160, n_slots=32, max_batch=32, max_len=2048)
    scs = [build_scenario(base.replace(offset=80, n_requests=80, seed=1)).padded(160),
           build_scenario(base.replace(seed=3))]  # a held-out window and the whole slice
    jobs = [(sc, system, {}) for sc in scs for system in ("paged", "static")]
    jobs.append((scs[0], "paged", {"block_size": 64}))
    alone = [evaluate(*j, objective="goodput_rps") for j in jobs]
    with trace_guard() as traces:
        many = evaluate_many(jobs, objective="goodput_rps")
    batched = sorted(k[1].system for k in traces if k[0] == "simulate_until_done_many")
    assert batched == ["paged", "static"]  # one program per system, whatever the round
    for a, m in zip(alone, many):
        assert m["goodput_rps"] == pytest.approx(a["goodput_rps"], rel=1e-6)
        # the same bracket (its rates scale with the saturation rate: float32 round-off)
        assert m["capacity"]["bracket_rps"] == pytest.approx(a["capacity"]["bracket_rps"],
                                                             rel=1e-5)
        assert m["objective"] == pytest.approx(a["objective"], rel=1e-6)
        assert not _close(a, m)
    # the policies differ somewhere, so equal results are not a constant
    assert len({round(m["goodput_rps"], 6) for m in many}) > 1


def test_search_reads_rungs_in_order_and_bisects_like_the_sequential_one():
    truth = 5.0

    def run_at(r):
        if math.isinf(r):
            return {"slo_attainment": 0.0, "requests_per_s": 10.0, "tps": 1.0}
        return {"slo_attainment": 1.0 if r < truth else 0.5, "requests_per_s": r,
                "tps": r}

    asked = []

    def run_many(rs):
        asked.append(list(rs))
        return [run_at(r) for r in rs]

    out = drive(capacity_search(None, 1.0, rtol=0.01), run_many)
    # saturation first, then every rung in one round, then one rate per round
    assert asked[0] == [math.inf] and len(asked[1]) == 6
    assert all(len(a) == 1 for a in asked[2:])
    lo, hi = out["capacity"]["bracket_rps"]
    assert lo < truth <= hi and hi / lo <= 1.01
    # rungs above the first miss are run but not read
    assert all(float(r) < truth * 1.4 for r in out["capacity"]["rungs"])
    # one run at a time (one lane): the same result from only the runs it reads
    asked.clear()
    one = drive(capacity_search(None, 1.0, rtol=0.01, prefetch=False), run_many)
    assert all(len(a) == 1 for a in asked)
    assert one["goodput_rps"] == out["goodput_rps"]
    assert one["capacity"]["runs"] == len(one["capacity"]["rungs"]) + 1  # + saturation
    assert one["capacity"]["runs"] < out["capacity"]["runs"]


def test_search_counts_the_iterations_of_every_run_it_made():
    """``capacity.iterations``: the sum over every run (read or not) of the iterations its
    metrics report, None when a run does not report them."""
    def run_at(r):
        att = 0.0 if math.isinf(r) else (1.0 if r < 3.0 else 0.5)
        # each rate simulates a distinct number of iterations (100 at saturation)
        return {"slo_attainment": att, "requests_per_s": 10.0 if math.isinf(r) else r,
                "tps": 1.0, "iterations": 100.0 if math.isinf(r) else 1000.0 * r}

    made = []

    def run_many(rs):
        made.extend(rs)
        return [run_at(r) for r in rs]

    out = drive(capacity_search(None, 1.0, rtol=0.01), run_many)
    assert len(made) == out["capacity"]["runs"] > 2
    want = sum(run_at(r)["iterations"] for r in made)
    assert out["capacity"]["iterations"] == pytest.approx(want)

    def no_count(rs):
        return [{k: v for k, v in run_at(r).items() if k != "iterations"} for r in rs]

    assert drive(capacity_search(None, 1.0, rtol=0.01), no_count)["capacity"][
        "iterations"] is None


def _step_curve(truth):
    """Attainment 1 below ``truth`` req/s, 0.5 from it on; saturation at 10 req/s."""
    def run_at(r):
        if math.isinf(r):
            return {"slo_attainment": 0.0, "requests_per_s": 10.0, "tps": 1.0}
        return {"slo_attainment": 1.0 if r < truth else 0.5, "requests_per_s": r,
                "tps": r}
    return run_at


def _search(truth, rtol, **kw):
    """(result, the rates asked for round by round) of a one-lane search on the step
    curve crossing at ``truth``."""
    asked = []

    def run_many(rs):
        asked.append(list(rs))
        return [_step_curve(truth)(r) for r in rs]
    return drive(capacity_search(None, 1.0, rtol=rtol, prefetch=False, **kw),
                 run_many), asked


@pytest.mark.parametrize("hint", [4.7, 5.3, 0.4, 40.0])
def test_a_hinted_search_brackets_the_same_crossing(hint):
    """A search started from an estimate (near, or 8-12x off either way) brackets the
    crossing to rtol like the ladder's search; near the truth it needs fewer rounds
    and runs nothing at the ladder's low rates."""
    truth = 5.0
    ladder, first = _search(truth, 0.02)
    out, asked = _search(truth, 0.02, hint=hint)
    n_ladder = len(first)
    assert asked[0] == [pytest.approx(hint / HINT_STEP), math.inf]  # one round for both
    for res in (ladder, out):
        lo, hi = res["capacity"]["bracket_rps"]
        assert lo < truth <= hi and hi / lo <= 1.02
    assert out["capacity"]["hint_rps"] == hint
    if abs(hint / truth - 1) < 0.1:
        assert len(asked) < n_ladder, (len(asked), n_ladder)
        assert min(r for a in asked for r in a) > 0.8 * truth


def test_a_search_with_a_floor_runs_nothing_below_it():
    """With ``floor``, a policy whose crossing lies far below it is run down to the
    floor and no lower, and says so; one whose crossing is above the floor is bracketed
    as without it."""
    low, low_asked = _search(0.05, 0.02, hint=5.0, floor=1.0)
    rates = [r for a in low_asked for r in a if math.isfinite(r)]
    assert min(rates) == pytest.approx(1.0) and low["capacity"]["below_floor"]
    assert low["goodput_rps"] <= 1.0 and low["capacity"]["floor_rps"] == 1.0
    free, free_asked = _search(0.05, 0.02, hint=5.0)
    assert min(r for a in free_asked for r in a) < 0.06  # without it: down to 0.05
    assert low["capacity"]["runs"] < free["capacity"]["runs"]
    for hint in (5.3, 40.0):
        a, _ = _search(5.0, 0.02, hint=hint, floor=1.0)
        b, _ = _search(5.0, 0.02, hint=hint)
        assert a["capacity"]["bracket_rps"] == b["capacity"]["bracket_rps"]
        assert a["goodput_rps"] == b["goodput_rps"] and not a["capacity"]["below_floor"]
    with pytest.raises(ValueError, match="floor"):
        next(capacity_search(None, 1.0, hint=5.0, floor=0.0))


@pytest.mark.parametrize("hint", [0.0, -1.0, math.nan, math.inf])
def test_a_hint_that_is_no_rate_is_refused(hint):
    with pytest.raises(ValueError, match="hint"):
        next(capacity_search(None, 1.0, hint=hint))


@pytest.mark.parametrize("points", [2, 3])
def test_more_points_a_round_split_the_bracket_and_need_fewer_rounds(points):
    """``points`` rates a round: the same crossing to rtol in fewer rounds, no round
    asking for more than ``points`` rates once the first is made; on a linear curve
    the interpolated goodput is the crossing itself whatever the bracket."""
    truth = 5.0
    n_one = len(_search(truth, 0.01)[1])
    out, asked = _search(truth, 0.01, points=points)
    lo, hi = out["capacity"]["bracket_rps"]
    assert lo < truth <= hi and hi / lo <= 1.01
    assert len(asked) < n_one
    assert all(len(a) <= points for a in asked[2:])
    assert max(len(a) for a in asked[2:]) == points  # the bisection uses them

    def linear(r):
        if math.isinf(r):
            return {"slo_attainment": 0.0, "requests_per_s": 10.0, "tps": 1.0}
        return {"slo_attainment": 1.0 - 0.1 * r / truth, "requests_per_s": r, "tps": r}
    got = drive(capacity_search(None, 1.0, rtol=0.01, points=points),
                lambda rs: [linear(r) for r in rs])
    assert got["goodput_rps"] == pytest.approx(truth, rel=1e-6)


def test_compiled_ahead_programs_are_the_ones_the_evaluation_runs():
    """``compile_ahead(jobs)`` traces each system's batched programs once; the
    evaluation of the same jobs (other parameter values, a hint) then traces none."""
    base = ScenarioSpec(n_requests=96, n_slots=32, max_batch=32, max_len=2048)
    sc = build_scenario(base.replace(seed=5))
    with trace_guard(1) as traces:
        assert compile_ahead([(sc, "paged", {}), (sc, "static", {})] * 2,
                             objective="goodput_rps") == 2
        ahead = sum(v for k, v in traces.items() if k[0] == "simulate_until_done_many")
        evaluate_many([(sc, "paged", {"block_size": 64}), (sc, "static", {})] * 2,
                      objective="goodput_rps", hints=[3.0, None, None, 2.0])
    assert ahead == 2
    assert sum(v for k, v in traces.items() if k[0] == "simulate_until_done_many") == 2


def test_a_hinted_lockstep_search_equals_the_hinted_search_alone():
    base = ScenarioSpec(n_requests=96, n_slots=32, max_batch=32, max_len=2048)
    sc = build_scenario(base.replace(seed=6))
    jobs = [(sc, "paged", {}), (sc, "paged", {"block_size": 64})]
    hints = [2.0, 9.0]
    many = evaluate_many(jobs, objective="goodput_rps", hints=hints)
    for (s, system, p), h, m in zip(jobs, hints, many):
        a = evaluate(s, system, p, objective="goodput_rps", hint=h)
        assert m["goodput_rps"] == pytest.approx(a["goodput_rps"], rel=1e-6)
        assert m["capacity"]["bracket_rps"] == pytest.approx(a["capacity"]["bracket_rps"])
        assert m["capacity"]["hint_rps"] == h


@pytest.mark.parametrize("truth", [3.0, 4.9, 5.2, 9.0])
def test_a_search_started_from_a_known_run_brackets_the_same_crossing(truth):
    """A run already made at ``r`` (a screen's) starts the search: the first rungs lie
    on the side of ``r`` its attainment says the crossing is, ``r`` is never run again,
    the crossing is bracketed to rtol as without it, and the known run is not counted
    in the search's runs or iterations."""
    r0 = 5.0
    run_at = _step_curve(truth)
    plain, _ = _search(truth, 0.02, hint=4.0)
    out, asked = _search(truth, 0.02, hint=4.0, known={r0: {**run_at(r0),
                                                             "iterations": 1e9}})
    rates = [r for a in asked for r in a]
    assert r0 not in rates
    lo, hi = out["capacity"]["bracket_rps"]
    assert lo < truth <= hi and hi / lo <= 1.02
    assert out["goodput_rps"] == pytest.approx(plain["goodput_rps"], rel=0.02)
    assert out["capacity"]["runs"] == len(rates) and out["capacity"]["known_runs"] == 1
    assert out["capacity"]["iterations"] is None  # the step curve's runs say none
    h = HINT_STEP
    first = [r for r in asked[0] if math.isfinite(r)]
    if truth > r0:  # met at r0: upwards from it
        assert first == [pytest.approx(r0 * h * h)]
    else:  # missed at r0; the hint's bracket lies below it: the hint's rungs first
        assert first == [pytest.approx(4.0 / h)]
        assert len(plain["capacity"]["rungs"]) >= len(rates) - 1


def test_known_runs_cost_nothing_and_bad_ones_are_refused():
    """The iterations a search reports are those of the runs it made; a known run at a
    rate that is no rate, known runs beside a given ladder, or known runs without the
    attainment the search reads, are refused."""
    def run_at(r):
        m = _step_curve(4.0)(r)
        return {**m, "iterations": 10.0 if math.isfinite(r) else 1.0}

    made = []

    def run_many(rs):
        made.extend(rs)
        return [run_at(r) for r in rs]
    out = drive(capacity_search(None, 1.0, rtol=0.02, prefetch=False,
                                known={5.0: {**run_at(5.0), "iterations": 1e6}}),
                run_many)
    assert out["capacity"]["iterations"] == pytest.approx(
        sum(run_at(r)["iterations"] for r in made))
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="known run rates"):
            next(capacity_search(None, 1.0, known={bad: run_at(1.0)}))
    with pytest.raises(ValueError, match="no rates"):
        next(capacity_search([1.0, 2.0], 1.0, known={5.0: run_at(5.0)}))
    with pytest.raises(ValueError, match="lack slo_attainment_expected:"):
        next(capacity_search(None, 1.0, expected=True, known={5.0: run_at(5.0)}))
    with pytest.raises(ValueError, match="lack slo_attainment:"):
        next(capacity_search(None, 1.0, known={5.0: {"requests_per_s": 1.0}}))
    with pytest.raises(ValueError, match="known runs"):
        evaluate_many([(None, "paged", {})], known=[None, None])
