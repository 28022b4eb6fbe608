"""A family is a plug-in: the tiny fixture family (tests/fixture_family.py) runs through
evaluate, fit, sweep and the policy export without any change to them; each entry point
compiles once per (system, shapes)."""

import json

import numpy as np
import pytest

import tests.fixture_family  # noqa: F401  (registers family and system "toy")
from models import list_systems, metric_specs, trace_guard
from models.simulate import note_trace
from tuner import evaluate as ev
from tuner import fit as fit_cli
from tuner.objective.evaluate import evaluate
from tuner.objective.objectives import parse_objective
from tuner.export.policy import load_policy
from tuner.objective.problem import Problem
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.objective.space import Space
from tuner.sweep import main as sweep_main
from tuner.search.sweep import run_sweep
from models import get_system

SMALL = ScenarioSpec(n_requests=80, n_slots=16, max_batch=16)


@pytest.fixture(scope="module")
def sc():
    return build_scenario(SMALL)


def test_fixture_runs_through_evaluate(sc):
    assert "toy" in list_systems()
    slow = evaluate(sc, "toy", {"speed": 0.5}, objective="tps")
    fast = evaluate(sc, "toy", {"speed": 2.0}, objective="tps")
    assert slow["completed"] + slow["dropped"] == 80
    assert fast["makespan_s"] < slow["makespan_s"] and fast["tps"] > slow["tps"]
    # objectives accept what the family declares, and only that
    assert set(slow) - {"objective"} == set(metric_specs("toy"))
    with pytest.raises(ValueError, match="does not report.*migration_rate"):
        evaluate(sc, "toy", objective="tps,migration_rate<=0.01")
    with pytest.raises(ValueError, match="speed"):
        evaluate(sc, "toy", {"speed": 3.0}, objective="tps")
    with pytest.raises(ValueError, match="toy takes no options"):
        build_scenario(SMALL.replace(options=(("window", 10),))).options("toy")


