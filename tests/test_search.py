"""Black-box search (``tuner.search.blackbox``) and ``python -m tuner.fit --method``.

One small problem (the training window ``tests/test_fit.py`` fits on, objective
``tps_mig``: no rate ladder) is built once; the searches use ``batch=2`` so that the
whole module compiles the single-point and one batch size of the problem only (the
suite's cost is XLA compiles). The CLI's training window is the same window, so its
search reuses that compiled code.
"""

import builtins
import math

import numpy as np
import pytest

from models import get_system, trace_guard, validate_params
from tuner import fit as fit_cli
from tuner.search.fitting import FitSettings, build_problem
from tuner.export.policy import load_policy
from tuner.scenario import ScenarioSpec
from tuner.search.blackbox import SEARCH_METHODS, Flat, SearchResult, search, search_fit

SPEC = ScenarioSpec(n_requests=100, n_slots=32, max_batch=32)
SETTINGS = FitSettings(crn=1, objective="tps_mig")
EVALS, BATCH = 6, 2  # the start, two batches of 2, and one point left over


@pytest.fixture(scope="module")
def prob():
    p, _ = build_problem(SPEC, SETTINGS)
    return p


def _run(prob, method, **kw):
    """``search`` with every exact evaluation the problem reports, and its cost."""
    seen = []

    def listen(cost, theta, v):
        seen.append((cost, theta, v))
    prob.listeners.append(listen)
    c0 = prob.cost
    try:
        res = search(prob, method, kw.pop("evals", EVALS), batch=BATCH, **kw)
    finally:
        prob.listeners.remove(listen)
    return res, seen, prob.cost - c0


@pytest.mark.parametrize("method", SEARCH_METHODS)
def test_a_search_spends_exactly_its_evaluations_start_first_and_keeps_the_best(
        prob, method):
    flat = Flat(prob.space)
    x0 = flat.vec(prob.space.to_theta(prob.space.base))
    kw = {"tpe_batch": 2} if method == "tpe" else {}  # TPE's batched path too
    calls = []
    with trace_guard(1):  # one compile per batch size: the remainder adds none
        res, seen, spent = _run(prob, method,
                                progress=lambda n, b: calls.append((n, b)), **kw)
    assert isinstance(res, SearchResult)
    assert res.evals_used == len(seen) == EVALS
    # guided also pays a gradient per generation (3: batches of 2, 2 and the one left)
    grads = 3 if method == "guided" else 0
    assert spent == (EVALS + grads * prob.grad_cost) * prob.unit
    assert [c for c, _, _ in seen] == sorted(c for c, _, _ in seen)
    np.testing.assert_allclose(flat.vec(seen[0][1]), x0, rtol=1e-6)  # the start first
    values = [v for _, _, v in seen]
    assert res.best_value == max(values)
    assert flat.vec(res.best_theta) == pytest.approx(
        flat.vec(seen[values.index(max(values))][1]))
    # the best theta re-evaluated exactly gives the best value (float32 round-off of
    # the single-point and batched compiled paths apart)
    assert prob.value(res.best_theta)[0] == pytest.approx(res.best_value, rel=1e-5)
    assert all(np.all(np.abs(flat.vec(th)) <= 5.0) for _, th, _ in seen[1:])
    assert calls[-1] == (EVALS, res.best_value)
    assert [n for n, _ in calls] == sorted({n for n, _ in calls})
    # the same seed gives the same search; another seed another one
    again, seen2, _ = _run(prob, method, **kw)
    assert [v for *_, v in seen2] == values
    assert flat.vec(again.best_theta) == pytest.approx(flat.vec(res.best_theta))
    _, other, _ = _run(prob, method, seed=1, **kw)
    assert [flat.vec(th).tolist() for _, th, _ in other[1:]] != \
        [flat.vec(th).tolist() for _, th, _ in seen[1:]]


