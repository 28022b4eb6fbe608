"""experiments/kunserve_tables.py: the quick run (2 instances, 60 requests per trace)
writes the five files with the agreed shape (per trace and system metrics, the rescale
rule and factor, SLO violation shares, claims with verdicts), every request completes,
and bad arguments exit 2 with nothing written."""

import json
import math

import numpy as np
import pytest

FILES = ["kunserve_memory.png", "kunserve_slo.png", "kunserve_tables.json",
         "kunserve_tables.md", "kunserve_throughput.png"]
VERDICTS = {"supported", "contradicted", "not reproduced", "not exercised"}
CORE = {"p99_ttft", "slo_violations", "bubbles_token", "bubbles_lookahead", "p50_tpot",
        "bubbles_reduction"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    pytest.importorskip("models.dropping")
    from experiments.kunserve_tables import main

    out = tmp_path_factory.mktemp("kunserve")
    assert main(["--quick", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def res(quick_run):
    return json.loads(quick_run.joinpath("kunserve_tables.json").read_text())


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_files_exist_and_no_temporaries(quick_run):
    assert sorted(p.name for p in quick_run.iterdir()) == FILES
    for name in FILES:
        if name.endswith(".png"):
            assert quick_run.joinpath(name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = quick_run.joinpath("kunserve_tables.md").read_text()
    for text in ("## The paper's claims vs simulation", "## azure-conv+sharegpt",
                 "## mooncake+sharegpt",
                 "12.7-72.2x", "7.2-12.8 pp", "21.9%", "8.3%", "+15.8 to +22.7%",
                 "qwen-2.5-14b", "a100-80gb", "factor s", "quick run"):
        assert text in md, text


def test_setup_and_rescale(res):
    from experiments.kunserve_tables import QUICK, TARGET_DEMAND, workload_name

    s = res["setup"]
    assert s["quick"] is True and s["model"] == "qwen-2.5-14b"
    assert s["hardware"] == "a100-80gb" and s["n_instances"] == QUICK["n_instances"]
    for k in ("rescale_rule", "window_rule", "slo_rule", "claims_rule", "workload"):
        assert isinstance(s[k], str) and s[k], k
    assert s["kv_capacity_tokens_cluster"] == pytest.approx(
        s["kv_capacity_tokens_per_instance"] * QUICK["n_instances"])
    assert list(res["traces"]) == [workload_name(*w) for w in QUICK["workloads"]]
    assert s["workloads"] == list(res["traces"])
    for name, e in res["traces"].items():
        rs = e["rescale"]
        assert _num(rs["factor"]) and rs["factor"] > 0, name
        assert rs["evaluations"] and rs["mean_demand_share"] <= TARGET_DEMAND + 1e-9
        chosen = [v for v in rs["evaluations"] if v["factor"] == rs["factor"]]
        assert len(chosen) == 1 and chosen[0]["mean_demand_share"] <= TARGET_DEMAND
        # the chosen factor is the heaviest load obeying the rule among those tried
        assert all(v["factor"] >= rs["factor"] for v in rs["evaluations"]
                   if v["mean_demand_share"] <= TARGET_DEMAND)
        assert isinstance(rs["bursts_throttle"], bool)
        assert e["window"]["burst_rate_ratio"] >= 1.0
        assert e["arrivals"]["n"] == QUICK["n_requests"]


def test_runs(res):
    from experiments.kunserve_tables import QUICK, SYSTEMS, TOKEN_MB

    for name, e in res["traces"].items():
        assert set(e["runs"]) == set(SYSTEMS) | {TOKEN_MB}, name
        for lab, r in e["runs"].items():
            assert r["n_requests"] == QUICK["n_requests"]
            assert r["metrics"]["completed"] == QUICK["n_requests"], (name, lab)
            for k, v in r["family_metrics"].items():
                assert _num(v), (name, lab, k)
            assert 0 <= r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"]
            assert 0 < r["tpot_p50_s"] <= r["tpot_p99_s"]
            assert r["throughput_rps"] > 0
            tm = r["timeline"]
            assert tm["steps"] > 0 and tm["mean_demand_share"] >= 0
            assert tm["peak_held_share"] <= tm["peak_cap_share"] + 1e-6, (name, lab)
            assert sum(r["throughput_series"]["completions"]) == QUICK["n_requests"]
        m = {lab: r["metrics"] for lab, r in e["runs"].items()}
        for sy in ("vllm-dp", "infercept", "llumnix"):
            assert m[sy].get("drops", 0) == 0 and m[sy].get("restores", 0) == 0, sy
        assert m["vllm-dp"].get("swap_gib", 0) == 0
        assert m["vllm-dp"].get("migrations", 0) == 0


def test_slo(res):
    from experiments.kunserve_tables import BASELINES, SLO_FACTORS

    for name, e in res["traces"].items():
        sl = e["slo"]
        assert sl["factors"] == list(SLO_FACTORS)
        assert sl["best_ttft_baseline"] in BASELINES
        ref = min(e["runs"][b]["ttft_p50_s"] for b in BASELINES)
        assert sl["ttft_p50_ref_s"] == pytest.approx(ref)
        for lab, row in sl["systems"].items():
            for k in ("any", "ttft", "tpot"):
                v = np.array(row[k])
                assert v.shape == (len(SLO_FACTORS),)
                assert np.all((v >= 0) & (v <= 1)), (name, lab, k)
                assert np.all(np.diff(v) <= 1e-12), (name, lab, k)  # looser SLO
                assert row[f"mean_{k}"] == pytest.approx(v.mean())
            assert np.all(np.array(row["any"]) >= np.array(row["ttft"]) - 1e-12)
        # the best baseline misses its own TTFT SLO at factor 1 for at most half
        assert sl["systems"][sl["best_ttft_baseline"]]["ttft"][0] <= 0.5 + 1e-9


def test_claims(res):
    from experiments.kunserve_tables import NO_EFFECT, WITHIN, exercised

    by_id = {c["id"]: c for c in res["claims"]}
    assert CORE <= set(by_id), set(by_id)
    assert by_id["p99_ttft"]["paper_low"] == 12.7 and by_id["p99_ttft"]["paper_high"] == 72.2
    assert by_id["slo_violations"]["paper_low"] == 0.072
    assert by_id["bubbles_token"]["paper_low"] == 0.219
    assert by_id["bubbles_lookahead"]["paper_low"] == 0.083
    assert by_id["p50_tpot"]["paper_high"] == 0.227
    for cid in ("p99_ttft", "slo_violations", "p50_tpot"):
        c = by_id[cid]
        assert len(c["pairs"]) == 4 * len(res["traces"]), cid
        lo, hi = c["paper_low"], c["paper_high"]
        neutral = 1.0 if c["kind"] == "ratio" else 0.0
        for p in c["pairs"]:
            assert _num(p["sim"]), (cid, p)
            v = p["sim"]
            inside = (1 - WITHIN) * lo <= v <= (1 + WITHIN) * hi
            none = abs(v - neutral) <= NO_EFFECT
            want = ("not reproduced" if none else "contradicted" if v < neutral else
                    "supported" if inside else "not reproduced")
            e = res["traces"][p["trace"]]
            if not exercised(e, cid):  # KunServe never dropped there
                assert e["runs"]["kunserve"]["metrics"]["drops"] == 0
                want = "not exercised"
            assert p["verdict"] == want, (cid, p)
        used = [p for p in c["pairs"] if p["verdict"] != "not exercised"]
        allsup = bool(used) and all(p["verdict"] == "supported" for p in used)
        assert (c["verdict"] == "supported") == allsup, cid
        assert (c["verdict"] == "not exercised") == (not used), cid
    for c in res["claims"]:
        assert c["verdict"] in VERDICTS | {None}, c["id"]
        if c["verdict"] is not None and c["verdict"] != "supported":
            assert c["cause"], c["id"]
        assert c["source"].startswith("KunServe")
    # the P99 TTFT pairs are the baselines' P99 over KunServe's
    for p in by_id["p99_ttft"]["pairs"]:
        r = res["traces"][p["trace"]]["runs"]
        assert p["sim"] == pytest.approx(r[p["against"]]["ttft_p99_s"]
                                         / r["kunserve"]["ttft_p99_s"])


def test_select_window_finds_the_burst():
    from experiments.kunserve_tables import select_window

    gaps = np.ones(400)
    gaps[200:240] = 0.1  # a 10x burst in the second half
    a = np.concatenate([[0.0], np.cumsum(gaps)])
    w = select_window(a, 200, 20, 10)
    assert w["start"] <= 200 < w["start"] + 200
    assert 150 <= w["start"] + w["burst_at"] <= 240
    assert w["burst_rate_ratio"] > 3
    with pytest.raises(ValueError):
        select_window(a[:50], 200, 20, 10)


def test_slo_violations_rule():
    from experiments.kunserve_tables import slo_violations

    def run(ttft, tpot):
        return {"_ttft": np.asarray(ttft, float), "_tpot": np.asarray(tpot, float)}

    runs = {"kunserve": run([1, 1, 1, 1], [1, 1, 1, np.nan]),
            "vllm-dp": run([1, 2, 3, 100], [1, 1, 1, 1]),
            "vllm-pp": run([5, 5, 5, 5], [2, 2, 2, 2])}
    s = slo_violations(runs, factors=(1, 2), baselines=("vllm-dp", "vllm-pp"))
    assert s["best_ttft_baseline"] == "vllm-dp" and s["ttft_p50_ref_s"] == 2.5
    assert s["systems"]["vllm-dp"]["ttft"] == [0.5, 0.25]
    assert s["systems"]["vllm-pp"]["any"] == [1.0, 0.0]  # 5 > 2.5 and 2 > 1; not > 5, 2
    assert s["systems"]["kunserve"]["any"] == [0.0, 0.0]


def test_bad_args_exit_2_and_write_nothing(tmp_path, capsys):
    from experiments.kunserve_tables import main

    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--out", str(f), "--quick"]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert f.read_text() == "x"
    assert main(["--out", str(f / "sub"), "--quick"]) == 2
    assert "not a directory" in capsys.readouterr().err
    out = tmp_path / "new" / "out"
    assert main(["--out", str(out), "--quick", "--traces", "burstgpt"]) == 2
    err = capsys.readouterr().err
    assert "unknown trace(s) burstgpt" in err and err.count("error:") == 1
    assert main(["--out", str(out), "--quick", "--traces", "azure-conv,azure-conv"]) == 2
    assert main(["--out", str(out), "--quick", "--requests", "3"]) == 2
    assert main(["--out", str(out), "--quick", "--lengths", "nope"]) == 2
    assert main(["--quick"]) == 2  # --out is required
    assert main(["--out", str(out), "--bogus"]) == 2
    assert not (tmp_path / "new").exists()


def _wl(drops, restores, changes=()):
    return {"runs": {"kunserve": {"metrics": {"drops": drops, "restores": restores},
                                  "timeline": {"group_changes": list(changes)}}}}


# group changes as kunserve_tables records them: time and the merged groups after it
_ONE_WAVE = [{"t_s": 50.0, "groups": [[0, 1]]}, {"t_s": 60.0, "groups": [[0, 1], [2, 3]]},
             {"t_s": 70.0, "groups": [[0, 1, 2, 3]]}, {"t_s": 200.0, "groups": [[0, 1]]},
             {"t_s": 210.0, "groups": []}]
_TWO_WAVES = _ONE_WAVE + [{"t_s": 480.0, "groups": [[0, 2]]},
                          {"t_s": 550.0, "groups": []}]


def test_not_exercised_rule():
    """A workload where KunServe never dropped labels its values "not exercised" (not
    "not reproduced"); the restore claims also need a drop after a restore."""
    from experiments.kunserve_tables import NOT_EXERCISED, _label, exercised

    res = {"traces": {"calm": _wl(0, 0), "burst": _wl(2, 0, _ONE_WAVE[:2]),
                      "one wave": _wl(3, 2, _ONE_WAVE), "waves": _wl(4, 3, _TWO_WAVES)}}
    assert not exercised(res["traces"]["calm"], "p99_ttft")
    assert exercised(res["traces"]["burst"], "p99_ttft")
    assert not exercised(res["traces"]["burst"], "restore_p99_ttft")
    assert exercised(res["traces"]["one wave"], "p99_ttft")
    assert not exercised(res["traces"]["one wave"], "restore_p99_ttft")
    assert exercised(res["traces"]["waves"], "restore_p99_tpot")
    prs = [{"trace": t, "against": "vllm-dp", "sim": 1.0, "verdict": "not reproduced"}
           for t in res["traces"]]
    got = [p["verdict"] for p in _label(res, prs, "p99_ttft")]
    assert got == [NOT_EXERCISED] + ["not reproduced"] * 3
    got = [p["verdict"] for p in _label(res, prs, "restore_p99_ttft")]
    assert got == [NOT_EXERCISED] * 3 + ["not reproduced"]


def test_restore_claims_need_a_burst_after_a_restore():
    """A restore is a merge count that falls, a drop one that rises (a merge of two
    groups into one counts even when no new instance joins)."""
    from experiments.kunserve_tables import drop_after_restore

    assert not drop_after_restore([])
    assert not drop_after_restore(_ONE_WAVE)
    assert drop_after_restore(_TWO_WAVES)
    # partial restore, then the remaining pair merges with a restored pair again
    assert drop_after_restore([{"t_s": 1.0, "groups": [[0, 1], [2, 3]]},
                               {"t_s": 2.0, "groups": [[0, 1]]},
                               {"t_s": 3.0, "groups": [[0, 1], [2, 3]]}])
    # two groups merging into one after a restore of a third
    assert drop_after_restore([{"t_s": 1.0, "groups": [[0, 1], [2, 3], [4, 5]]},
                               {"t_s": 2.0, "groups": [[0, 1], [2, 3]]},
                               {"t_s": 3.0, "groups": [[0, 1, 2, 3]]}])


def test_wave_arrivals_compress_two_windows_of_a_real_trace():
    """The waves replay: >= 600 s, two windows of >= 45 s at twice the calm rate, the
    trace's own order and gaps (halved inside a window), restarting when it runs out."""
    from experiments.kunserve_tables import (WAVE_SPAN_S, WAVE_WINDOWS_S, wave_arrivals,
                                             wave_figures)

    assert WAVE_SPAN_S >= 600
    assert all(b - a >= 45 for a, b in WAVE_WINDOWS_S) and len(WAVE_WINDOWS_S) == 2
    base = np.arange(1000.0)  # one request a second, 1000 s
    a = wave_arrivals(base, 0.5)  # calm: two a second
    assert np.all(np.diff(a) > 0) and a[0] == 0 and a[-1] < WAVE_SPAN_S
    gaps = np.diff(a)
    inside = np.zeros(a.size, bool)
    for lo, hi in WAVE_WINDOWS_S:
        inside |= (a >= lo) & (a < hi)
    # gaps: 0.5 s calm, 0.25 s inside a window (a gap crossing a border in between)
    assert np.allclose(gaps[~inside[1:] & ~inside[:-1]], 0.5)
    assert np.allclose(gaps[inside[1:] & inside[:-1]], 0.25)
    f = wave_figures(a)
    assert f["calm_rate_rps"] == pytest.approx(2.0, rel=0.01)
    for w in f["windows"]:
        assert w["over_calm"] == pytest.approx(2.0, rel=0.02), w
    # the 640 s replay at 2 req/s plus 2 x 60 s at 4 req/s needs 1520 requests: the
    # 1000-request trace restarts (its period: 1000 s, one mean gap after the last)
    assert a.size == pytest.approx(2 * (WAVE_SPAN_S + 120), abs=2)
    # a real trace's gaps are kept in order (x s), halved inside the windows
    rng = np.random.default_rng(0)
    real = np.cumsum(rng.exponential(1.0, 3000))
    r = wave_arrivals(real, 0.2)
    calm = r[r < WAVE_WINDOWS_S[0][0]]
    want = (real - real[0])[:calm.size] * 0.2
    assert np.allclose(calm, want)
    with pytest.raises(ValueError):
        wave_arrivals(real, 0.2, windows=((100.0, 50.0),))
