"""The tuner benchmark: scoring helpers, and a quick end-to-end run's JSON structure."""

import json
import math

import pytest

from experiments import bench_tuners as bt


def test_best_so_far_is_a_running_max_over_cost():
    costs, values = [1, 2, 3, 5], [3.0, 1.0, 4.0, 2.0]
    assert bt.best_so_far(costs, values, [0.5, 1, 2.5, 4, 10]) == [None, 3.0, 3.0, 4.0,
                                                                   4.0]


def test_cost_to_reach_uses_a_relative_one_percent_band():
    costs, values = [1, 2, 3], [90.0, 99.2, 100.0]
    assert bt.cost_to_reach(costs, values, 100.0) == 2.0
    assert bt.cost_to_reach(costs, values, 100.0, tol=0.0) == 3.0
    assert bt.cost_to_reach(costs, values, 200.0) is None
    # "never" counts as infinite: a median over mostly-unreached seeds is None
    assert bt._median([1.0, None, None]) is None
    assert bt._median([1.0, 3.0, None]) == 3.0


def test_missing_optional_dependency_exits_2(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "cma":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    assert bt.main(["--quick", "--out", "/nonexistent/never-written"]) == 2
    assert "pip install -e .[bench]" in capsys.readouterr().err


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
@pytest.mark.slow  # a benchmark run (~2 min); the scoring helpers above are tested fast
def test_quick_run_writes_comparable_monotone_curves(tmp_path):
    pytest.importorskip("optuna")
    pytest.importorskip("cma")
    assert bt.main(["--quick", "--out", str(tmp_path)]) == 0
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"bench_tuners.{ext}").stat().st_size > 0
    assert not list(tmp_path.glob(".*.tmp"))
    doc = json.loads((tmp_path / "bench_tuners.json").read_text())
    cfg, s = doc["settings"], doc["summary"]
    assert doc["methods"] == list(bt.METHODS)
    assert len(doc["seeds"]) == cfg["seeds"] == 2
    assert len(doc["tasks"]) == len(cfg["traces"]) * cfg["seeds"]
    budgets = s["budgets"]
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets)
    for t in doc["tasks"]:
        assert t["unit_request_iterations"] == t["n_crn"] * t["n_steps"] * t["n_slots"]
        found = [v for r in t["runs"].values() for v in r["value"] if v is not None]
        assert t["best_objective"] == max(found)
        for m in bt.METHODS:
            r = t["runs"][m]
            assert r["cost"] == sorted(r["cost"]) and r["cost"][-1] <= r["spent"] + 1e-6
            assert len(r["cost"]) == len(r["value"]) > 0
        # the black-box methods get their budget in exact evaluations, one unit each
        for m in ("tpe", "cma", "random"):
            assert t["runs"][m]["spent"] == pytest.approx(len(t["runs"][m]["value"]))
            assert len(t["runs"][m]["value"]) >= cfg["budget"]
        # all methods start from the same default policy on the same problem
        assert t["runs"]["tpe"]["value"][0] == pytest.approx(t["default_objective"])
        assert t["runs"]["gradient"]["value"][0] == pytest.approx(
            t["default_objective"], rel=1e-5)
    for tr in cfg["traces"]:
        for m in bt.METHODS:
            c = s["curves"][tr][m]
            assert len(c["best"]) == cfg["seeds"]
            for seed_curve in c["best"]:
                assert len(seed_curve) == len(budgets)
                seen = [x for x in seed_curve if x is not None]
                assert seen == sorted(seen) and seen  # best-so-far never decreases
                # once a method has a value it keeps one until its budget runs out
                first = seed_curve.index(seen[0])
                assert all(x is not None for x in seed_curve[first:first + len(seen)])
            for st, nm in zip(c["stats"], c["normalised"]):
                if st["n"]:
                    assert st["min"] <= st["median"] <= st["max"]
                    assert nm["max"] <= 1.0 + 1e-9
            r = s["to_within_1pct"][tr][m]
            assert r["seeds"] == cfg["seeds"] and len(r["per_seed"]) == cfg["seeds"]
            assert r["reached"] == sum(x is not None for x in r["per_seed"])
        # the method that found the best on a seed reached the 1% band there
        reached = [any(s["to_within_1pct"][tr][m]["per_seed"][k] is not None
                       for m in bt.METHODS) for k in range(cfg["seeds"])]
        assert all(reached)
    for g in bt.GRADIENT_METHODS:
        assert set(s["ratio_tpe_over"][g]["all"]) == {"value", "bound", "note"}
        assert isinstance(s["target_met"][g], bool)
    assert all(math.isfinite(x) for x in budgets)
