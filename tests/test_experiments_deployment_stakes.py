"""experiments/deployment_stakes.py: the criterion on the fit's own deployment table,
with the random settings vLLM would refuse counted from vLLM's start-up rule."""

import json

import numpy as np
import pytest

from experiments import deployment_stakes as ds
from experiments import stakes


def test_started_counts_only_what_vllm_refuses():
    case = {"goodput_rps": {"random": [0.5, 2.0, 1e-4], "best": 4.0}}
    r = ds.started(case, "goodput_rps", [None, None, "max_num_batched_tokens"])
    assert r["refused"] == 1 and r["refused_by_field"] == {"max_num_batched_tokens": 1}
    assert r["worst"] == 0.5 and r["best_over_worst"] == pytest.approx(8.0)
    assert "worst" not in ds.started(case, "goodput_rps", ["a", "b", "c"])


def test_a_policy_below_the_floor_makes_best_over_worst_a_bound():
    """A policy whose search stopped at the floor is known only to lie below it: the
    worst is the floor, best / worst at least best / floor, and so for the settings
    vLLM would start."""
    r = stakes.judge(2.0, [3.0, 0.01, 1.5], [False, True, False], floor=0.5)
    assert r["worst"] == 0.5 and r["best_over_worst"] == pytest.approx(6.0)
    assert r["best_over_worst_bound"] and r["below_floor"] == 1
    plain = stakes.judge(2.0, [3.0, 0.01, 1.5])
    assert plain["worst"] == 0.01 and not plain["best_over_worst_bound"]
    case = {"goodput_rps": {"random": [0.5, 0.01, 1e-4], "best": 4.0, "floor": 0.25,
                            "random_below_floor": [False, True, True]}}
    s = ds.started(case, "goodput_rps", [None, None, "max_num_seqs"])
    assert s["worst"] == 0.25 and s["best_over_worst"] == pytest.approx(16.0)
    assert s["below_floor"] == 1


def test_refusals_are_the_systems_rule_on_the_same_draw():
    from models import get_system
    from tuner.scenario import ScenarioSpec, build_scenario
    from tuner.scenario.deployments import DEPLOYMENTS

    why = ds.refused("h100-interactive", 12, quick=True)
    dep = DEPLOYMENTS["h100-interactive"]
    sc = build_scenario(ScenarioSpec(**{**dep.spec_fields(), **stakes.QUICK}))
    space, thetas = stakes.random_thetas(dep.system, sc, 12)
    rule = get_system(dep.system).refusal
    for w, th in zip(why, thetas):
        p = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in space.to_params(th).items()}
        r = rule(sc.deployment, p)
        assert w == (None if r is None else r[0])
    assert any(why) and not all(why)  # the box holds both kinds
    # a system without a start-up rule refuses nothing
    assert ds.refused("mlu370-azure", 3, quick=True) == [None] * 3


def test_a_small_run_writes_the_criterion(tmp_path):
    out = tmp_path / "d"
    assert ds.main(["--out", str(out), "--policies", "1", "--realisations", "1",
                    "--no-agreement", "--quick"]) == 0
    res = json.loads((out / "deployment_stakes.json").read_text())
    c = res["deployments"]["h100-interactive"]
    assert c["system"] == "vllm-v1" and c["requests"] == stakes.QUICK["n_requests"]
    for m in ("goodput_rps", "goodput_expected_rps"):
        r = c[m]
        assert r["meets"] == (r["best_over_worst"] >= stakes.BEST_OVER_WORST
                              and r["best_over_default"] >= stakes.BEST_OVER_DEFAULT)
        assert c["started"][m]["refused"] in (0, 1)
    assert "| h100-interactive | vllm-v1 |" in (out / "deployment_stakes.md").read_text()


@pytest.mark.parametrize("argv, msg", [
    (["--deployments", "nope"], "--deployments: unknown"),
    (["--policies", "0"], "--policies 0"),
    (["--floor-share", "1.5"], "--floor-share 1.5"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "d"
    assert ds.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not out.exists()
