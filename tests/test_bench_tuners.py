"""The tuner benchmark: scoring and target logic on synthetic tasks, argument checks,
and (slow) a quick end-to-end run's JSON structure."""

import json
import math

import pytest

from experiments import bench_tuners as bt
from experiments import bench_tuners_report as rep


def test_best_so_far_is_a_running_max_over_cost():
    costs, values = [1, 2, 3, 5], [3.0, 1.0, 4.0, 2.0]
    assert rep.best_so_far(costs, values, [0.5, 1, 2.5, 4, 10]) == [None, 3.0, 3.0, 4.0,
                                                                    4.0]


def test_cost_to_reach_uses_a_relative_one_percent_band():
    costs, values = [1, 2, 3], [90.0, 99.2, 100.0]
    assert rep.cost_to_reach(costs, values, 100.0) == 2.0
    assert rep.cost_to_reach(costs, values, 100.0, tol=0.0) == 3.0
    assert rep.cost_to_reach(costs, values, 200.0) is None
    # "never" counts as infinite: a median over mostly-unreached seeds is None
    assert rep._median([1.0, None, None]) is None
    assert rep._median([1.0, 3.0, None]) == 3.0


def _run(costs, values):
    return {"cost": costs, "value": values, "spent": max(costs), "wall_s": 0.0}


def _task(problem, seed, dim, reach):
    """A task where method m first gets within 1% of 100 at cost reach[m] (None: never)."""
    runs = {}
    for m in bt.METHODS:
        c = reach.get(m)
        runs[m] = (_run([1.0, c], [50.0, 100.0]) if c is not None
                   else _run([1.0, 40.0], [50.0, 60.0]))
    return {"problem": problem, "seed": seed, "dim": dim, "grad_cost": 4.0,
            "best_objective": 100.0, "default_objective": 50.0, "runs": runs}


def test_summary_compares_with_the_better_black_box_method_and_counts_wins():
    wins = {"gradient": 10.0, "hybrid": 20.0, "gradient-coords": 90.0, "tpe": 60.0,
            "cmaes": 40.0, "random": 80.0}           # cmaes / gradient = 4x
    loses = dict(wins, gradient=30.0, hybrid=None)   # 40 / 30 = 1.33x
    low_d = dict(wins)                               # a win at d < 16 does not count
    tasks = ([_task("a", s, 34, wins) for s in range(3)]
             + [_task("b", s, 16, loses) for s in range(3)]
             + [_task("c", s, 6, low_d) for s in range(3)])
    s = rep.summarise(tasks, ["a", "b", "c"], list(bt.METHODS), 40)
    q = s["ratio_blackbox_over"]
    assert q["a"]["gradient"]["value"] == pytest.approx(4.0)
    assert q["a"]["gradient"]["versus"] == "cmaes"
    assert q["b"]["gradient"]["value"] == pytest.approx(40.0 / 30.0)
    assert q["b"]["hybrid"]["value"] is None and "did not reach" in q["b"]["hybrid"]["note"]
    assert s["target"]["high_dim_problems"] == ["a", "b"]
    assert s["target"]["won"] == ["a"] and s["target"]["met"] is False
    both = tasks + [_task("d", s, 20, wins) for s in range(3)]
    assert rep.summarise(both, ["a", "b", "c", "d"], list(bt.METHODS),
                         40)["target"]["met"] is True
    # neither black-box method reached: the ratio is a bound from their spending
    never = dict(wins, tpe=None, cmaes=None)
    s = rep.summarise([_task("e", k, 34, never) for k in range(3)], ["e"],
                      list(bt.METHODS), 40)
    assert s["ratio_blackbox_over"]["e"]["gradient"]["bound"] == pytest.approx(40 / 10)
    assert s["target"]["won"] == ["e"]


def test_missing_optional_dependency_exits_2(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "cma":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    assert bt.main(["--quick", "--out", "/nonexistent/never-written"]) == 2
    assert "pip install -e ." in capsys.readouterr().err


@pytest.mark.parametrize("argv,word", [(["--problems", "nope"], "problems"),
                                       (["--methods", "sgd"], "methods"),
                                       (["--seeds", "0"], "seeds")])
def test_bad_arguments_exit_2_before_any_work(tmp_path, capsys, argv, word):
    out = tmp_path / "o"
    assert bt.main(["--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert word in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
@pytest.mark.slow  # a benchmark run (~2 min); scoring and arguments are tested above
def test_quick_run_writes_comparable_monotone_curves(tmp_path):
    assert bt.main(["--quick", "--seeds", "1", "--jobs", "1", "--out", str(tmp_path)]) == 0
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"bench_tuners.{ext}").stat().st_size > 0
    assert not list(tmp_path.glob(".*.tmp"))
    doc = json.loads((tmp_path / "bench_tuners.json").read_text())
    cfg, s = doc["settings"], doc["summary"]
    assert doc["methods"] == list(cfg["methods"])
    assert len(doc["tasks"]) == len(cfg["problems"]) * cfg["seeds"]
    for t in doc["tasks"]:
        assert t["dim"] == 34 and t["grad_cost"] > 0
        found = [v for r in t["runs"].values() for v in r["value"] if v is not None]
        assert t["best_objective"] == max(found)
        for m in doc["methods"]:
            r = t["runs"][m]
            assert r["cost"] == sorted(r["cost"]) and r["cost"][-1] <= r["spent"] + 1e-6
        for m in ("tpe", "cmaes", "random"):  # exactly the budget, one unit each
            assert t["runs"][m]["spent"] == pytest.approx(cfg["budget"])
            assert len(t["runs"][m]["value"]) == cfg["budget"]
            assert t["runs"][m]["value"][0] == pytest.approx(t["default_objective"])
    q = doc["gradient_quality"]["odma-16"]["per_parameter"]
    assert sum(r["coords"] for r in q.values()) == 34
    for r in q.values():
        for c in r["by_t"]:
            assert c["agree"] + c["disagree"] + c["flat"] == r["coords"]
    assert all(math.isfinite(x) for x in s["budgets"])


def test_an_output_path_that_is_a_file_exits_2_before_any_work(tmp_path, capsys):
    out = tmp_path / "f"
    out.write_text("x")
    assert bt.main(["--quick", "--out", str(out)]) == 2
    assert "not a directory" in capsys.readouterr().err and out.read_text() == "x"