def test_fixture_fits_exports_and_reevaluates(tmp_path, capsys):
    out = tmp_path / "toy.json"
    rc = fit_cli.main(["--deployment", "mlu370-azure", "--system", "toy", "--objective",
                       "tps", "--budget", "3",
                       "--explore", "2", "--n-requests", "240", "--windows", "1",
                       "--slots", "16", "--crn", "1", "--holdout-seeds", "1", "--quiet",
                       "--export-anyway", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    pol = load_policy(out)
    # one held-out window x one seed: one sample, which cannot decide a verdict
    assert pol["verdict"]["outcome"] == "undetermined"
    assert pol["system"] == "toy" and pol["metrics"]["baselines"].keys() == {"toy"}
    assert pol["metrics"]["tuned"]["objective"] >= pol["metrics"]["default"]["objective"]
    capsys.readouterr()
    assert ev.main(["--policy", str(out), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["system"] == "toy" and m["completed"] + m["dropped"] == 240


def test_fixture_sweeps(tmp_path):
    out = tmp_path / "sweep"
    assert sweep_main(["--system", "toy", "--grid", "speed=0.5,1,2", "--objective", "tps",
                       "--n-requests", "60", "--slots", "16", "--steps", "64", "--quiet",
                       "--out", str(out)]) == 0
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    tps = [r["metrics"]["tps"] for r in rows]
    assert len(rows) == 3 and tps[0] < tps[1] < tps[2]


@pytest.mark.parametrize("system", ["toy", pytest.param("odma", marks=pytest.mark.slow)])
def test_one_compile_per_system_and_shapes(system):
    """Every entry point compiles once for equal shapes and settings. The odma case is
    slow (five compiles of a real family, ~45 s): in the default run
    test_one_compile_per_system_and_shapes[toy] checks every entry point's reuse and
    test_a_real_familys_static_arguments_compile_once checks odma's (its options and
    its Space, the static arguments every entry point is keyed on)."""
    sc = build_scenario(SMALL.replace(n_requests=72))  # shapes no other test compiles
    obj = parse_objective("tps")
    spec = get_system(system)
    with trace_guard(1) as traces:
        for _ in range(2):  # equal shapes and settings: the second call reuses the code
            evaluate(sc, system, objective="tps")
            prob = Problem([sc], system, Space(spec, spec.default_params(sc.cfg.max_len)),
                           obj, 64)
            th = prob.space.to_theta(prob.space.base)
            prob.value(th)
            prob.grad(th, 0.1)
            prob.batch([th, th])
            run_sweep([sc], system, [{}], n_steps=64, objective="tps")
    where = {k[0] for k in traces}
    assert where == {"simulate_until_done", "Problem.value", "Problem.grad",
                     "Problem.batch", "sweep"}
    assert max(traces.values()) == 1


def test_a_real_familys_static_arguments_compile_once():
    """odma (family options, a vector parameter): rebuilt, its run options and its
    Space compare equal and hash alike, so the jitted entry points keyed on them (with
    the shapes) reuse their code; end to end through evaluate and Problem.value, each
    compiled once in two rounds. (Problem.grad, Problem.batch and the sweep key on
    the same static arguments: every entry point's reuse is checked on the fixture
    family by test_one_compile_per_system_and_shapes[toy].)"""
    sc = build_scenario(SMALL.replace(n_requests=68))  # shapes no other test compiles
    obj = parse_objective("tps")
    spec = get_system("odma")
    spaces = [Space(spec, spec.default_params(sc.cfg.max_len)) for _ in range(2)]
    assert spaces[0] == spaces[1] and hash(spaces[0]) == hash(spaces[1])
    opts = [build_scenario(SMALL.replace(n_requests=68)).options("odma") for _ in range(2)]
    assert opts[0] == opts[1] and hash(opts[0]) == hash(opts[1])
    assert opts[0].family is not None  # options of its own (window, refresh_every)
    with trace_guard(1) as traces:
        for space in spaces:
            evaluate(sc, "odma", objective="tps")
            prob = Problem([sc], "odma", space, obj, 64)
            prob.value(prob.space.to_theta(prob.space.base))
    assert {k[0] for k in traces} == {"simulate_until_done", "Problem.value"}
    assert max(traces.values()) == 1


def test_trace_guard_catches_a_retrace():
    with trace_guard(1):
        note_trace("x", "opts", np.zeros(3))
        with pytest.raises(AssertionError, match="traced 2 times"):
            note_trace("x", "opts", np.zeros(3))


def test_family_options_travel_through_the_scenario(capsys):
    base = ["--system", "odma", "--n-requests", "80", "--slots", "16", "--json"]
    assert ev.main([*base, "--option", "window=64", "--option", "refresh_every=8"]) == 0
    assert json.loads(capsys.readouterr().out)["completed"] == 80
    assert ev.main([*base, "--option", "windows=64"]) == 2
    assert "unknown option(s) ['windows']" in capsys.readouterr().err
    sc = build_scenario(SMALL.replace(options=(("window", 64),)))
    assert sc.inputs("odma").extra.shape == (64,) and sc.inputs("s3").extra is None
    spec = ScenarioSpec.from_dict({**SMALL.to_dict(), "options": {"window": 64}})
    assert spec == SMALL.replace(options=(("window", 64),))
    legacy = {k: v for k, v in SMALL.to_dict().items() if k not in ("options", "block")}
    old = ScenarioSpec.from_dict({**legacy, "window": 64, "refresh_every": 8,
                                  "refresh_check": 4})
    assert old.options == (("refresh_every", 8), ("window", 64)) and old.block == 4


def test_every_systems_defaults_survive_the_gradient_round_trip():
    """Each domain's ``fwd(inv(default))`` gives every system's default back for each
    gradient-tunable parameter (a tuner starts from that theta): no domain's inverse
    overflows (the positive domains' inverse softplus did, above 88, turning S3's
    bucket bounds into inf) or loses the value."""
    import jax.numpy as jnp
    import numpy as np

    from models import get_system, list_systems, validate_params
    from models.domains import get_domain

    checked = 0
    for name in list_systems():
        spec = get_system(name)
        try:
            base = validate_params(spec, {}, 4096)
        except ValueError:  # defaults that need a deployment (vllm-v1's engine's)
            continue
        for p in spec.params:
            dom = get_domain(p.domain)
            if dom.fwd is None or p.name not in base:
                continue
            x = jnp.asarray(base[p.name], jnp.float32)
            np.testing.assert_allclose(np.asarray(dom.fwd(dom.inv(x, p), p)),
                                       np.asarray(x), rtol=1e-3, atol=1e-3,
                                       err_msg=f"{name}.{p.name}")
            checked += 1
    assert checked > 10
