"""The paged server against Vidur's published run (experiments/vidur_check.py) on a
short slice of the same request list."""

import json

import pytest

from experiments import vidur_check as vc

pytestmark = pytest.mark.skipif(not vc.reference_path().is_file(),
                                reason="../shared/reference request list not present")


def test_short_slice_scheduling_matches_vidur_once_step_time_is_aligned(tmp_path):
    assert vc.main(["--out", str(tmp_path), "--n-requests", "300"]) == 0
    res = json.loads((tmp_path / "vidur_check.json").read_text())
    md = (tmp_path / "vidur_check.md").read_text()
    assert "| ttft_p90_s |" in md and "Diagnostic" in md
    run = res["runs"]["v0"]
    steady, scaled, sat = run["steady"], run["scaled"], run["saturating"]
    assert steady["requests"] == 300 and steady["completed"] == 300
    # steady 0.25 req/s: no preemption (Vidur: 0 restarts), memory never exhausted
    assert steady["preemptions"] == 0 and steady["peak_kv_share"] <= 1.0
    # one step-time factor aligns TPOT p50; TTFT then follows the scheduling rules alone
    # (not exactly: slower steps batch more, so TPOT does not scale linearly)
    assert scaled["tpot_p50_s"] == pytest.approx(vc.VIDUR["tpot_p50_s"], rel=0.1)
    for k in ("ttft_p50_s", "ttft_p90_s"):
        assert abs(scaled[k] / vc.VIDUR[k] - 1.0) <= vc.TOLERANCE, k
    # twice the load preempts and queues
    assert sat["preemptions"] > 0 and sat["ttft_p99_s"] > steady["ttft_p99_s"]


def test_bad_arguments_write_nothing(tmp_path):
    out = tmp_path / "o"
    assert vc.main(["--out", str(out), "--schedulers", "v9"]) == 2
    assert vc.main(["--out", str(out), "--n-requests", "1"]) == 2
    assert not out.exists()
