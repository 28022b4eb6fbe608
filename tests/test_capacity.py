"""Capacity objectives: goodput from a rate ladder (relaxed and exact), exact bisection,
the SLO attainment of truncated runs, and the SLOs a scenario derives."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import make_options
from tuner.objective.capacity import TARGET, exact_capacity, goodput_from, ladder_metrics
from tuner.objective.evaluate import evaluate, run
from tuner.objective.objectives import parse_objective
from tuner.objective.problem import Ladder, measure
from tuner.scenario import ScenarioSpec, build_scenario

SPEC = ScenarioSpec(n_requests=120, n_slots=32, max_batch=32)


def test_goodput_is_the_first_crossing_of_a_falling_curve():
    rates = np.array([1.0, 2.0, 4.0, 8.0])
    att = np.array([1.0, 0.95, 0.85, 0.2])
    # crossing between 2 and 4: 2 + (0.95 - 0.9) / (0.95 - 0.85) * 2 = 3
    assert float(goodput_from(rates, att)) == pytest.approx(3.0, rel=1e-6)
    assert float(goodput_from(rates, np.ones(4))) == pytest.approx(8.0)  # never limited
    # below the first rung: interpolated from (0, 1)
    assert float(goodput_from(rates, np.array([0.8, 0.5, 0.2, 0.1]))) == pytest.approx(0.5)
    # continuous in the attainments: raising rung 3 (rate 4) from 0.85 towards the
    # target slides the crossing towards rate 4 (a step function would jump there):
    # 0.899: [0, 2] counts whole, [2, 4] for 0.05 / (0.95 - 0.899) of its width ->
    # 2 + 2 * 0.05 / 0.051 = 3.96078; 0.9 exactly: [0, 4] whole, [4, 8] not at all ->
    # 4.0; 0.901: [4, 8] counts 0.001 / (0.901 - 0.2) of its width -> 4.00571
    for a3, want in ((0.899, 2 + 2 * 0.05 / 0.051), (0.9, 4.0),
                     (0.901, 4 + 4 * 0.001 / 0.701)):
        a2 = att.copy()
        a2[2] = a3
        assert float(goodput_from(rates, a2)) == pytest.approx(want, rel=1e-5), a3


def test_exact_bisection_finds_a_known_crossing():
    truth = 7.3
    calls = []

    def run_at(r):
        calls.append(r)
        if math.isinf(r):
            return {"slo_attainment": 0.0, "requests_per_s": 9.0, "tps": 900.0}
        return {"slo_attainment": float(np.clip(1.0 - 0.1 * (r / truth) ** 8, 0, 1)),
                "requests_per_s": r, "tps": 100 * r}

    out = exact_capacity(run_at, [1.0, 2.0, 4.0, 8.0, 16.0], nominal_rps=2.0, rtol=0.01)
    assert out["goodput_rps"] == pytest.approx(truth, rel=0.01)
    assert out["goodput_scale"] == pytest.approx(out["goodput_rps"] / 2.0)
    assert out["saturation_rps"] == 9.0 and out["capacity"]["limited"]
    lo, hi = out["capacity"]["bracket_rps"]
    assert lo <= truth <= hi and hi / lo <= 1.01
    # a curve that never falls below the target is reported as not limited
    out = exact_capacity(lambda r: {"slo_attainment": 1.0, "requests_per_s": 5.0,
                                    "tps": 5.0}, [1.0, 2.0], nominal_rps=1.0)
    assert not out["capacity"]["limited"] and out["goodput_rps"] >= 2.0


def test_ladder_rungs_match_exact_runs_and_relaxed_converges():
    sc = build_scenario(SPEC)
    obj = parse_objective("goodput_rps")
    ref = evaluate(sc, "static", {}, objective="goodput_rps")
    g = ref["goodput_rps"]
    rates = np.geomspace(0.5 * g, 1.5 * g, 4).astype(np.float32)
    opts = make_options("static")
    x = sc.inputs("static")
    n_steps = 2048  # every rung runs to completion
    m0 = measure({}, x, sc.hw, 0.0, Ladder(jnp.asarray(rates), jnp.float32(sc.nominal_rps)),
                 opts=opts, n_steps=n_steps, objective=obj)
    att = [run(sc.at_rate(float(r)), "static", {})["slo_attainment"] for r in rates]
    want = float(goodput_from(rates, np.array(att, np.float32)))
    assert float(m0["goodput_rps"]) == pytest.approx(want, rel=1e-5)
    # the ladder estimate brackets the bisected goodput within one rung
    assert rates[0] / 1.5 <= float(m0["goodput_rps"]) <= rates[-1]
    sat = run(sc.at_rate(math.inf), "static", {})
    assert float(m0["saturation_tps"]) == pytest.approx(sat["tps"], rel=1e-5)
    # relaxed attainments approach the exact ones as the temperature falls
    relaxed = jax.jit(lambda t: ladder_metrics(lambda xi: _sim(xi, sc, opts, t, n_steps),
                                               x, rates, sc.nominal_rps)["goodput_rps"])
    gaps = [abs(float(relaxed(jnp.float32(t))) - float(m0["goodput_rps"]))
            for t in (0.3, 0.003)]
    assert gaps[-1] <= gaps[0] + 1e-6 and gaps[-1] < 0.05 * float(m0["goodput_rps"])


def _sim(x, sc, opts, t, n_steps):
    from models import metrics, simulate
    st, _ = simulate(x, sc.hw, {}, t, opts, n_steps)
    return metrics(st, x, opts)


def test_truncated_runs_judge_only_requests_that_are_due():
    sc = build_scenario(SPEC).at_rate(1.0)  # a light load
    opts = make_options("static")
    x = sc.inputs("static")
    full = run(sc, "static", {})
    assert full["unserved"] == 0
    short = {k: float(v) for k, v in jax.jit(lambda x: _sim(x, sc, opts, 0.0, 512))(
        x).items()}
    assert short["completed"] > 0
    assert short["unserved"] > 0  # cut short
    for k in ("slo_attainment", "ttft_slo_attainment", "tpot_slo_attainment"):
        assert 0.0 <= short[k] <= 1.0
    # at a light load (nearly) every request meets its SLOs: a truncated run must not
    # count the requests it never reached as misses
    assert full["slo_attainment"] > 0.95
    assert short["slo_attainment"] == pytest.approx(full["slo_attainment"], abs=0.05)
    assert full["slo_attainment"] <= min(full["ttft_slo_attainment"],
                                         full["tpot_slo_attainment"]) + 1e-6


def test_scenario_slos_are_a_multiple_of_uncontended_latency():
    sc = build_scenario(SPEC)
    s = sc.slo
    assert s["ttft_s"] == pytest.approx(25 * s["uncontended_ttft_s"])
    assert s["tpot_s"] == pytest.approx(25 * s["uncontended_tpot_s"])
    assert 0 < s["uncontended_tpot_s"] < s["uncontended_ttft_s"]
    assert float(sc.cfg.ttft_slo_s) == pytest.approx(s["ttft_s"], rel=1e-6)
    given = build_scenario(SPEC.replace(ttft_slo_s=2.0, slo_scale=10.0)).slo
    assert given["ttft_s"] == 2.0 and given["ttft_source"] == "given"
    assert given["tpot_s"] == pytest.approx(10 * s["uncontended_tpot_s"])
    for bad in ({"ttft_slo_s": -1.0}, {"tpot_slo_s": float("nan")}, {"slo_scale": 0.0}):
        with pytest.raises(ValueError, match="slo"):
            build_scenario(SPEC.replace(**bad))


def test_goodput_target_and_rate_rescaling_keep_the_pattern():
    sc = build_scenario(SPEC)
    fast = sc.at_rate(2 * sc.nominal_rps)
    a = np.asarray(sc.workload.arrival_s)[np.asarray(sc.workload.valid)]
    b = np.asarray(fast.workload.arrival_s)[np.asarray(fast.workload.valid)]
    np.testing.assert_allclose(b, a / 2, rtol=1e-6)
    assert TARGET == 0.9


def test_goodput_gradient_in_the_attainments_matches_finite_differences():
    """Goodput is piecewise linear in the rungs' attainments: its gradient (what a
    relaxed run's soft attainments pass on to the policy) is that slope."""
    rates = jnp.asarray([1.0, 2.0, 4.0, 8.0])
    att = jnp.asarray([0.99, 0.95, 0.85, 0.3])
    g = jax.grad(lambda a: goodput_from(rates, a))(att)
    h = 1e-3
    for k in range(4):
        e = jnp.zeros(4).at[k].set(h)
        fd = (goodput_from(rates, att + e) - goodput_from(rates, att - e)) / (2 * h)
        assert float(g[k]) == pytest.approx(float(fd), rel=1e-2, abs=1e-3), k
    # only the two rungs around the crossing matter, and more attainment means more
    assert float(g[1]) > 0 and float(g[2]) > 0 and float(g[0]) == float(g[3]) == 0.0


def test_made_up_arrivals_and_overload_are_warned(tmp_path):
    from tuner.search.fitting import FitSettings, build_problem

    path = tmp_path / "lengths.csv"
    rows = "\n".join(f"{100 + i},{20 + i % 7}" for i in range(80))
    path.write_text("prompt_tokens,output_tokens\n" + rows + "\n")
    sc = build_scenario(ScenarioSpec(trace=str(path), n_slots=32, max_batch=32))
    assert len(sc.warnings) == 1 and "no arrival times" in sc.warnings[0]
    assert "Poisson" in sc.warnings[0] and "--rate" in sc.warnings[0]
    assert build_scenario(SPEC).warnings == ()  # the built-in trace has its own times
    # 32 slots cannot keep up with the built-in trace's own rate: said, not hidden
    said = []
    build_problem(SPEC, FitSettings(budget=1), warn=said.append)
    assert len(said) == 1 and "above the start policy's goodput" in said[0]
