"""The one rule that classifies a gradient check (tuner.search.gradcheck.classify), and what the
fit does with each class: a relaxed derivative far below the exact difference's scale
is "vanishing", never "agree", and the fit gives that coordinate exact CRN finite
differences, like a disagreeing one."""

import math

import numpy as np
import pytest

from tuner.search import gradcheck as gc
from tuner.search.fitting import FitSettings, _floor, _initial_checks, estimators


@pytest.mark.parametrize("relaxed,exact,want", [
    (-1.7e-13, -7.75, "vanishing"),    # issue 28: same sign, 13 orders of magnitude apart
    (1.7e-13, -7.75, "vanishing"),     # its sign is noise: vanishing, not "disagree"
    (-0.0999, -10.0, "vanishing"),     # just under 1% of the exact difference
    (-0.1, -10.0, "agree"),            # 1% exactly: not vanishing
    (0.5, 2.0, "agree"),
    (-0.5, 2.0, "disagree"),
    (0.0, 2.0, "vanishing"),           # a relaxed derivative of 0 against a real slope
    (3.0, 0.0, "flat"),                # nothing to agree with
    (3.0, 5e-7, "flat"),               # below float32 rounding of the log objective
    (-3.0, -2e-6, "agree"),            # above it: a real (small) slope
    (math.nan, 1.0, "disagree"),
    (1.0, math.inf, "disagree"),
])
def test_classify_hand_made_numbers(relaxed, exact, want):
    assert gc.classify(relaxed, exact) == want


def test_the_rule_is_stated_with_its_thresholds():
    assert gc.FLAT_TOL == 1e-6 and gc.VANISHING_RATIO == 1e-2
    doc = gc.classify.__doc__
    for word in ("flat", "vanishing", "agree", "disagree", "-1.7e-13"):
        assert word in doc
    assert set(gc.CLASSES) == {"agree", "disagree", "vanishing", "flat"}


class _Space:
    def __init__(self, n):
        self.n = n

    def coords(self):
        return [("p", i) for i in range(self.n)]


class _Problem:
    """A problem with hand-made exact differences and relaxed gradients (per
    temperature), so the fit's decision is checked without a simulator."""
    n_steps = 1

    def __init__(self, exact, relaxed_by_t):
        self.exact = exact
        self.relaxed = relaxed_by_t
        self.space = _Space(len(exact))

    def value(self, theta):
        return 1.0, {"log_objective": 0.0}

    def fd(self, theta, coords, h, scheme="central", base=None, t=0.0):
        return {c: float(self.exact[c[1]]) for c in coords}

    def grad(self, theta, t):
        return 0.0, {"p": np.asarray(self.relaxed[t], np.float64)}, {"log_objective": 0.0}


def test_the_fit_gives_a_vanishing_coordinate_exact_differences():
    # coordinate 0 agrees, 1 vanishes (the numbers), 2 disagrees, 3 is flat
    exact = [1.0, -7.75, 2.0, 0.0]
    relaxed = {0.3: [0.8, -1.7e-13, -1.0, 0.4], 0.1: [0.9, -1.7e-13, -1.0, 0.2]}
    prob = _Problem(exact, relaxed)
    st = FitSettings(temperatures=(0.3, 0.1), checks="coords")
    logs = []
    state = _initial_checks(prob, prob.space, {"p": np.zeros(4)}, st, logs.append)
    assert state["estimators"] == {"p[0]": "relaxed", "p[1]": "fd-crn",
                                   "p[2]": "fd-crn", "p[3]": "relaxed"}
    statuses = [c["status"] for c in state["checks"][-1]]
    assert statuses == ["agree", "vanishing", "disagree", "flat"]
    # and reported as such, in the log line of its estimator
    line = next(s for s in logs if s.startswith("estimator p[1]"))
    assert "fd-crn" in line and "vanishes" in line
    assert any("VANISHING" in s for s in logs)


def test_vanishing_checks_do_not_count_towards_the_temperature_floor():
    mk = gc._make
    warm = [mk("p", 0, 1.0, 1.0), mk("p", 1, 1.0, 1.0)]          # 2 of 2 usable
    cold = [mk("p", 0, 1e-9, 1.0), mk("p", 1, -1e-9, 1.0)]       # 0 of 2: vanishing
    assert _floor({0.3: warm, 0.03: cold}, (0.3, 0.03)) == 0.3
    assert estimators(cold) == {"p[0]": "fd-crn", "p[1]": "fd-crn"}


def test_grad_check_experiment_uses_the_rule_and_stamps_its_files(tmp_path,
                                                                 monkeypatch):
    """experiments.grad_check: each row classified by the shared rule; the JSON carries
    its provenance at the top level and the markdown ends with its stamp."""
    import json

    from experiments import grad_check as gck
    from tuner.common.provenance import stamp_text

    def fake_run(spec, system, objective, temps, crn, h_relaxed, h_exact):
        rows = [{"temperature": t, "param": "gamma[0]", "grad": -1.7e-13,
                 "relaxed_value": 0.0, "implementation": gck._cmp(-1.7e-13, -1.8e-13),
                 "bias": gck._cmp(-1.7e-13, -7.75)} for t in temps]
        return {"system": system, "objective": objective, "scenario": {}, "crn": crn,
                "h_relaxed": h_relaxed, "h_exact": h_exact, "exact_value": 1.0,
                "rows": rows}

    monkeypatch.setattr(gck, "run", fake_run)
    assert gck.main(["--temperatures", "0.1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "grad_check.json").read_text())
    (row,) = doc["rows"]
    assert row["bias"]["status"] == "vanishing" and row["bias"]["usable"] is False
    assert row["implementation"]["status"] == "flat"  # both below float32 rounding
    prov = doc["provenance"]
    assert prov["command"] and prov["sources"]["sha256"]
    assert "experiments/grad_check.py" in prov["sources"]["files"]
    md = (tmp_path / "grad_check.md").read_text().rstrip("\n").splitlines()
    assert md[-1] == stamp_text(prov)
    assert any("| **vanishing** |" in ln for ln in md)