def test_a_search_starts_where_it_is_told_and_one_evaluation_is_the_start(prob):
    flat = Flat(prob.space)
    theta = prob.space.to_theta(prob.space.base)
    start = prob.space.to_params({k: v + 0.5 for k, v in theta.items()})
    res, seen, spent = _run(prob, "random", evals=1, start=start)
    assert len(seen) == 1 and spent == prob.unit and res.evals_used == 1
    np.testing.assert_allclose(flat.vec(seen[0][1]), flat.vec(theta) + 0.5, rtol=1e-5)
    assert res.best_value == seen[0][2]
    assert flat.theta(flat.vec(theta)).keys() == theta.keys()
    assert len(flat) == len(prob.space.coords()) == len(flat.labels)


class _Toy:
    """A problem with the module problem's space and a cheap objective, NaN for
    ``levels[0] > 3.5`` in theta (a failed simulation), reporting like ``Problem``."""

    def __init__(self, space):
        self.space, self.listeners, self.cost, self.unit = space, [], 0.0, 1
        self.flat = Flat(space)

    def _f(self, theta):
        x = self.flat.vec(theta)
        return math.nan if x[0] > 3.5 else -float(np.sum((x + 1.0) ** 2))

    def batch(self, thetas, t=0.0):
        vals = np.array([self._f(th) for th in thetas])
        for th, v in zip(thetas, vals):
            self.cost += 1
            for cb in self.listeners:
                cb(self.cost, th, float(v))
        return vals

    def value(self, theta, t=0.0):
        return float(self.batch([theta])[0]), {}

    def grad(self, theta, t):
        """The quadratic's own gradient (what ``Problem.grad`` returns: value,
        gradient in theta, metrics); counted in ``grads``."""
        self.grads = getattr(self, "grads", 0) + 1
        x = self.flat.vec(theta)
        return self._f(theta), self.flat.theta(-2.0 * (x + 1.0)), {}


@pytest.mark.parametrize("method", SEARCH_METHODS)
def test_failed_evaluations_never_win_and_do_not_stop_a_search(prob, method):
    toy = _Toy(prob.space)
    seen = []
    toy.listeners.append(lambda c, th, v: seen.append(v))
    # the start (levels[0] = 3.9 in theta) fails: the search goes on and finds finite
    res = search(toy, method, 40, batch=4, tpe_batch=2)
    assert res.evals_used == len(seen) == toy.cost == 40 and math.isnan(seen[0])
    finite = [v for v in seen if math.isfinite(v)]
    assert finite and res.best_value == max(finite) == toy._f(res.best_theta)
    # nothing finite at all: -inf, and the start as the best theta
    toy._f = lambda theta: math.nan
    res = search(toy, method, 3, batch=2)
    assert res.best_value == -math.inf and res.evals_used == 3
    assert toy.flat.vec(res.best_theta) == pytest.approx(
        toy.flat.vec(prob.space.to_theta(prob.space.base)))


def test_bad_search_settings_fail_before_any_evaluation(prob, monkeypatch):
    c0 = prob.cost
    for kw, msg in (({"method": "grid"}, "choose one of tpe, cmaes, random"),
                    ({"evals": 0}, "at least 1"),
                    ({"method": "cmaes", "batch": 1}, "population"),
                    ({"box": 0.0}, "box")):
        kw = {"method": "random", "evals": 3, **kw}
        with pytest.raises(ValueError, match=msg):
            search(prob, kw.pop("method"), kw.pop("evals"), **kw)
    real = builtins.__import__

    def no_optuna(name, *a, **kw):
        if name == "optuna":
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_optuna)
    with pytest.raises(ImportError, match="needs the 'optuna' package"):
        search(prob, "tpe", 3)
    assert prob.cost == c0


