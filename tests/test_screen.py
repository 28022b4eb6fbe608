"""Screened search (``tuner.search.screen``, ``tuner.fit --method screen``): what is
evaluated at which fidelity, the start's priority, and the screen's cut of the ladder.

The search is checked on stand-in problems with known objectives (no simulator: the
selection logic is what is under test; the problems it runs on are
``tuner.objective.problem``'s, tested elsewhere)."""

import math

import numpy as np
import pytest

from models import get_system, validate_params
from tuner import fit as fit_cli
from tuner.objective.space import Space
from tuner.search import screen as scr
from tuner.search.blackbox import Flat


class _Toy:
    """A problem whose exact value of theta is ``f(flat vector)``; records each call."""

    def __init__(self, space, f, rates=None, n_steps=100):
        self.space, self.f, self.rates, self.n_steps = space, f, rates, n_steps
        self.flat = Flat(space)
        self.calls = []  # ("value" | "batch", [flat vectors])

    def value(self, theta):
        x = self.flat.vec(theta)
        self.calls.append(("value", [x]))
        return self.f(x), {}

    def batch(self, thetas):
        xs = [self.flat.vec(t) for t in thetas]
        self.calls.append(("batch", xs))
        return np.array([self.f(x) for x in xs])

    def points(self):
        return [x for _, xs in self.calls for x in xs]


@pytest.fixture(scope="module")
def space():
    spec = get_system("odma")
    return Space(spec, validate_params(spec, {}, 4096))


def _pair(space, full, cheap):
    return _Toy(space, full), _Toy(space, cheap)


def test_the_screen_decides_who_is_evaluated_in_full_and_the_best_full_value_wins(space):
    flat = Flat(space)
    n = len(flat)
    target = np.full(n, 2.0)
    # full: the closer to target the better; the screen sees the first coordinate only
    full, cheap = _pair(space, lambda x: -float(np.sum((x - target) ** 2)),
                        lambda x: -abs(float(x[0]) - 2.0))
    first = [space.human(space.to_params(flat.theta(np.full(n, v)))) for v in (2.0, -3.0)]
    theta, best, screened, fulls = scr.screen(full, cheap, 4, pool=16, seed=3, box=4.0,
                                              batch=4, first=first)
    # the start in full first, then the screen's best 3, and nothing else in full
    pts = full.points()
    assert len(pts) == 4 and len(fulls) == 4
    np.testing.assert_allclose(pts[0], flat.vec(space.to_theta(dict(space.base))), atol=1e-6)
    # every candidate screened once, the first points first, in batches of 4
    cands = cheap.points()
    assert len(cands) == 16 and all(k == "batch" and len(xs) == 4 for k, xs in cheap.calls)
    np.testing.assert_allclose(cands[0], np.full(n, 2.0), atol=1e-5)
    np.testing.assert_allclose(cands[1], np.full(n, -3.0), atol=1e-5)
    assert all(np.all(np.abs(c) <= 4.0) for c in cands[2:])
    top = sorted(range(16), key=lambda i: -screened[i])[:3]
    for p, i in zip(pts[1:], top):
        np.testing.assert_allclose(p, cands[i], atol=1e-6)
    assert best == max(fulls) and best == pytest.approx(0.0, abs=1e-4)  # the first point
    np.testing.assert_allclose(flat.vec(theta), np.full(n, 2.0), atol=1e-5)
    # a candidate the screen ranks low is never evaluated in full, however good
    assert not any(np.allclose(p, cands[1]) for p in pts)


def test_the_start_wins_ties_and_a_nan_never_wins(space):
    flat_full, cheap = _pair(space, lambda x: 1.0, lambda x: float(x[0]))
    theta, best, _, fulls = scr.screen(flat_full, cheap, 3, pool=4, seed=0, batch=2)
    assert fulls == [1.0, 1.0, 1.0] and best == 1.0
    x0 = Flat(space).vec(space.to_theta(dict(space.base)))
    np.testing.assert_allclose(Flat(space).vec(theta), x0, atol=1e-6)
    nan_full, cheap = _pair(space, lambda x: math.nan if x[0] != x0[0] else 0.5,
                            lambda x: float(x[0]))
    _, best, _, fulls = scr.screen(nan_full, cheap, 3, pool=4, seed=0, batch=2)
    assert best == 0.5 and all(math.isnan(v) for v in fulls[1:])


