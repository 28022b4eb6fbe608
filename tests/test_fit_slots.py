"""The slot-table cut (``tuner.objective.validation.fit_slots``): a training or held-out
window's table is cut to the requests it holds, and the training problem is the same
problem (exact value bit for bit, relaxed gradient to float rounding) on fewer slots;
held-out windows run apart from the whole slice only where the cut applies."""

import numpy as np
import pytest

from tuner.scenario import ScenarioSpec, build_scenario
from tuner.search import fitting
from tuner.objective.validation import fit_slots, held_out_windows
from tuner.search.fitting import FitSettings, build_problem

# 40 requests at twice the trace's rate on a table of 64: the cut keeps 48 slots
SPEC = ScenarioSpec(n_requests=40, n_slots=64, max_batch=64, rate=8.0)
SETTINGS = FitSettings(system="odma", objective="tps_mig", budget=1)


def test_the_table_is_cut_to_the_requests_rounded_up_to_16():
    sc = build_scenario(SPEC)
    (cut,) = fit_slots([sc])
    assert cut.cfg.n_slots == 48 and sc.cfg.n_slots == 64
    assert cut.cfg.replace(n_slots=64) == sc.cfg  # nothing else changes
    big = build_scenario(SPEC.replace(n_requests=70))
    assert fit_slots([big])[0] is big  # 70 requests need 80 slots: no cut
    # several windows: the largest decides, and every window gets the same table
    assert {s.cfg.n_slots for s in fit_slots([sc, build_scenario(
        SPEC.replace(n_requests=20))])} == {48}


@pytest.fixture(scope="module")
def problems():
    """The training problem with the cut and without it."""
    prob, _ = build_problem(SPEC, SETTINGS)
    keep = fitting.fit_slots
    fitting.fit_slots = lambda scs: scs
    try:
        full, _ = build_problem(SPEC, SETTINGS)
    finally:
        fitting.fit_slots = keep
    assert prob.n_slots < full.n_slots == 64
    return prob, full, prob.space.to_theta(prob.space.base)


def test_a_cut_scenario_runs_the_same_exact_run():
    """One exact run to completion on the cut table and on the whole one: every metric
    equal (the training problem's own check, with its relaxed gradient, is slow)."""
    from models import get_system
    from tuner.objective.evaluate import evaluate

    sc = build_scenario(SPEC)
    (cut,) = fit_slots([sc])
    params = get_system("odma").default_params(sc.cfg.max_len)
    a, b = (evaluate(x, "odma", params, objective="tps") for x in (cut, sc))
    assert a["completed"] == b["completed"] > 0
    for k in ("tps", "completed", "ttft_p99_s", "tpot_p99_s", "peak_kv_tokens"):
        assert a[k] == b[k], k


@pytest.mark.slow  # two problems' compiles; the exact run above covers the default
def test_the_cut_problem_has_the_same_exact_value(problems):
    prob, full, theta = problems
    (v, m), (vf, mf) = prob.value(theta), full.value(theta)
    assert v == vf and m["tps"] == mf["tps"]
    assert m["completed"] == mf["completed"] > 0


@pytest.mark.slow  # 30 s of compiles; the exact check above runs by default
def test_the_cut_problem_has_the_same_relaxed_gradient(problems):
    prob, full, theta = problems
    gv, g, _ = prob.grad(theta, 0.3)
    gvf, gf, _ = full.grad(theta, 0.3)
    np.testing.assert_allclose(gv, gvf, rtol=1e-5)
    assert any(np.any(np.asarray(x) != 0) for x in g.values())  # not a vanishing pair
    for k in g:
        np.testing.assert_allclose(np.asarray(g[k]), np.asarray(gf[k]), rtol=1e-4,
                                   atol=1e-7, err_msg=k)


def test_held_out_windows_run_apart_only_where_the_cut_applies():
    wins = [build_scenario(SPEC.replace(seed=s)) for s in (1, 2)]
    whole = [build_scenario(SPEC.replace(n_requests=200))]
    cut = held_out_windows(wins, whole)  # 40 requests of 64 slots: 48 slots, own shape
    assert [(sc.cfg.n_slots, sc.workload.size) for sc in cut] == [(48, 40)] * 2
    small = [build_scenario(SPEC.replace(n_slots=48, max_batch=48, seed=s))
             for s in (1, 2)]
    same = held_out_windows(small, [build_scenario(SPEC.replace(
        n_requests=200, n_slots=48, max_batch=48))])  # nothing to cut: one shape
    assert [(sc.cfg.n_slots, sc.workload.size) for sc in same] == [(48, 200)] * 2
    assert held_out_windows([], whole) == []