def test_search_fit_returns_a_fit_result_as_fit_does(prob):
    seen = []
    res = search_fit(SPEC, SETTINGS, "cmaes", 5, batch=BATCH, log=lambda s: None,
                     listeners=[lambda c, th, v: seen.append((c, v))])
    assert res.steps == len(res.history) == len(seen) == 5
    assert [h["eval"] for h in res.history] == [1, 2, 3, 4, 5]
    assert [(h["cost"], h["exact"]) for h in res.history] == seen
    assert res.history[-1]["cost"] == res.cost == 5 * res.unit == 5 * prob.unit
    assert res.best_exact == max(v for _, v in seen)
    assert res.history[0]["exact"] == pytest.approx(prob.value(
        prob.space.to_theta(prob.space.base))[0], rel=1e-6)
    assert res.estimators == {} and res.floor == 0.0 and res.checks == []
    assert res.rates is None and "tps" in res.train_objective
    # physical parameters the validation and the policy file take as they are
    spec = get_system(SETTINGS.system)
    for params in (res.params, res.default_params):
        assert set(params) >= set(prob.space.names)
        validate_params(spec, params, 16384)


# its training window is SPEC's (the first 100 of 200 requests): the compiles are shared
CLI = ["--deployment", "mlu370-azure", "--objective", "tps_mig", "--n-requests", "200",
       "--windows", "1", "--slots", "32", "--max-batch", "32", "--holdout-seeds", "1",
       "--quiet"]


def _fake_validate(tuned_wins: bool, seen: list):
    """Stub of the held-out validation (its exact runs cost minutes of compiles here):
    checks each policy's parameters as the simulator takes them."""
    def fake(system, policies, objective, win, seeds, log=None, whole_slice=True, **_):
        out = {}
        for name, (sys_name, params) in policies.items():
            validate_params(get_system(sys_name), params, 16384)
            seen.append(name)
            v = 100.0 if (name == "tuned") == tuned_wins else 50.0
            m = {"objective": v, "samples": 3, "ci": {"objective": [v - 1, v + 1]}}
            out[name] = {**m, "system": sys_name, "whole_trace": dict(m),
                         # paired differences that vary (equal ones: undetermined)
                         "objective_per_sample": [v - 1, v, v + 1 + (name == "tuned")]}
        return out
    return fake