@pytest.mark.parametrize("together", [False, True])
def test_a_start_already_measured_is_not_evaluated_again(space, together):
    """With ``start_value`` set (the goodput measured for the ladder), only the
    finalists are evaluated in full, the start's value is the one given, and it
    still wins ties; one lockstep or batches alike."""
    flat = Flat(space)
    x0 = flat.vec(space.to_theta(dict(space.base)))
    full, cheap = _pair(space, lambda x: 0.7 if x[0] > 0 else 0.2, lambda x: float(x[0]))
    full.start_value = 0.7
    if together:
        full.any_batch = True
    theta, best, _, fulls = scr.screen(full, cheap, 3, pool=6, seed=1, batch=2)
    pts = full.points()
    assert len(pts) == 2 and not any(np.allclose(p, x0) for p in pts)
    assert fulls[0] == 0.7 and len(fulls) == 3 and best == 0.7
    np.testing.assert_allclose(flat.vec(theta), x0, atol=1e-6)  # the start wins the tie
    full.start_value = 0.1  # a finalist better than the start wins
    theta, best, _, _ = scr.screen(full, cheap, 3, pool=6, seed=1, batch=2)
    assert best == 0.7 and flat.vec(theta)[0] > 0


def test_the_start_value_is_the_ladders_goodput_only_for_plain_goodput():
    """``start_value``: the mean of the start's measured goodputs for the count-based
    goodput objective; None where the objective reads what those searches did not
    keep (a constraint, the expected goodput) or nothing was measured."""
    prob = type("P", (), {})()
    prob.start_goodputs = [3.0, 5.0]
    prob.objective = scr.parse_objective("goodput_rps").with_margin(0.1)
    assert scr.start_value(prob) == 4.0
    for spec in ("goodput_rps,ttft_p99_s<=2", "goodput_expected_rps",
                 "goodput_rps+saturation_rps"):
        prob.objective = scr.parse_objective(spec)
        assert scr.start_value(prob) is None, spec
    prob.objective, prob.start_goodputs = scr.parse_objective("goodput_rps"), None
    assert scr.start_value(prob) is None


def test_a_short_last_chunk_is_screened_one_by_one_and_settings_are_checked(space):
    full, cheap = _pair(space, lambda x: float(-x[0]), lambda x: float(-x[0]))
    scr.screen(full, cheap, 2, pool=5, seed=0, batch=2)
    assert [k for k, _ in cheap.calls] == ["batch", "batch", "value"]
    with pytest.raises(ValueError, match="evals"):
        scr.screen(full, cheap, 0, pool=4)
    with pytest.raises(ValueError, match="pool 1 must hold the 2 first points"):
        scr.screen(full, cheap, 2, pool=1, first=[{}, {}])
    with pytest.raises(ValueError, match="at most 4"):  # more finalists than candidates
        scr.screen(full, cheap, 5, pool=3)


class _Sc:
    """A stand-in scenario: its rate, after ``at_rate``."""

    class spec:  # noqa: N801 (the attribute the screen reads)
        block = 64

    def __init__(self, rate=None):
        self.rate = rate

    def at_rate(self, r):
        return _Sc(r)


