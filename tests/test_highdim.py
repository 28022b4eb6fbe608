"""High-dimensional tuning problems: odma-pb's space, a fleet problem (one policy,
several devices) and its settings checks. (odma-pb against the NumPy reference and odma:
tests/test_bucketed_reference.py; gradient checks along directions: tests/test_fit.py.)"""

import numpy as np
import pytest

from tuner.search.fitting import FitSettings
from tuner.objective.objectives import parse_objective
from tuner.objective.problem import Problem
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.objective.space import Space

SPEC = ScenarioSpec(n_requests=100, n_slots=32, max_batch=32)  # test_fit's shapes


@pytest.mark.parametrize("over,field", [({"checks": "some"}, "checks"),
                                        ({"check_dirs": 0}, "check_dirs")])
def test_bad_check_settings_are_refused(over, field):
    with pytest.raises(ValueError, match=field):
        FitSettings(**over).check()


def test_problem_scenarios_must_share_simulator_options():
    a = build_scenario(SPEC.replace(max_len=2048))
    b = build_scenario(SPEC.replace(max_len=1024))
    from models import get_system

    spec = get_system("odma")
    space = Space(spec, spec.default_params(2048))
    with pytest.raises(ValueError, match="max_len 2048 vs 1024"):
        Problem([a, b], "odma", space, parse_objective("tps"), 256)


def test_odma_pb_has_34_tunable_coordinates():
    from models import get_system

    spec = get_system("odma-pb")
    default = spec.default_params(1024)
    assert np.shape(default["gamma"]) == (16,) and np.shape(default["levels"]) == (16,)
    assert len(Space(spec, default).coords()) == 34


def test_a_fleet_ladder_has_a_row_of_rungs_per_device_when_goodputs_differ():
    from models import get_system
    from tuner.objective.problem import AROUND, plan_ladder

    scs = [build_scenario(SPEC.replace(hardware=hw, tp=1, max_len=2048))
           for hw in ("mlu370-x4", "a100-80gb")]
    rates, _, caps = plan_ladder(scs, "odma", {})
    g = [c["goodput_rps"] for c in caps]
    lo, hi, n = AROUND
    assert max(g) * lo > min(g) * hi  # ~1.3 vs ~7 req/s: one row cannot bracket both
    assert rates.shape == (2, n)
    for row, gi in zip(rates, g):
        assert row[0] == pytest.approx(lo * gi, rel=1e-5)
        assert row[-1] == pytest.approx(hi * gi, rel=1e-5)
    # a fleet problem runs each device's model and its own rungs: its value is the mean
    # of the devices' problems
    assert scs[0].hw != scs[1].hw
    space = Space(get_system("odma"), get_system("odma").default_params(2048))
    obj = parse_objective("goodput_rps")
    theta = space.to_theta(space.base)
    fleet = Problem(scs, "odma", space, obj, 256, rates)
    each = [Problem([sc], "odma", space, obj, 256, row).value(theta)[0]
            for sc, row in zip(scs, rates)]
    assert each[0] != pytest.approx(each[1])  # the devices differ
    assert fleet.value(theta)[0] == pytest.approx(np.mean(each), rel=1e-5)
    assert fleet.unit == 2 * Problem([scs[0]], "odma", space, obj, 256, rates[0]).unit
    same, _, _ = plan_ladder([scs[0], scs[0]], "odma", {})
    assert same.shape == (n,)  # equal goodputs share one row
