"""Verdicts the held-out data cannot decide: fewer than two independent samples, or
paired differences that are all equal, give "undetermined" (a reason, no interval, exit
4 and nothing written unless --export-anyway); seeds that do not change a workload are
counted once."""

import dataclasses
import json

import numpy as np
import pytest

import tuner.objective.validation as val
from tuner import fit as fit_cli
from tuner.explain import render
from tuner.export.policy import load_policy
from tuner.scenario import ScenarioSpec


def _mets(per: dict, n_samples=None, n_independent=None) -> dict:
    out = {}
    for name, xs in per.items():
        out[name] = {"objective": float(np.mean(xs)), "objective_per_sample": list(xs),
                     "system": name}
        if n_samples is not None:
            out[name].update(n_samples=n_samples, n_independent=n_independent)
    return out


@pytest.mark.parametrize("per,why", [
    # one held-out sample (the case: "loss" at -0.0% with a zero-width interval)
    ({"tuned": [6.015], "default": [6.015], "static": [6.01507]}, "only 1 independent"),
    # two samples whose paired differences are equal: zero spread, no interval
    ({"tuned": [6.0, 5.0], "default": [5.0, 4.0], "static": [6.0178, 5.0178]},
     "same paired difference"),
    # every paired difference 0
    ({"tuned": [6.0, 5.0], "default": [6.0, 5.0], "static": [6.0, 5.0]},
     "every paired difference 0"),
])
def test_undetermined_without_an_interval(per, why):
    v = val.verdict(_mets(per), "goodput_rps", ("static",))
    assert v["outcome"] == "undetermined", v["sentence"]
    assert why in v["sentence"] and v["reason"] in v["sentence"]
    assert "interval [" not in v["sentence"] and "loss" not in v["sentence"]
    assert v["n_independent"] == len(per["tuned"])
    assert any(r["status"] == "undetermined" and r["ci"] is None
               for r in v["comparisons"].values())


def test_decided_verdicts_keep_their_intervals():
    tie = {"tuned": [6.0, 5.0, 4.0], "default": [5.0, 4.5, 3.0], "static": [6.1, 4.8, 4.2]}
    v = val.verdict(_mets(tie), "goodput_rps", ("static",))
    assert v["outcome"] == "tie" and "paired 95% interval" in v["sentence"]
    loss = {"tuned": [6.0, 5.0, 4.0], "default": [5.0, 4.5, 3.0],
            "static": [7.0, 6.1, 4.9]}
    v = val.verdict(_mets(loss), "goodput_rps", ("static",))
    assert v["outcome"] == "loss"
    lo, hi = v["comparisons"]["static"]["ci"]
    assert lo < hi < 0


def test_a_difference_within_the_goodput_searchs_resolution_decides_nothing():
    """Two policies whose goodputs were found through different rates differ by up to
    the bisection's 2% with nothing between them (capacity_search's bracket): a
    consistent -0.2% is no loss (the issue: the very default policy, searched from
    another start, was called worse); the same -0.2% of an objective read from one run
    is; a real gain stays a win."""
    small = {"tuned": [6.731, 6.70, 6.76, 6.72], "default": [6.743, 6.712, 6.772, 6.733],
             "static": [6.0, 5.9, 6.1, 6.0]}
    v = val.verdict(_mets(small), "goodput_rps", ("static",))
    assert v["outcome"] != "loss", v["sentence"]
    d = v["comparisons"]["default"]
    assert d["status"] == "indistinguishable" and d["ci"][1] < 0
    assert d["tolerance"] == pytest.approx(0.02 * np.mean(small["default"]))
    assert "resolution" in d["why"]
    assert val.verdict(_mets(small), "tps", ("static",))["outcome"] == "loss"
    # the expected goodput's bisection resolves 0.5%: a 1% loss is one
    one = {k: list(np.asarray(v) * (0.99 if k == "tuned" else 1.0))
           for k, v in small.items() if k != "tuned"}
    one["tuned"] = [x * 0.99 for x in small["default"]]
    assert val.verdict(_mets(one), "goodput_expected_rps", ("static",))["outcome"] == "loss"
    big = {**small, "tuned": [8.2, 8.4, 9.0, 7.5]}
    assert val.verdict(_mets(big), "goodput_rps", ("static",))["outcome"] == "win"


def test_policy_files_accept_every_outcome_the_verdict_gives():
    from tuner.export import policy

    assert set(val.OUTCOMES) == set(policy.OUTCOMES)


def test_duplicated_samples_are_counted_once_in_the_verdict():
    # 4 (window, seed) samples, 1 independent: undetermined, and it says why
    m = _mets({"tuned": [6.0], "default": [6.1], "static": [6.2]}, n_samples=4,
              n_independent=1)
    v = val.verdict(m, "goodput_rps", ("static",))
    assert v["outcome"] == "undetermined" and v["n_samples"] == 4
    assert "of 4 (window, seed) samples" in v["sentence"]


# --- validate(): independent samples -----------------------------------------------


@dataclasses.dataclass
class _WL:
    arrival_s: np.ndarray
    pred_tokens: np.ndarray

    @property
    def size(self):
        return self.arrival_s.size

    @property
    def valid(self):
        return np.ones(self.size, bool)


@dataclasses.dataclass
class _Cfg:
    capacity_tokens: float = 1000.0
    n_slots: int = 16  # as many as a fake window's requests need: no slot-table cut

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass
class _Sc:
    workload: _WL
    cfg: _Cfg

    def padded(self, n):
        return self


