"""The gradient tuner: end-to-end CLI, checkpoint/resume equivalence, corrupt files."""

from types import SimpleNamespace

import numpy as np
import pytest

from tuner import fit as fit_cli
from tuner.search.fitting import FitSettings, fit
from tuner.export.policy import load_policy
from tuner.scenario import ScenarioSpec

SPEC = ScenarioSpec(n_requests=100, n_slots=32, max_batch=32)
# checkpoint mechanics do not depend on the objective: the ODMA papers' target needs
# no rate ladder, so these fits are quick (the goodput fit runs in the CLI tests).
# A Problem compiles once per batch size (the suite's cost is XLA compiles): explore=6
# makes the exploration batch (1 + 6) the size of the forward difference below.
SETTINGS = FitSettings(budget=4, crn=1, check_every=2, checkpoint_every=1, explore=6,
                       temperatures=(0.3, 0.03), objective="tps_mig")


class Killed(Exception):
    pass


def test_killed_fit_resumes_to_the_same_result(tmp_path):
    quiet = dict(log=lambda s: None)
    whole = fit(SPEC, SETTINGS, **quiet)
    ckpt = tmp_path / "p.json.ckpt"

    def die(rec):
        if rec["step"] == 3:
            raise Killed

    with pytest.raises(Killed):
        fit(SPEC, SETTINGS, checkpoint=ckpt, progress=die, **quiet)
    assert ckpt.exists() and not list(tmp_path.glob(".*.tmp"))
    resumed = fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, **quiet)
    assert resumed.steps == whole.steps == 4
    for k in whole.params:
        np.testing.assert_allclose(resumed.params[k], whole.params[k], rtol=1e-6)
    assert [h["step"] for h in resumed.history] == [1, 2, 3, 4]
    assert resumed.estimators == whole.estimators
    # every coordinate's estimator is logged with a reason, from the check
    assert set(whole.estimators.values()) <= {"relaxed", "fd-crn"}

    ckpt.write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="checkpoint"):
        fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, **quiet)


def _fake_fit(params):
    def fake(spec, st, **kw):
        return SimpleNamespace(params=params, default_params=params, estimators={},
                               floor=0.1, steps=1, train_objective="goodput_rps",
                               rates=[1.0], cost=1.0, history=[], best_exact=1.0,
                               start_goodput_rps=1.0)
    return fake


def _fake_validate(values):
    def fake(system, policies, objective, win, seeds, log=None, whole_slice=True, **_):
        out = {}
        for name, (sys_name, _) in policies.items():
            v = values.get(name, values["static"])
            d = 2.0 if name == "tuned" else 0.5  # the tuned policy's spread
            m = {"objective": v, "goodput_rps": v, "samples": 3,
                 "ci": {"objective": [v - d, v + d]}}
            out[name] = {**m, "system": sys_name,
                         "objective_per_sample": [v - d, v, v + d],
                         "whole_trace": dict(m)}
        return out
    return fake


def test_fit_cli_says_when_a_baseline_wins_and_exports_nothing(tmp_path, capsys,
                                                               monkeypatch):
    """The verdict (exit 3, one plain sentence, nothing written unless asked), with the
    fit and the held-out validation stubbed: deterministic and fast."""
    import tuner.objective.validation as val

    out = tmp_path / "policy.json"
    monkeypatch.setattr(fit_cli, "fit", _fake_fit({"gamma": 1.0}))
    monkeypatch.setattr(val, "validate", _fake_validate(
        {"tuned": 90.0, "default": 85.0, "static": 100.0}))
    argv = ["--deployment", "mlu370-azure", "--n-requests", "256", "--windows", "1",
            "--quiet", "--out", str(out)]
    rc = fit_cli.main(argv)
    text = capsys.readouterr()
    assert rc == 3, text.err
    assert "verdict (loss): static allocation serves this workload better" in text.out
    assert "no policy exported" in text.out
    assert list(tmp_path.iterdir()) == []
    assert fit_cli.main(argv + ["--export-anyway"]) == 0
    doc = load_policy(out)
    assert doc["verdict"]["outcome"] == "loss"
    assert doc["verdict"]["comparisons"]["static"]["status"] == "worse"
    # indistinguishable from the best baseline: exported, and said so
    out.unlink()
    monkeypatch.setattr(val, "validate", _fake_validate(
        {"tuned": 100.2, "default": 90.0, "static": 100.0}))
    assert fit_cli.main(argv) == 0
    assert "verdict (tie)" in capsys.readouterr().out and out.exists()