def test_the_screen_runs_at_the_start_goodput_a_fleet_each_at_its_own(space):
    """One row of rungs: every window screened at the start's highest goodput; a row
    per scenario (a fleet): each at its own; the full evaluation's searches start from
    each scenario's start goodput; no ladder: refused."""
    prob = _Toy(space, None, rates=np.ones(5, np.float32))
    prob.system, prob.objective = "vllm-v1", scr.parse_objective("goodput_rps")
    prob.start_goodputs = [3.7, 5.85]
    full, cheap = scr.screen_problems(prob, [_Sc(), _Sc()])
    assert [sc.rate for sc in cheap.scenarios] == [5.85, 5.85]
    assert full.hints == [3.7, 5.85] and [sc.rate for sc in full.scenarios] == [None] * 2
    assert cheap.objective.spec == "slo_attainment"
    prob.rates = np.ones((2, 5), np.float32)
    _, cheap = scr.screen_problems(prob, [_Sc(), _Sc()])
    assert [sc.rate for sc in cheap.scenarios] == [3.7, 5.85]
    prob.rates = None
    with pytest.raises(ValueError, match="rate ladder"):
        scr.screen_problems(prob, [_Sc()])


def test_the_exact_screen_and_full_values_are_runs_to_completion():
    """The screen's value of a policy is the mean over the windows of its SLO
    attainment run to completion at the screen rate, and the full value the mean of
    its exact goodputs from the start's: each equal to ``evaluate`` on that window
    alone (one lane, another code path); runs and slot-iterations are counted."""
    from tuner.objective.evaluate import evaluate
    from tuner.scenario import ScenarioSpec
    from tuner.search.fitting import FitSettings, _train_scenarios, build_problem

    specs = [ScenarioSpec(n_requests=64, n_slots=32, max_batch=32, max_len=2048,
                          offset=o) for o in (0, 64)]
    st = FitSettings(system="s3", objective="goodput_rps")
    prob, _ = build_problem(specs, st)
    scs = _train_scenarios(specs, st.crn)
    full, cheap = scr.screen_problems(prob, scs)
    theta = prob.space.to_theta(dict(prob.space.base))
    params = prob.space.human(prob.space.to_params(theta))
    at = max(prob.start_goodputs)
    want = np.mean([evaluate(sc.at_rate(at), "s3", params,
                             objective="slo_attainment")["slo_attainment"] for sc in scs])
    assert cheap.value(theta)[0] == pytest.approx(want, rel=1e-6)
    assert cheap.runs == len(scs) and cheap.cost > 0
    alone = [evaluate(sc, "s3", params, objective="goodput_rps", hint=g)
             for sc, g in zip(scs, prob.start_goodputs)]
    fresh, _ = scr.screen_problems(prob, scs)  # a screen that ran nothing
    assert fresh.value(theta)[0] == pytest.approx(
        np.mean([m["goodput_rps"] for m in alone]), rel=1e-6)
    assert fresh.runs == sum(m["capacity"]["runs"] for m in alone)
    # after the screen's run of theta: its search starts from that run, which it does
    # not pay for again; the same crossing to the search's resolution
    one = fresh.runs
    assert full.value(theta)[0] == pytest.approx(fresh.value(theta)[0], rel=0.03)
    assert full.runs < one
    # the start policy's goodput from its own search equals the ladder's measure of it
    assert np.mean([m["goodput_rps"] for m in alone]) == pytest.approx(
        prob.start_goodput, rel=0.03)


def _stub_problems(needs_record=False):
    """(full, cheap) of :func:`scr.screen_problems` on a stand-in problem: start
    goodputs 4 and 2 req/s on two windows, one slot each, theta = the parameters."""
    prob = type("P", (), {})()
    prob.space = prob.system = None
    prob.start_goodputs, prob.rates = [4.0, 2.0], np.ones((3,))
    prob.objective = type("O", (), {"spec": "goodput_rps", "needs_record": needs_record,
                                    "__call__": lambda self, m: m["goodput_rps"]})()
    scs = [_Sc(), _Sc()]
    for sc in scs:
        sc.cfg = type("C", (), {"n_slots": 1})()
    full, cheap = scr.screen_problems(prob, scs)
    for sc in cheap.scenarios:
        sc.cfg = scs[0].cfg
    full.space = cheap.space = type("S", (), {"to_params": lambda self, th: th,
                                              "human": lambda self, p: p})()
    return full, cheap


