"""The tuner benchmark: scoring and target logic on synthetic tasks, argument checks,
seeds that change each problem's workload, a tiny end-to-end run's JSON (schema,
provenance, every method's budget accounting, the gradient-check classes) and (slow) the
quick run's."""

import json
import math
from pathlib import Path

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
                                       (["--seeds", "0"], "seeds"),
                                       (["--guide-t", "0"], "guide-t"),
                                       (["--guide-t", "nan"], "guide-t")])
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
            assert sum(c[k] for k in ("agree", "disagree", "vanishing", "flat")) == \
                r["coords"]
    assert all(math.isfinite(x) for x in s["budgets"])


def test_an_output_path_that_is_a_file_exits_2_before_any_work(tmp_path, capsys):
    out = tmp_path / "f"
    out.write_text("x")
    assert bt.main(["--quick", "--out", str(out)]) == 2
    assert "not a directory" in capsys.readouterr().err and out.read_text() == "x"


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_tokenpd_tiers_seeds_build_different_workloads():
    """The eviction simulator reads arrivals, prompts and outputs (no predictions), and
    the trace's arrivals are replayed: each seed must take other requests."""
    import numpy as np

    from tuner.scenario import build_scenario

    pb = bt.PROBLEMS["tokenpd-tiers"]
    seen = []
    for seed in range(bt.FULL.seeds):
        (spec,) = pb.specs(bt.FULL, seed)
        wl = build_scenario(spec).workload
        seen.append((spec.offset, np.asarray(wl.prompt_tokens),
                     np.asarray(wl.output_tokens), np.asarray(wl.arrival_s)))
    offsets = [s[0] for s in seen]
    assert len(set(offsets)) == len(offsets)
    for i in range(len(seen)):
        for j in range(i):
            assert not all(np.array_equal(a, b) for a, b in zip(seen[i][1:], seen[j][1:]))


@pytest.mark.needs_traces("sharegpt-8k-lengths.csv")
def test_the_engine_problem_is_the_main_jobs_deployment_in_disjoint_windows():
    """``engine``: every field of the fit's default deployment (the README's main job),
    seed s the trace's s-th window of 1,000 requests."""
    from tuner.scenario.deployments import DEFAULT, get_deployment

    dep = get_deployment(DEFAULT)
    pb = bt.PROBLEMS["engine"]
    assert pb.system == dep.system
    offsets = []
    for seed in range(bt.FULL.seeds):
        (spec,) = pb.specs(bt.FULL, seed)
        for k, v in dep.fields:
            assert getattr(spec, k) == v, k
        assert spec.max_len is None and spec.seed == seed
        offsets.append(spec.offset)
    assert offsets == [s * 1000 for s in range(bt.FULL.seeds)]