def test_fit_cli_random_search_exports_its_method_and_evaluations(tmp_path, capsys,
                                                                  monkeypatch):
    import tuner.objective.validation as val

    out = tmp_path / "policy.json"
    validated = []
    monkeypatch.setattr(val, "validate", _fake_validate(True, validated))
    rc = fit_cli.main(CLI + ["--method", "random", "--evals", "4", "--out", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert "tuner: random, 4 exact evaluations" in text.out
    assert validated[:2] == ["tuned", "default"] and "static" in validated
    doc = load_policy(out)  # params checked against the system's domains
    t = doc["tuner"]
    assert (t["method"], t["evals"], t["steps"]) == ("random", 4, 4)
    assert [h["eval"] for h in t["history"]] == [1, 2, 3, 4]
    assert t["best_exact_train"] == max(h["exact"] for h in t["history"])
    assert t["estimators"] == {} and doc["verdict"]["outcome"] == "win"
    assert not out.with_name(out.name + ".ckpt").exists()


def test_fit_cli_hybrid_explores_8_unless_told(tmp_path, monkeypatch, capsys):
    """hybrid is the gradient tuner with --explore 8 by default (the fit stubbed)."""
    import tuner.objective.validation as val
    from types import SimpleNamespace

    got = []

    def fake_fit(spec, st, **kw):
        got.append(st.explore)
        return SimpleNamespace(params={"gamma": 1.0}, default_params={"gamma": 1.0},
                               estimators={}, floor=0.1, steps=1, train_objective="tps",
                               rates=None, cost=1.0, history=[], best_exact=1.0,
                               start_goodput_rps=None)
    monkeypatch.setattr(fit_cli, "fit", fake_fit)
    monkeypatch.setattr(val, "validate", _fake_validate(True, []))
    out = tmp_path / "p.json"
    for extra, want in ((["--method", "hybrid"], 8),
                        (["--method", "hybrid", "--explore", "3"], 3), ([], 0)):
        assert fit_cli.main(CLI + extra + ["--out", str(out)]) == 0
        assert got[-1] == want
        doc = load_policy(out)
        assert doc["tuner"]["method"] == (extra[1] if extra else "gradient")
        assert doc["tuner"]["evals"] is None
    capsys.readouterr()


def test_fit_cli_bad_method_or_evals_exit_2_with_one_line_and_no_file(tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "sub" / "policy.json"
    for argv, msg in ((["--method", "annealing"], "--method 'annealing': choose one of "
                       "gradient, hybrid, tpe, cmaes, random"),
                      (["--method", "tpe", "--evals", "0"], "--evals 0: must be >= 1"),
                      (["--evals", "-1"], "--evals -1: must be >= 1"),
                      (["--method", "random", "--resume"], "keeps no checkpoint")):
        assert fit_cli.main(argv + ["--quiet", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and msg in err and err.count("\n") == 1, err
    real = builtins.__import__

    def no_cma(name, *a, **kw):
        if name == "cma":
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_cma)
    assert fit_cli.main(["--method", "cmaes", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs the 'cma' package" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_guided_injects_points_along_the_gradient_and_beats_cmaes_on_a_smooth_bowl(prob):
    from tuner.search.blackbox import GUIDE_STEPS

    flat = Flat(prob.space)
    x0 = np.clip(flat.vec(prob.space.to_theta(prob.space.base)), -5.0, 5.0)
    toy = _Toy(prob.space)
    toy._f = lambda theta: -float(np.sum((flat.vec(theta) + 1.0) ** 2))  # no NaN
    seen = []
    toy.listeners.append(lambda c, th, v: seen.append(flat.vec(th)))
    guided = search(toy, "guided", 40, batch=6, sigma0=1.0)
    # the first generation opens with the start's gradient steps (sigma0 = 1)
    g = -2.0 * (x0 + 1.0)
    step = math.sqrt(len(g)) * g / np.linalg.norm(g)
    for k, f in enumerate(GUIDE_STEPS):
        np.testing.assert_allclose(seen[1 + k], np.clip(x0 + f * step, -5, 5), rtol=1e-5)
    assert toy.grads == math.ceil((40 - 1) / 6)  # one per generation
    bowl = _Toy(prob.space)
    bowl._f = toy._f
    plain = search(bowl, "cmaes", 40, batch=6, sigma0=1.0)
    assert guided.best_value > plain.best_value


@pytest.mark.parametrize("method", SEARCH_METHODS)
def test_given_first_points_are_evaluated_where_they_are_right_after_the_start(method):
    """``first`` (tuner.fit gives vLLM's auto_tune grid): evaluations 2.. are exactly the
    given settings, one outside the box included (evaluated there, not clipped), then
    the method's own points; the budget is unchanged; guided adds no gradient point to
    that first generation."""
    from tuner.search.blackbox import Flat as _Flat

    p, _ = build_problem(SPEC, SETTINGS)
    flat = _Flat(p.space)
    toy = _Toy(p.space)
    x0 = flat.vec(p.space.to_theta(p.space.base))
    xs = [np.clip(x0, -4, 4) + d for d in (0.3, -0.4)]
    xs[1][0] = 7.0  # outside the box [-5, 5]
    first = [p.space.to_params(flat.theta(x)) for x in xs]
    seen = []
    toy.listeners.append(lambda c, th, v: seen.append(flat.vec(th)))
    res = search(toy, method, 7, batch=2, first=first, seed=3)
    assert res.evals_used == len(seen) == 7
    np.testing.assert_allclose(seen[0], x0, rtol=1e-5)
    for k, x in enumerate(xs):
        np.testing.assert_allclose(seen[1 + k], x, rtol=1e-4, atol=1e-4)
    assert not any(np.allclose(s, xs[0], atol=1e-4) for s in seen[3:])
    if method == "guided":  # gradients only from the second generation on
        assert toy.grads == math.ceil((7 - 1 - 2) / 2)
    if method in ("cmaes", "guided"):
        with pytest.raises(ValueError, match="first points for a population"):
            search(toy, method, 7, batch=2, first=first * 2)