def _fake_build(seeded_arrivals: bool, seeded_preds: bool):
    def build(spec):
        rng = np.random.default_rng(spec.offset * 7919
                                    + (spec.seed if seeded_arrivals else 0))
        arr = np.sort(rng.uniform(0, 10, 8))
        prng = np.random.default_rng(spec.offset + (spec.seed if seeded_preds else 0))
        return _Sc(_WL(arr, prng.uniform(1, 100, 8)), _Cfg())
    return build


def _fake_evaluate(sc, system, params, objective=None):
    # reads arrivals only (like a simulator that ignores predictions)
    v = float(np.sum(sc.workload.arrival_s)) * (1.1 if system == "tuned" else 1.0)
    return {"objective": v, "goodput_rps": v, "ttft_p99_s": v / 3}


def _windows():
    base = ScenarioSpec(n_requests=100)
    hold = (base.replace(offset=10, n_requests=10), base.replace(offset=30, n_requests=10))
    return val.Windows(train=(base.replace(offset=0, n_requests=10),), holdout=hold,
                       whole=base, share=0.1, note="")


@pytest.mark.parametrize("arrivals,preds,want", [
    (True, True, 6),     # seeds change arrivals: 2 windows x 3 seeds, all independent
    (False, False, 2),   # seeds change nothing: one sample per window
    (False, True, 2),    # seeds change predictions the simulator does not read
])
def test_validate_counts_seeds_that_change_nothing_once(monkeypatch, arrivals, preds,
                                                        want):
    monkeypatch.setattr(val, "build_scenario", _fake_build(arrivals, preds))
    calls = []
    monkeypatch.setattr(val, "evaluate_many", lambda jobs, **kw: [
        calls.append(1) or _fake_evaluate(*job) for job in jobs])
    pol = {"tuned": ("tuned", {}), "default": ("default", {})}
    out = val.validate("x", pol, "goodput_rps", _windows(), 3)
    # equal inputs are not simulated again (2 policies x (6 window + 3 whole) samples)
    assert len(calls) == 2 * (9 if arrivals or preds else 2 + 1)
    for m in out.values():
        assert m["n_samples"] == 6 and m["n_independent"] == m["samples"] == want
        assert len(m["objective_per_sample"]) == want
        assert m["whole_trace"]["n_samples"] == 3
        assert m["whole_trace"]["n_independent"] == (3 if arrivals else 1)
    assert ("independent" in out["tuned"]["sample_note"])


def test_validate_without_the_whole_slice_runs_only_the_held_out_samples(monkeypatch):
    monkeypatch.setattr(val, "build_scenario", _fake_build(True, True))
    asked = []
    monkeypatch.setattr(val, "evaluate_many", lambda jobs, **kw: [
        asked.append(job[0]) or _fake_evaluate(*job) for job in jobs])
    pol = {"tuned": ("tuned", {}), "default": ("default", {})}
    win = _windows()
    out = val.validate("x", pol, "goodput_rps", win, 3, whole_slice=False)
    assert len(asked) == 2 * 6  # 2 policies x 2 windows x 3 seeds, no whole slice
    for m in out.values():
        assert "whole_trace" not in m
        assert m["n_samples"] == 6 and m["n_independent"] == 6


def test_sample_key_is_the_simulated_inputs_not_the_seed():
    b = _fake_build(False, False)
    s0, s1 = ScenarioSpec(seed=0, offset=5), ScenarioSpec(seed=9, offset=5)
    assert val.sample_key(b(s0)) == val.sample_key(b(s1))
    c = _fake_build(False, True)
    assert val.sample_key(c(s0)) != val.sample_key(c(s1))  # predictions differ
    sc = b(s0)
    other = _Sc(sc.workload, _Cfg(capacity_tokens=2000.0))
    assert val.sample_key(sc) != val.sample_key(other)     # the server config counts


# --- the fit CLI: exit code, nothing written, the JSON's verdict section --------------


from tests.test_fit import _fake_fit  # noqa: E402  (the same stand-in fit)


def _one_sample_validate(system, policies, objective, win, seeds, log=None,
                         whole_slice=True, **_):
    out = {}
    for name, (sys_name, _) in policies.items():
        v = 6.015 if name != "static" else 6.01507
        m = {"objective": v, "goodput_rps": v, "samples": 1, "n_samples": 2,
             "n_independent": 1, "ci": {"objective": [float("nan")] * 2}}
        out[name] = {**m, "system": sys_name, "objective_per_sample": [v],
                     "whole_trace": dict(m)}
    return out


def test_fit_cli_exits_4_and_writes_nothing_when_undetermined(tmp_path, capsys,
                                                             monkeypatch):
    out = tmp_path / "policy.json"
    monkeypatch.setattr(fit_cli, "fit", _fake_fit({"gamma": 1.0}))
    monkeypatch.setattr(val, "validate", _one_sample_validate)
    argv = ["--deployment", "mlu370-azure", "--n-requests", "256", "--windows", "1",
            "--quiet", "--out", str(out)]
    assert fit_cli.EXIT_CODES == {"loss": 3, "undetermined": 4}
    rc = fit_cli.main(argv)
    text = capsys.readouterr().out
    assert rc == 4, text
    line = next(s for s in text.splitlines() if s.startswith("verdict"))
    assert line.startswith("verdict (undetermined): ") and "interval [" not in line
    assert "only 1 independent held-out sample of 2" in line
    assert not out.exists()
    assert fit_cli.main(argv + ["--export-anyway"]) == 0
    raw = json.loads(out.read_text())
    v = raw["verdict"]
    assert v["outcome"] == "undetermined" and v["n_samples"] == 2
    assert v["n_independent"] == 1 and v["reason"] in v["sentence"]
    assert v["comparisons"]["static"]["ci"] is None
    text = render(load_policy(out))
    assert "Verdict (undetermined): " in text and "not a tie" in text
