"""experiments/fit_methods: methods compared paired on the same held-out samples, pooled
over seeds; bad arguments refused before any fit runs. The fits themselves are the
experiment's (minutes each); here the summary and the argument checks."""

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import fit_methods as fm

RESULT = Path(__file__).resolve().parents[1] / "experiments/results/fit_methods/fit_methods.json"


def _row(method, seed, tuned, default, evals=10, wall=5.0, outcome="win"):
    return {"method": method, "seed": seed, "tuned": tuned, "default": default,
            "baselines": {}, "exact_evals": evals, "wall_s": wall, "outcome": outcome,
            "params": {"max_num_seqs": 128.0}}


def test_summary_pairs_each_method_with_the_defaults_and_gradient_per_seed():
    rows = [_row("gradient", 0, [5.0, 6.0], [4.0, 5.0]),
            _row("gradient", 1, [3.0, 3.5], [3.0, 3.0], outcome="tie"),
            _row("random16", 0, [7.0, 7.5], [4.0, 5.0], evals=16, wall=9.0),
            _row("random16", 1, [4.0, 4.1], [3.0, 3.0], evals=18, wall=7.0)]
    s = fm.summarise(rows)
    g, r = s["gradient"], s["random16"]
    # pooled over seeds, paired sample by sample
    assert g["samples"] == 4 and g["seeds"] == [0, 1]
    assert g["vs_default"]["diff"] == pytest.approx(np.mean([1.0, 1.0, 0.0, 0.5]))
    assert r["vs_gradient"]["diff"] == pytest.approx(np.mean([2.0, 1.5, 1.0, 0.6]))
    assert r["vs_gradient"]["status"] == "better"
    assert "vs_gradient" not in g
    assert g["wins"] == 1 and r["wins"] == 2
    assert r["exact_evals_mean"] == 17 and r["wall_s_median"] == 8.0
    assert r["per_seed_mean"] == {"0": 7.25, "1": pytest.approx(4.05)}
    md = fm.render({"deployment": "h100-interactive", "seeds": [0, 1], "summary": s,
                    "runs": rows})
    assert "| random16 | `--method random --evals 16` | 5.650 |" in md


def test_one_seed_one_sample_is_undetermined_not_a_win():
    s = fm.summarise([_row("gradient", 0, [5.0], [4.0]), _row("cmaes24", 0, [6.0], [4.0])])
    assert s["cmaes24"]["vs_gradient"]["status"] == "undetermined"
    assert "undetermined" in fm.render({"deployment": "d", "seeds": [0], "summary": s,
                                        "runs": []})


@pytest.mark.parametrize("argv, msg", [
    (["--seeds", "a"], "--seeds 'a'"), (["--seeds", "0,0"], "--seeds '0,0'"),
    (["--seeds", "-1"], "--seeds '-1'"), (["--methods", "sgd"], "unknown ['sgd']")])
def test_bad_arguments_exit_2_before_any_fit(tmp_path, capsys, argv, msg):
    out = tmp_path / "out"
    assert fm.main(["--out", str(out), *argv]) == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_committed_result_summary_matches_its_runs():
    """The committed table is the summary of the runs it records (nothing edited)."""
    if not RESULT.is_file():
        pytest.skip("no committed fit_methods result")
    doc = json.loads(RESULT.read_text())
    again = fm.summarise(doc["runs"])
    for m, row in doc["summary"].items():
        assert again[m]["held_out_mean"] == pytest.approx(row["held_out_mean"])
        assert again[m]["vs_default"]["diff"] == pytest.approx(row["vs_default"]["diff"])


def test_the_fingerprint_covers_what_the_child_fits_ran(tmp_path, monkeypatch):
    """tuner.fit runs in child processes: the result's fingerprint must still cover the
    modules they loaded (from each child's policy provenance), not only this process's."""
    def fake(method, seed, runs, cache):
        return {**_row(method, seed, [5.0, 6.0], [4.0, 5.0]),
                "sources": ["tuner/fit.py", "tuner/search/engine_grid.py"]}
    monkeypatch.setattr(fm, "run_one", fake)
    out = tmp_path / "out"
    assert fm.main(["--out", str(out), "--seeds", "0", "--methods", "gradient"]) == 0
    files = json.loads((out / "fit_methods.json").read_text())["provenance"]["sources"][
        "files"]
    assert {"tuner/fit.py", "tuner/search/engine_grid.py"} <= set(files)
    assert "Made by" in (out / "fit_methods.md").read_text()