# a run small enough for the default suite (~45 s of one core, XLA compiles mostly): the
# paper's 6-parameter ODMA on 20 requests, 1 seed, the gradient tuner (1 step) and
# random search (2 evaluations; no TPE or CMA-ES to compare with)
TINY = ["--problems", "odma", "--seeds", "1", "--methods", "gradient", "random",
        "--n-requests", "20", "--max-len", "512", "--n-slots", "16", "--grad-steps", "1",
        "--check-every", "1",
        "--check-dirs", "1", "--budget", "2", "--batch", "2", "--timing-reps", "1",
        "--temperatures", "0.3", "0.1", "--objective", "tps_mig", "--jobs", "1"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_tuners")
    assert bt.main(TINY + ["--out", str(out)]) == 0
    return out


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_tiny_run_accounts_every_methods_budget(tiny_run):
    from tuner.search.gradcheck import CLASSES, classify

    for ext in ("json", "md", "png"):
        assert (tiny_run / f"bench_tuners.{ext}").stat().st_size > 0
    doc = json.loads((tiny_run / "bench_tuners.json").read_text())
    # the PNG carries the run's fingerprint (experiments.stale reads it back)
    from PIL import Image

    assert Image.open(tiny_run / "bench_tuners.png").text.get("Source") == \
        doc["provenance"]["sources"]["sha256"]
    cfg = doc["settings"]
    assert doc["schema_version"] == bt.SCHEMA_VERSION == 4
    assert doc["methods"] == ["gradient", "random"] == list(cfg["methods"])
    assert doc["seeds"] == [0] and [p["name"] for p in doc["problems"]] == ["odma"]
    (t,) = doc["tasks"]
    assert t["dim"] == 6 and t["grad_cost"] > 0 and t["unit_request_iterations"] > 0
    found = [v for r in t["runs"].values() for v in r["value"] if v is not None]
    assert t["best_objective"] == max(found)
    for m, r in t["runs"].items():
        assert r["cost"] == sorted(r["cost"]) and r["cost"][-1] <= r["spent"] + 1e-6, m
        assert len(r["cost"]) == len(r["value"]) and r["wall_s"] > 0, m
    # random search: exactly its budget, one exact evaluation each, the start first
    rnd = t["runs"]["random"]
    assert rnd["spent"] == pytest.approx(cfg["budget"]) and len(rnd["value"]) == 2
    assert rnd["cost"] == pytest.approx([1.0, 2.0])
    assert rnd["value"][0] == pytest.approx(t["default_objective"])
    # the gradient tuner: every exact evaluation (start, 2 per checked direction, one
    # exact check) in full, and each relaxed gradient (one per checked temperature and
    # per step) at the measured ratio
    g = t["runs"]["gradient"]
    assert len(g["value"]) == 1 + 2 * cfg["check_dirs"] + 1
    n_grads = len(cfg["temperatures"]) + cfg["grad_steps"]
    assert g["spent"] == pytest.approx(len(g["value"]) + t["grad_cost"] * n_grads,
                                       rel=1e-6)
    # gradient quality: the four classes of the shared rule, counted from its checks
    q = doc["gradient_quality"]["odma"]
    assert sum(r["coords"] for r in q["per_parameter"].values()) == 6
    for k in range(len(cfg["temperatures"])):
        want = dict.fromkeys(CLASSES, 0)
        for c in q["checks"][k]:
            assert c["status"] == classify(c["relaxed"], c["exact_fd"])
            want[c["status"]] += 1
        got = dict.fromkeys(CLASSES, 0)
        for r in q["per_parameter"].values():
            for c in CLASSES:
                got[c] += r["by_t"][k][c]
        assert got == want
    # provenance at the top level, stamped as the markdown's last line
    from tuner.common.provenance import stamp_text

    prov = doc["provenance"]
    assert "experiments" in json.dumps(prov["sources"]["files"])
    assert "experiments/bench_tuners.py" in prov["sources"]["files"]
    md = (tiny_run / "bench_tuners.md").read_text()
    assert md.rstrip("\n").splitlines()[-1] == stamp_text(prov)
    assert "agree/disagree/vanishing/flat" in md


def test_gradient_quality_counts_the_shared_rules_classes():
    """Per parameter and temperature, the four classes of tuner.search.gradcheck.classify; a
    relaxed derivative of -1.7e-13 against an exact -7.75 counts as vanishing."""
    import numpy as np

    exact = {("a", 0): 1.0, ("a", 1): -7.75, ("b", 0): 2.0, ("b", 1): 0.0}
    relaxed = {"a": np.array([0.5, -1.7e-13]), "b": np.array([-1.0, 3.0])}

    class Space:
        names = ("a", "b")

        def coords(self):
            return list(exact)

    class Prob:
        space = Space()

        def fd(self, theta, coords, h, **kw):
            return {c: exact[c] for c in coords}

        def grad(self, theta, t):
            return 0.0, relaxed, {"log_objective": 0.0}

    cfg = bt.BenchConfig(temperatures=(0.3, 0.1))
    q = bt.gradient_quality(Prob(), {}, cfg)
    for k in range(2):
        assert q["per_parameter"]["a"]["by_t"][k] == {"agree": 1, "disagree": 0,
                                                      "vanishing": 1, "flat": 0}
        assert q["per_parameter"]["b"]["by_t"][k] == {"agree": 0, "disagree": 1,
                                                      "vanishing": 0, "flat": 1}
    assert q["per_parameter"]["a"]["coords"] == 2
    md = "\n".join(rep._quality_table({"settings": {"temperatures": [0.3, 0.1]},
                                       "gradient_quality": {"p": q}}))
    assert "| p | a | 2 | 1/0/1/0 | 1/0/1/0 |" in md


def test_the_provenance_covers_the_tuners_the_workers_ran():
    """The workers are spawned processes: the fingerprint must still list the tuners'
    sources, which the parent process never imported (a fresh interpreter here)."""
    import subprocess
    import sys

    code = ("import sys; from experiments import bench_tuners as bt; "
            "assert 'tuner.search.fitting' not in sys.modules; "
            "f = bt.run_provenance()['sources']['files']; "
            "print(all(p in f for p in ('tuner/search/fitting.py', "
            "'tuner/search/blackbox.py', 'tuner/objective/problem.py')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(bt.__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