class _Stop(Exception):
    pass


def test_fit_runs_the_named_deployment_and_flags_replace_its_fields(tmp_path, capsys,
                                                                    monkeypatch):
    """The fit's built-in deployment is the one tuner.scenario.deployments names (and
    experiments/deployment_stakes measured); --system and scenario flags replace its
    fields one by one; an unknown name is one error line."""
    from tuner.scenario.deployments import DEFAULT, DEPLOYMENTS
    from tuner.objective.validation import trace_length

    seen = {}

    def fake(specs, st, **kw):
        seen.update(system=st.system, spec=specs[0], method="gradient")
        raise _Stop

    def fake_search(specs, st, method, evals, **kw):
        seen.update(system=st.system, spec=specs[0], method=method, evals=evals)
        raise _Stop

    def fake_screen(specs, st, evals, pool, **kw):
        seen.update(system=st.system, spec=specs[0], method="screen", evals=evals,
                    pool=pool, first=kw["first"])
        raise _Stop

    monkeypatch.setattr(fit_cli, "fit", fake)
    monkeypatch.setattr(fit_cli, "search_fit", fake_search)
    monkeypatch.setattr(fit_cli, "screen_fit", fake_screen)
    out = tmp_path / "policy.json"
    with pytest.raises(_Stop):
        fit_cli.main(["--quiet", "--out", str(out)])
    dep = DEPLOYMENTS[DEFAULT]
    assert DEFAULT == "h100-interactive" and seen["system"] == dep.system == "vllm-v1"
    # its own tuner (experiments/fit_methods): the screened search, 5 full evaluations
    # of 32 candidates, vLLM's auto_tune grid among them
    assert (seen["method"], seen["evals"]) == (dep.method, dep.evals) == ("screen", 3)
    assert seen["pool"] == dep.pool == 16 and len(seen["first"]) == 8
    for k, v in dep.fields:
        assert getattr(seen["spec"], k) == v or k == "n_requests", k  # a window of it
    assert (seen["spec"].hardware, seen["spec"].ttft_slo_s, seen["spec"].n_slots) == (
        "h100-80gb", 1.0, 512)
    with pytest.raises(_Stop):
        fit_cli.main(["--quiet", "--system", "odma", "--hardware", "a100-80gb",
                      "--out", str(out)])
    assert seen["system"] == "odma" and seen["spec"].hardware == "a100-80gb"
    assert seen["method"] == "gradient"  # another system: not the deployment's tuner
    assert seen["spec"].model == "qwen3-8b" and seen["spec"].tpot_slo_s == 0.02
    with pytest.raises(_Stop):  # another trace: all of it, not the deployment's slice
        fit_cli.main(["--quiet", "--trace", "azure-conv", "--windows", "1",
                      "--out", str(out)])
    n = trace_length(ScenarioSpec(trace="azure-conv"))
    assert seen["spec"].trace == "azure-conv" and seen["spec"].n_requests == n // 2 > 1000
    assert seen["spec"].offset == 0 and seen["spec"].ttft_slo_s == 1.0
    with pytest.raises(_Stop):
        fit_cli.main(["--quiet", "--deployment", "mlu370-azure", "--out", str(out)])
    assert seen["system"] == "odma" and seen["spec"].hardware == ScenarioSpec().hardware
    assert seen["method"] == "gradient"
    capsys.readouterr()
    assert fit_cli.main(["--deployment", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--deployment 'nope': unknown" in err and err.count("\n") == 1
    assert not out.exists()


def test_fit_cli_bad_input_leaves_no_file(tmp_path, capsys):
    out = tmp_path / "policy.json"
    assert fit_cli.main(["--deployment", "mlu370-azure", "--system", "static",
                         "--n-requests", "200", "--windows", "1", "--slots", "32",
                         "--quiet", "--out", str(out)]) == 2
    assert "no gradient-tunable" in capsys.readouterr().err
    assert fit_cli.main(["--budget", "0", "--out", str(out)]) == 2
    for flag, bad, field in (("--lr", "-1", "lr"), ("--explore", "-2", "explore"),
                             ("--margin", "1.5", "margin"),
                             ("--check-every", "0", "check_every")):
        assert fit_cli.main([flag, bad, "--out", str(out)]) == 2
        assert f"fit setting {field}=" in capsys.readouterr().err
    (tmp_path / "f.txt").write_text("a file")
    # checked before any work: a directory as --out, a file as its directory, too few
    # requests for the windows, --resume with nothing to resume
    for argv, msg in (([ "--out", str(tmp_path)], "is a directory"),
                      (["--out", str(tmp_path / "f.txt" / "p.json")], "not a directory"),
                      (["--n-requests", "100", "--windows", "2", "--out", str(out)],
                       "too few"),
                      (["--resume", "--out", str(out)], "no checkpoint")):
        # the built-in ODMA deployment: its trace has arrival times (no warning line)
        assert fit_cli.main(argv + ["--quiet", "--deployment", "mlu370-azure"]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1 and err.startswith("error: "), err
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_kill_during_the_checks_leaves_nothing_to_resume_and_after_them_resumes(
        tmp_path, monkeypatch):
    import tuner.search.fitting as fitting

    ckpt = tmp_path / "p.json.ckpt"
    real = fitting.check

    def dying(*a, **kw):
        raise Killed
    monkeypatch.setattr(fitting, "check", dying)
    with pytest.raises(Killed):
        fit(SPEC, SETTINGS, checkpoint=ckpt, log=lambda s: None)
    assert not ckpt.exists()
    with pytest.raises(ValueError, match="no checkpoint"):
        fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, log=lambda s: None)
    monkeypatch.setattr(fitting, "check", real)

    def die(rec):  # the first optimiser step: only the checks' checkpoint exists
        raise Killed
    logs = []
    with pytest.raises(Killed):
        fit(SPEC, SETTINGS, checkpoint=ckpt, progress=die, log=logs.append)
    assert ckpt.exists() and any("after the gradient checks" in s for s in logs)
    monkeypatch.setattr(fitting, "check", dying)  # resuming must not redo the checks
    logs = []
    res = fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, log=logs.append)
    assert res.steps == SETTINGS.budget
    assert any(s.startswith(f"resumed from {ckpt} at step 0 of 4") for s in logs), logs


def test_fit_keeps_the_best_exact_policy_reverts_and_accounts_cost():
    st = FitSettings(budget=4, crn=1, check_every=1, lr=3.0,
                     temperatures=(0.3, 0.03), objective="tps")
    seen = []  # (cost, value) of every exact evaluation, in order
    # memory binds (12k KV tokens), so the policy matters and a step of 3 overshoots
    spec = ScenarioSpec(trace="azure-conv", n_requests=100, n_slots=32, max_batch=32, tp=1,
                        capacity_tokens=12000)
    res = fit(spec, st, log=lambda s: None,
              listeners=[lambda cost, theta, v: seen.append((cost, v))])
    costs = [c for c, _ in seen]
    assert costs == sorted(costs) and len(costs) > 3 + 1 + 4
    assert res.best_exact == max(v for _, v in seen)
    assert res.unit > 0 and costs[0] == res.unit  # one unit per exact evaluation
    assert [h["cost"] for h in res.history] == sorted(h["cost"] for h in res.history)
    assert res.history[-1]["cost"] == res.cost == costs[-1]
    # a check worse than the best seen before it by more than revert_tol is reverted
    for h in res.history:
        before = [v for c, v in seen if c < h["cost"]]
        worse = h["exact"] < max(before) - st.revert_tol * abs(max(before))
        assert h.get("reverted", False) == worse, h
    assert any(h.get("reverted") for h in res.history)  # lr 3 overshoots here


def test_problem_reports_exact_evaluations_and_its_gradient_matches_fd():
    from tuner.search.fitting import build_problem

    prob, _ = build_problem(SPEC, SETTINGS)
    seen = []
    prob.listeners.append(lambda cost, theta, v: seen.append((cost, v)))
    theta = prob.space.to_theta(prob.space.base)
    shifted = {k: v + 0.5 for k, v in theta.items()}
    vals = prob.batch([theta, shifted])
    assert [c for c, _ in seen] == [prob.unit, 2 * prob.unit] == [prob.cost / 2, prob.cost]
    np.testing.assert_allclose([v for _, v in seen], vals)
    v, _ = prob.value(theta)
    assert v == pytest.approx(vals[0]) and len(seen) == 3
    prob.value(theta, 0.3)  # relaxed evaluations are not exact results: not reported
    prob.grad(theta, 0.3)
    assert len(seen) == 3 and prob.cost == (3 + 1 + 3) * prob.unit
    # the gradient is of the mean log objective: central differences of the relaxed
    # simulator agree with it where the relaxation is smooth (warm temperature)
    _, g, mg = prob.grad(theta, 0.3)
    assert mg["log_objective"] == pytest.approx(prob.value(theta, 0.3)[1]["log_objective"])
    fd = prob.fd(theta, prob.space.coords(), h=1e-2, t=0.3)
    for (name, i), d in fd.items():
        r = float(np.asarray(g[name]).reshape(-1)[i])
        assert r == pytest.approx(d, rel=0.1, abs=0.02 * max(abs(x) for x in fd.values())), \
            (name, i)


def test_forward_differences_cost_one_evaluation_per_coordinate():
    from tuner.search.fitting import build_problem

    prob, _ = build_problem(SPEC, SETTINGS)
    theta = prob.space.to_theta(prob.space.base)
    coords = prob.space.coords()
    k, h, t = len(coords), 1e-2, 0.3  # warm relaxation: a smooth objective
    c0 = prob.cost
    central = prob.fd(theta, coords, h, t=t)
    assert prob.cost - c0 == 2 * k * prob.unit
    c0 = prob.cost
    fwd = prob.fd(theta, coords, h, t=t, scheme="forward")  # measures theta itself
    assert prob.cost - c0 == (k + 1) * prob.unit
    base = prob.value(theta, t)[1]["log_objective"]
    c0 = prob.cost
    reused = prob.fd(theta, coords, h, t=t, scheme="forward", base=base)
    assert prob.cost - c0 == k * prob.unit
    scale = max(abs(x) for x in central.values())
    for c in coords:  # O(h) apart from central differences on a smooth objective
        assert fwd[c] == pytest.approx(central[c], abs=0.15 * scale), c
        assert reused[c] == pytest.approx(fwd[c], abs=1e-3 * scale), c
    with pytest.raises(ValueError, match="scheme"):
        prob.fd(theta, coords, scheme="backward")


def test_direction_checks_cost_two_evaluations_per_direction_and_keep_relaxed():
    st = FitSettings(budget=2, crn=1, check_every=2, temperatures=(0.3, 0.03),
                     objective="tps_mig", checks="directions", check_dirs=3)
    seen = []
    res = fit(SPEC, st, log=lambda s: None, grad_cost=5.0,
              listeners=[lambda c, th, v: seen.append((c, v))])
    n_coords = len(res.estimators)
    assert n_coords == 6 and set(res.estimators.values()) == {"relaxed"}
    # the start, 2 x 3 directions, then one exact check after step 2
    assert len(seen) == 1 + 2 * 3 + 1
    assert len(res.checks) == 2 and all(len(c) == 3 for c in res.checks)
    assert all(c["name"] == "dir" for c in res.checks[0])
    # gradients (2 temperatures checked + 2 steps) charged at the given ratio
    assert res.cost == pytest.approx((len(seen) + 5.0 * (2 + 2)) * res.unit)
    assert res.floor in st.temperatures


def test_auto_checks_per_coordinate_for_few_parameters():
    st = FitSettings(budget=1, crn=1, check_every=1, temperatures=(0.3,),
                     objective="tps_mig", checks="auto")
    res = fit(SPEC, st, log=lambda s: None)
    assert [c["name"] for c in res.checks[0]] != ["dir"] * len(res.checks[0])
    assert len(res.checks[0]) == 6  # one per coordinate: 6 <= AUTO_COORDS


def test_the_tuner_is_the_one_given_else_the_deployments_for_its_own_system():
    """--method / --evals as given; without them, the deployment's tuner when the system
    is its own (given or not), gradient for another system; a deployment's tuner is one
    the fit knows, with a usable budget."""
    from tuner.scenario.deployments import DEPLOYMENTS, Deployment

    from tuner.search.screen import POOL, SCREEN_EVALS

    dep = Deployment(system="vllm-v1", fields=(), description="d", method="cmaes",
                     evals=24)
    assert fit_cli.tuner_of(dep, None, None, None) == ("cmaes", 24, POOL)
    assert fit_cli.tuner_of(dep, "vllm-v1", None, None) == ("cmaes", 24, POOL)
    assert fit_cli.tuner_of(dep, None, None, 8) == ("cmaes", 8, POOL)
    assert fit_cli.tuner_of(dep, "odma", None, None) == ("gradient", fit_cli.EVALS, POOL)
    assert fit_cli.tuner_of(dep, None, "tpe", None) == ("tpe", fit_cli.EVALS, POOL)
    assert fit_cli.tuner_of(dep, "odma", "random", 5) == ("random", 5, POOL)
    plain = Deployment(system="odma", fields=(), description="d")
    assert fit_cli.tuner_of(plain, None, None, None) == ("gradient", fit_cli.EVALS, POOL)
    # a screened deployment: its pool with its tuner, unless a pool or a method is given
    scr = Deployment(system="vllm-v1", fields=(), description="d", method="screen",
                     evals=3, pool=16)
    assert fit_cli.tuner_of(scr, None, None, None) == ("screen", 3, 16)
    assert fit_cli.tuner_of(scr, None, None, None, 8) == ("screen", 3, 8)
    assert fit_cli.tuner_of(scr, None, "screen", None) == ("screen", SCREEN_EVALS, POOL)
    assert fit_cli.tuner_of(scr, "odma", None, None) == ("gradient", fit_cli.EVALS, POOL)
    for name, d in DEPLOYMENTS.items():
        assert d.method in fit_cli.METHODS, name
        assert d.evals is None or (isinstance(d.evals, int) and d.evals >= 2), name


def test_equal_policies_start_their_held_out_searches_at_the_same_rate():
    """``tuner.fit``'s hints: a tuned policy equal to the default starts where the
    default does (a search's points depend on its start, so equal policies started
    apart would differ by the search's resolution: a spurious loss); a different one
    at its training goodput; the baselines at the start's."""
    from types import SimpleNamespace

    same = SimpleNamespace(params={"gamma": 0.2}, default_params={"gamma": 0.2},
                           start_goodput_rps=4.0, best_exact=4.4)
    h = fit_cli._hints("goodput_rps", same, ("static",))
    assert h == {"default": 4.0, "static": 4.0, "tuned": 4.0}
    other = SimpleNamespace(**{**vars(same), "params": {"gamma": 0.5}})
    assert fit_cli._hints("goodput_rps", other, ("static",))["tuned"] == 4.4
    # an objective other than goodput itself: no training value to start from
    assert "tuned" not in fit_cli._hints("goodput_rps,ttft_p99_s<=1", other, ())