def test_full_evaluations_run_no_rate_below_a_share_of_the_start_goodput(monkeypatch):
    """The full evaluation's searches get floors at FLOOR_SHARE x the start's goodput
    on each window (every candidate, every window); the screen's runs get none."""
    import tuner.objective.evaluate as ev

    seen = []

    def fake(jobs, **kw):
        seen.append(kw.get("floors"))
        return [{"goodput_rps": 1.0, "slo_attainment": 1.0, "objective": 1.0,
                 "iterations": 1.0, "completed": 1.0, "unserved": 0.0} for _ in jobs]
    monkeypatch.setattr(ev, "evaluate_many", fake)
    full, cheap = _stub_problems()
    full.batch([{}, {}])
    cheap.batch([{}])
    share = scr.FLOOR_SHARE
    assert seen == [[share * 4.0, share * 2.0] * 2, None]


def test_the_full_evaluation_of_a_screened_policy_starts_from_its_screen_runs(
        monkeypatch):
    """A candidate the screen ran gets each window's screen run (its rate and metrics)
    as a known run of its full evaluation's search, beside the start's goodput as the
    hint; a policy the screen did not run (the start) gets none; neither does an
    objective that reads the expected attainment, which a screen's run may lack."""
    import tuner.objective.evaluate as ev

    seen = []

    def fake(jobs, **kw):
        seen.append(kw)
        return [{"goodput_rps": 1.0, "slo_attainment": 0.5 + 0.1 * i, "objective": 1.0,
                 "iterations": 1.0, "completed": 1.0, "unserved": 0.0}
                for i, _ in enumerate(jobs)]
    monkeypatch.setattr(ev, "evaluate_many", fake)
    full, cheap = _stub_problems()
    cheap.batch([{"a": 1.0}, {"a": 2.0}])
    seen.clear()
    full.batch([{"a": 2.0}, {"a": 3.0}])
    (kw,) = seen
    assert kw["hints"] == [4.0, 2.0, 4.0, 2.0]
    # {"a": 2.0} was the screen's second policy: its jobs were the 3rd and 4th
    assert kw["known"][:2] == [{4.0: pytest.approx({**kw["known"][0][4.0],
                                                     "slo_attainment": 0.7})},
                               {4.0: pytest.approx({**kw["known"][1][4.0],
                                                     "slo_attainment": 0.8})}]
    assert kw["known"][2:] == [None, None]
    full, cheap = _stub_problems(needs_record=True)
    cheap.batch([{"a": 1.0}])
    seen.clear()
    full.batch([{"a": 1.0}])
    assert seen[0]["known"] is None


def test_the_fit_dispatches_screen_with_its_pool_and_default_evaluations(
        monkeypatch, tmp_path, capsys):
    from tuner.scenario.deployments import get_deployment

    dep = get_deployment("h100-interactive")
    assert fit_cli.tuner_of(dep, None, "screen", None) == ("screen", scr.SCREEN_EVALS,
                                                           scr.POOL)
    assert fit_cli.tuner_of(dep, None, "screen", 7) == ("screen", 7, scr.POOL)
    # the deployment's own: 16 screened, 3 in full (experiments/fit_methods' screen16)
    assert fit_cli.tuner_of(dep, None, None, None) == ("screen", 3, 16)
    out = tmp_path / "p.json"
    rc = fit_cli.main(["--method", "screen", "--pool", "0", "--out", str(out)])
    assert rc == 2 and "--pool 0: must be >= 1" in capsys.readouterr().err
    rc = fit_cli.main(["--method", "screen", "--pool", "3", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--evals 5 with --pool 3" in err and "--evals <= 4" in err
    rc = fit_cli.main(["--method", "screen", "--objective", "tps", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--method screen: the objective 'tps' has no rate ladder" in err
    assert err.strip().count("\n") == 0 and not out.exists()
