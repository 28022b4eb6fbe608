"""experiments/engine_tune.py: bad arguments stop before any work, and (slow) a quick
case validates every method on the same held-out samples (auto_tune's rule itself:
tests/test_engine_grid.py)."""

import json

import numpy as np
import pytest

import hardware
from experiments import engine_tune
from models import get_system
from tuner.search.auto_tune_rate import auto_tune_pick


@pytest.mark.parametrize("argv, msg", [
    (["--cases", "nope"], "--cases: unknown"),
    (["--evals", "1"], "--evals 1"),
    (["--windows", "0"], "--windows 0"),
    (["--holdout-seeds", "0"], "--holdout-seeds 0"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "e"
    assert engine_tune.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.strip().count("\n") == 0 and not out.exists()


@pytest.mark.slow  # ~3 min: a quick case end to end
@pytest.mark.needs_traces("sharegpt-8k-lengths.csv")
def test_a_quick_case_validates_every_method_on_the_same_samples(tmp_path):
    out = tmp_path / "e"
    assert engine_tune.main(["--out", str(out), "--cases", "h100-sharegpt-tpot20",
                             "--quick", "--evals", "3", "--windows", "1"]) == 0
    res = json.loads((out / "engine_tune.json").read_text())
    c = res["cases"]["h100-sharegpt-tpot20"]
    assert list(c["methods"]) == list(engine_tune.METHODS)
    d = c["methods"]["default"]
    assert (d["params"]["max_num_seqs"], d["params"]["max_num_batched_tokens"]) \
        == (1024, 8192)
    gr = c["methods"]["grid"]  # the grid's best by exact goodput
    assert len(gr["grid"]) == 8
    best = max(gr["grid"], key=lambda g: g["train_goodput_rps"])
    assert {k: gr["params"][k] for k in best if k != "train_goodput_rps"} == \
        {k: v for k, v in best.items() if k != "train_goodput_rps"}
    at = c["methods"]["auto_tune"]  # auto_tune's rate rule: its kept setting and runs
    rule = ("request_rate", "throughput_rps", "met", "runs")
    kept = at["grid"][auto_tune_pick(at["grid"])]
    assert {k: at["params"][k] for k in kept if k not in rule} == \
        {k: v for k, v in kept.items() if k not in rule}
    assert at["runs"] == sum(g["runs"] for g in at["grid"])  # one training window
    assert all(g["runs"] >= 2 and g["request_rate"] == int(g["request_rate"])
               for g in at["grid"])
    n = {len(m["held_out"]["per_sample"]) for m in c["methods"].values()}
    assert n == {c["methods"]["default"]["held_out"]["n_independent"]}
    for m in ("auto_tune", "grid", "cmaes", "tpe"):
        r = c["methods"][m]
        per, ref = r["held_out"]["per_sample"], d["held_out"]["per_sample"]
        assert r["vs_default"]["diff"] == pytest.approx(
            sum(a - b for a, b in zip(per, ref)) / len(per))
    assert "| h100-sharegpt-tpot20 | auto_tune |" in (out / "engine_tune.md").read_text()
    for m in ("cmaes", "tpe"):  # a rate ladder per window per evaluation
        assert c["methods"][m]["runs"] >= c["methods"][m]["exact_evaluations"]
    # the screens: the start's goodput searched (its runs to completion), then the
    # best 4 (screen16: 2) in full, each search started from its own screen run
    sc, s16 = c["methods"]["screen"], c["methods"]["screen16"]
    for r, n_full, pool in ((sc, 4, 32), (s16, 2, 16)):
        assert (r["exact_evaluations"], r["screened"]) == (n_full, pool)
        assert r["start_runs"] >= 2  # the saturation run and at least one rate
        assert r["start_runs"] + pool + n_full <= r["runs"] \
            <= r["start_runs"] + pool + n_full * 24  # capacity_search's max_runs
        assert n_full < r["eval_equivalents"] < n_full + pool + r["start_runs"]
    # a baseline's work: its runs to completion's iterations x the slot table, on the
    # screens' scale; the ratios are the baseline's over the search's
    for b in (at, gr):
        assert b["simulated_request_iterations"] > b["runs"] * engine_tune.SLOTS
        assert b["eval_equivalents"] == pytest.approx(
            b["simulated_request_iterations"] / sc["unit"])
    for r in (sc, s16):
        for ref, b in (("auto_tune", at), ("grid", gr)):
            assert r[f"{ref}_work_ratio"] == pytest.approx(
                b["simulated_request_iterations"] / r["simulated_request_iterations"])
            assert r[f"{ref}_runs_ratio"] == pytest.approx(b["runs"] / r["runs"])
    assert s16["auto_tune_work_ratio"] > sc["auto_tune_work_ratio"]
    mp = c["map"]
    spreads = [v["spread"] for v in mp["influence"].values()]
    assert len(spreads) == 4 and spreads == sorted(spreads, reverse=True)
    g = mp["grid"]
    assert g["axes"] == list(mp["influence"])[:2]
    assert np.shape(g["goodput_rps"]) == np.shape(g["tpot_p99_s"]) == (len(g["y"]),
                                                                        len(g["x"]))
    assert (out / "engine_tune_h100-sharegpt-tpot20.png").stat().st_size > 10_000


def test_map_axes_span_the_range_and_hold_the_marked_points(tmp_path):
    """The map's axes: integers, log-spaced across the argument's range (capped at the
    slot table), widened to hold the default and tuned points; the plot is written with
    its provenance line."""
    from PIL import Image

    from experiments import engine_map

    spec = get_system("vllm-v1")
    seqs = engine_map.axis_values(spec, "max_num_seqs", 5, (1024.0, 96.0), upper=512)
    assert seqs[0] == 8 and seqs[-1] == 1024 and all(v == int(v) for v in seqs)
    assert np.all(np.diff(np.log(seqs)) > 0)
    util = engine_map.axis_values(spec, "gpu_memory_utilization", 5, (0.9,))
    assert util == [0.5, 0.62, 0.74, 0.86, 0.98]
    g = {"axes": ["max_num_seqs", "gpu_memory_utilization"], "x": seqs[:3], "y": util[:2],
         "load_rps": 3.0, "goodput_rps": [[1, 2, 3], [4, 5, 6]],
         "ttft_p99_s": [[.1, .2, .3], [.4, .5, None]], "refused": [[0, 0, 0], [0, 0, 1]],
         "tpot_p99_s": [[.01, .02, .03], [.04, .05, .06]], "default": [8, 0.5],
         "tuned": [seqs[2], 0.62]}
    # the axes begin where vLLM starts: a budget below max_num_seqs is refused
    h100 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    base = {"max_num_seqs": 1704.0, "max_num_batched_tokens": 15731.0,
            "gpu_memory_utilization": 0.93, "long_prefill_token_threshold": 435.0,
            "max_num_partial_prefills": 1.0, "block_size": 16.0}
    low = engine_map.feasible_lower(spec, h100, base, "max_num_batched_tokens")
    assert 1704 <= low < 1.2 * 1704
    assert spec.refusal(h100, {**base, "max_num_batched_tokens": low}) is None
    assert engine_map.feasible_lower(spec, h100, base, "max_num_seqs") == 8
    toks = engine_map.axis_values(spec, "max_num_batched_tokens", 5, (8192.0,), lower=low)
    assert toks[0] == low and toks[-1] == 16384
    png = tmp_path / "m.png"
    engine_map.plot("case", g, (1.0, 0.02), png, {"Description": "made by a test"})
    assert Image.open(png).text["Description"] == "made by a test"
