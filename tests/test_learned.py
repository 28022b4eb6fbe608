"""tuner.objective.learned (a learned per-request policy as a Problem) and
tuner.search.descend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

SYSTEM = "odma"


@pytest.fixture(scope="module")
def problems():
    """A small ODMA scenario where memory binds (30 slots' worth of KV cut to 12k
    tokens), its learned problem and the plain problem of ODMA's own parameters on the
    same ladder."""
    from models import get_system
    from tuner.objective.learned import LearnedProblem
    from tuner.objective.objectives import parse_objective
    from tuner.objective.problem import Problem, plan_ladder
    from tuner.objective.space import Space
    from tuner.scenario import ScenarioSpec, build_scenario

    sc = build_scenario(ScenarioSpec(n_requests=60, n_slots=32, max_batch=32,
                                     capacity_tokens=12_000, seed=0))
    params = get_system(SYSTEM).default_params(sc.cfg.max_len)
    obj = parse_objective("goodput_expected_rps")
    rates, n_steps, _ = plan_ladder([sc], SYSTEM, params)
    lp = LearnedProblem([sc], SYSTEM, params, obj, n_steps, rates)
    plain = Problem([sc], SYSTEM, Space(get_system(SYSTEM), params), obj, n_steps, rates)
    return lp, plain, params


def _theta(lp, scale, seed=0):
    from tuner.search.blackbox import Flat

    flat = Flat(lp.space)
    return flat.theta(np.random.default_rng(seed).normal(0.0, scale, len(flat)))


def test_zero_weights_are_the_default_exactly(problems):
    lp, plain, params = problems
    assert len(lp.space.coords()) == 217  # 3 -> 12 -> 12 -> 1
    zero = lp.space.to_theta(lp.space.base)
    v, m = lp.value(zero)
    vp, mp = plain.value(plain.space.to_theta(params))
    assert v == vp and m["log_objective"] == mp["log_objective"]


def test_multipliers_are_bounded_and_change_the_run(problems):
    from tuner.objective.learned import multipliers

    lp, plain, _ = problems
    wl = lp._args[1].wl
    one = jax.tree.map(lambda x: x[0], wl)  # the CRN stack's first scenario
    for scale in (0.5, 5.0):
        m = np.asarray(multipliers(lp.space, _theta(lp, scale), one, 4096))
        assert np.all(m >= 0.25 - 1e-6) and np.all(m <= 4.0 + 1e-5)
        assert np.ptp(m) > 0  # per request, not one factor for all
    # deflating every prediction (the last bias at -inf: m = 1/4) changes the goodput
    zero = lp.space.to_theta(lp.space.base)
    low = dict(zero, **{"Dense_2/bias": jnp.full((1,), -20.0)})
    high = dict(zero, **{"Dense_2/bias": jnp.full((1,), 20.0)})
    vals = lp.batch([zero, low, high])
    assert len(set(np.round(vals, 6))) == 3, vals


# slow (18 s of the default run's compiles for a known defect): the defect is also in
# experiments/results/learned_stakes/ (1 of 39 gradient checks agree at T = 0.3)
@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "measured: on this memory-bound ladder the relaxed pathwise gradient vanishes. At "
    "the start d/d(last bias) is 1.7e-07 while central differences of the same relaxed "
    "function (T = 0.3) give -0.94 at h = 0.01, 1.0e-04 at h = 0.001 and -0.53 at "
    "h = 0.1: the relaxed log objective is flat with a spike (-0.452 -> -0.433 -> "
    "-0.452 over bias -0.02..0), not smooth. ODMA's own parameters on the same ladder "
    "show it too (tau: 2.6e-07 against 1.11). Pathwise gradients cannot steer this "
    "policy until the relaxed objective is smooth here (issue 31)."))
def test_relaxed_gradient_matches_finite_differences(problems):
    """d log objective / d weight of the relaxed run at T = 0.3 against central
    differences of the same relaxed function, on the last layer's weights (the start
    has zero last layer, so only they have a gradient there) and, from a random
    point, on first-layer weights."""
    lp, _, _ = problems
    t, h = 0.3, 1e-2
    for theta, names in ((lp.space.to_theta(lp.space.base), ("Dense_2/bias",)),
                         (_theta(lp, 0.5, seed=3), ("Dense_0/kernel", "Dense_2/kernel"))):
        _, g, _ = lp.grad(theta, t)
        coords = [(n, i) for n in names for i in range(min(3, int(np.size(theta[n]))))]
        fd = lp.fd(theta, coords, h, t=t, log=True)
        got = np.array([float(g[n].reshape(-1)[i]) for n, i in coords])
        want = np.array([fd[c] for c in coords])
        assert np.any(np.abs(want) > 1e-4), want  # not a vanishing gradient
        np.testing.assert_allclose(got, want, rtol=0.1, atol=0.05 * np.abs(want).max())


def test_descend_keeps_the_best_exact_policy(problems):
    from tuner.search.descend import descend

    lp, _, _ = problems
    c0 = lp.cost
    seen = []
    lp.listeners.append(lambda c, th, v: seen.append(v))
    try:
        d = descend(lp, 4, lr=0.2, check_every=2)
    finally:
        lp.listeners.clear()
    assert d.start_value == seen[0] and d.best_value == max(seen)
    assert [r["step"] for r in d.history] == [1, 2, 3, 4]
    assert sum("exact" in r for r in d.history) == 2
    # four gradients and three exact evaluations charged
    assert lp.cost - c0 == pytest.approx((4 * lp.grad_cost + 3) * lp.unit)
    with pytest.raises(ValueError, match="t_end"):
        descend(lp, 2, t_start=0.1, t_end=0.3)


def test_learned_policy_needs_a_bucketed_system():
    from tuner.objective.learned import LearnedProblem

    with pytest.raises(ValueError, match="not a bucketed system"):
        LearnedProblem([], "ellm", {}, None, 1)


def test_learned_stakes_refuses_bad_arguments(tmp_path, capsys):
    from experiments.learned_stakes import main

    assert main(["--out", str(tmp_path / "o"), "--cases", "kv-1"]) == 2
    assert "--cases: unknown ['kv-1']" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "o"), "--system", "paged"]) == 2
    assert "--system 'paged': with --target inflation, one of odma, s3" in \
        capsys.readouterr().err
    assert main(["--out", str(tmp_path / "o"), "--target", "priority", "--system",
                 "ellm"]) == 2
    assert "with --target priority, one of paged, static, s3, odma" in \
        capsys.readouterr().err
    assert main(["--out", str(tmp_path / "o"), "--requests", "1"]) == 2
    assert "--requests 1" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--out", str(blocker / "o")]) == 2
    assert "--out" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_learned_stakes_writes_and_renders_what_run_case_returns(tmp_path, monkeypatch):
    """main's glue without simulation: every case run_case returns is written (JSON with
    provenance, markdown with its stamp) and rendered; the simulation itself is covered
    by the tests above and by the slow quick run below."""
    import json

    import experiments.learned_stakes as ls

    def fake(name, capacity, **kw):
        hist = [{"step": 1, "temperature": 0.3, "relaxed": 1.0, "cost": 3.0}]
        return {"capacity_tokens": capacity, "requests": kw["n"], "realisations": 1,
                "weights": 217, "horizon_steps": 16, "rungs_rps": [1.0], "default": 2.0,
                "random": {"uniform_box": 1, "normal_1": 1, "values": [1.0, 2.5]},
                "judge": {"default": 2.0, "best": 2.5, "worst": 1.0,
                          "median_random": 1.75, "best_over_worst": 2.5,
                          "best_over_default": 1.25, "distinct_values": 3,
                          "meets": True},
                "tau": {"0.3": None, "0.1": 0.5},
                "baselines": {"paged": 3.0, "static": 1.5, "s3": 2.0},
                "gradient_checks": {"coords": 13, "h": 0.1, "exact_fd": [0.0] * 13,
                                    "by_t": {"0.3": {"relaxed": [0.0] * 13, "classes": {
                                        "agree": 0, "disagree": 0, "vanishing": 0,
                                        "flat": 13}}}},
                "descent": {"steps": 1, "best": 2.0, "start": 2.0, "cost_evals": 4.0,
                            "grad_over_exact": 3.0, "history": hist},
                "wall_s": 1.0}
    monkeypatch.setattr(ls, "run_case", fake)
    out = tmp_path / "o"
    assert ls.main(["--out", str(out), "--cases", "kv-100k,kv-200k"]) == 0
    doc = json.loads((out / "learned_stakes.json").read_text())
    assert list(doc["cases"]) == ["kv-100k", "kv-200k"]
    assert doc["cases"]["kv-200k"]["capacity_tokens"] == 200_000
    md = (out / "learned_stakes.md").read_text()
    assert "| kv-200k | 200,000 | 217 | 2 |" in md and "— (ties)" in md
    assert "1.500x" in md and "T = 0.3: flat 13" in md  # paged / default, checks
    assert md.rstrip().splitlines()[-1].startswith("Made by `")
    # the priority target: what the MLP sets, the hand-made rules, the descent not run
    seen = {}

    def fake_priority(name, capacity, **kw):
        seen.update(kw)
        c = fake(name, capacity, **kw)
        c["heuristics"] = {"short-prompt-first": 3.0}
        c["descent"] = {"steps": 0, "best": None, "start": 2.0, "cost_evals": 0.0,
                        "grad_over_exact": 3.0, "history": [], "not_run": "no gradient"}
        return c
    monkeypatch.setattr(ls, "run_case", fake_priority)
    assert ls.main(["--out", str(out), "--cases", "kv-100k", "--target", "priority"]) == 0
    assert seen["system"] == "paged" and seen["target"] == "priority"
    md = (out / "learned_stakes.md").read_text()
    assert "scheduling priority as an MLP" in md and "| not run |" in md
    assert "short-prompt-first 3 (1.500x)" in md and "Descent not run: no gradient" in md
    seen = []
    monkeypatch.setattr(ls, "run_case", lambda name, cap, **kw: seen.append(kw) or
                        fake(name, cap, **kw))
    assert ls.main(["--out", str(out), "--cases", "kv-100k", "--system", "s3",
                    "--requests", "1000"]) == 0
    assert seen[0]["system"] == "s3" and seen[0]["n"] == 1000
    assert json.loads((out / "learned_stakes.json").read_text())["system"] == "s3"
    assert "(S3's inflation as an MLP)" in (out / "learned_stakes.md").read_text()


@pytest.mark.slow
def test_learned_stakes_quick_run_writes_its_result(tmp_path):
    import json

    from experiments.learned_stakes import main

    out = tmp_path / "o"
    assert main(["--out", str(out), "--quick", "--cases", "kv-100k"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["learned_stakes.json",
                                                     "learned_stakes.md"]
    doc = json.loads((out / "learned_stakes.json").read_text())
    c = doc["cases"]["kv-100k"]
    assert doc["provenance"]["sources"]["files"]["tuner/objective/learned.py"]
    assert c["weights"] == 217 and len(c["random"]["values"]) == 8
    assert c["judge"]["best"] >= c["default"] and set(c["baselines"]) == {
        "paged", "static", "s3"}
    gc = c["gradient_checks"]
    assert gc["coords"] == 13 and all(sum(v["classes"].values()) == 13
                                      for v in gc["by_t"].values())
    assert len(c["descent"]["history"]) == 2 and c["descent"]["best"] >= c["default"]
    assert "Made by `" in (out / "learned_stakes.md").read_text()
