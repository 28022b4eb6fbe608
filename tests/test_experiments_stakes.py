"""experiments/stakes.py: the stakes criterion is computed from the goodputs it measured,
and bad arguments stop before any work."""

import json

import pytest

from experiments import stakes


def test_a_small_run_reports_the_criterion_from_its_own_goodputs(tmp_path):
    out = tmp_path / "s"
    assert stakes.main(["--out", str(out), "--cases", "builtin-tight", "--policies", "1",
                        "--realisations", "2", "--quick"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["stakes.json", "stakes.md"]
    res = json.loads((out / "stakes.json").read_text())
    assert res["provenance"]["commit"] and res["cases"].keys() == {"builtin-tight"}
    c = res["cases"]["builtin-tight"]
    assert c["distinct_realisations"] == 2 and c["requests"] == 200
    for metric in ("goodput_rps", "goodput_expected_rps"):
        r = c[metric]
        vals = r["random"] + [r["default"]]
        assert len(r["random"]) == 1 and min(vals) > 0
        assert r["best"] == max(vals) and r["worst"] == min(r["random"])
        assert r["best_over_worst"] == pytest.approx(r["best"] / r["worst"])
        assert r["best_over_default"] == pytest.approx(r["best"] / r["default"])
        assert r["meets"] == (r["best_over_worst"] >= stakes.BEST_OVER_WORST
                              and r["best_over_default"] >= stakes.BEST_OVER_DEFAULT)
        assert set(r["baselines"]) == set(stakes.BASELINES)
    # the random policy is drawn, not the default copied
    assert c["goodput_expected_rps"]["random"][0] != c["goodput_expected_rps"]["default"]
    assert "| builtin-tight | 200 |" in (out / "stakes.md").read_text()
    # the surrogate's rank agreement: the default and the random policy, each
    # temperature and exact mode
    a = c["agreement"]
    assert a["n"] == 2 and set(a["tau"]) == {"0.3", "0.1", "0"}
    assert all(t is None or -1 <= t <= 1 for t in a["tau"].values())
    assert "Kendall" in (out / "stakes.md").read_text()


@pytest.mark.parametrize("argv, msg", [
    (["--cases", "nope"], "--cases: unknown"),
    (["--policies", "0"], "--policies 0"),
    (["--realisations", "0"], "--realisations 0"),
    (["--system", "fifo"], "--system 'fifo'"),
    (["--system", "nope"], "--system 'nope'"),
])
def test_bad_arguments_stop_before_any_work(tmp_path, capsys, argv, msg):
    out = tmp_path / "s"
    assert stakes.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and not out.exists()
