"""experiments/capacity_table.py: a quick run (the fit stubbed by a policy file built
from real parts) writes the table files, and its numbers are the policy file's."""

import json

import numpy as np
import pytest

from experiments import capacity_table as ct
from tuner.common.atomic import write_json_atomic

POLICIES = ("tuned", "default", "static", "paged")


def _fake_fit(argv):
    """``tuner.fit.main`` stand-in: the policy file a fit writes, from a real scenario,
    deployment section and verdict over synthetic held-out samples (the real fit runs
    in tests/test_fit.py and tests/test_readme.py)."""
    from tuner.export.deployment import describe
    from tuner.export.policy import make_policy
    from tuner.scenario import ScenarioSpec, build_scenario
    from tuner.objective.validation import interval, verdict

    out = argv[argv.index("--out") + 1]
    spec = ScenarioSpec(n_requests=int(argv[argv.index("--n-requests") + 1]),
                        n_slots=32, max_batch=32)
    sc = build_scenario(spec)
    mets = {}
    for i, name in enumerate(("tuned", "default", "static", "s3", "paged")):
        per = [4.0 + 0.1 * i, 4.2 + 0.15 * i]  # paired differences that vary
        m = {"objective": float(np.mean(per)), "goodput_rps": float(np.mean(per)),
             "slo_attainment": 0.91, "ttft_p99_s": 2.0, "tpot_p99_s": 0.05,
             "saturation_tps": 800.0, "samples": 2}
        m["ci"] = {k: (interval(per) if k in ("objective", "goodput_rps") else [v, v])
                   for k, v in m.items() if k != "samples"}
        mets[name] = {**m, "system": name, "objective_per_sample": per,
                      "whole_trace": {**m, "objective_per_seed": per}}
    base = ("static", "s3", "paged")
    ver = verdict(mets, "goodput_rps", base)
    doc = make_policy(
        system="odma", params={"gamma": 0.2}, scenario=spec,
        workload={"fingerprint": sc.fingerprint, "summary": sc.summary},
        metrics={"tuned": mets["tuned"], "default": mets["default"],
                 "baselines": {b: mets[b] for b in base}, "baseline": mets["paged"]},
        objective="goodput_rps", tuner={"rates_rps": [1.0]}, seed=0, slo=sc.slo,
        deployment=describe(sc, "odma", {"gamma": 0.2}), verdict=ver)
    write_json_atomic(out, doc)
    return 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    from tuner import fit as fit_cli

    out = tmp_path_factory.mktemp("capacity")
    mp = pytest.MonkeyPatch()
    mp.setattr(fit_cli, "main", _fake_fit)
    try:
        assert ct.main(["--out", str(out), "--quick"]) == 0
    finally:
        mp.undo()
    return out


def test_files_exist_and_no_temporaries(quick_run):
    names = sorted(p.name for p in quick_run.iterdir())
    assert names == ["builtin.policy.json", "capacity_table.json", "capacity_table.md",
                     "capacity_table.png"]  # no checkpoint, no .tmp left behind
    assert quick_run.joinpath("capacity_table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_has_the_case_and_its_policies(quick_run):
    res = json.loads(quick_run.joinpath("capacity_table.json").read_text())
    doc = json.loads(quick_run.joinpath("builtin.policy.json").read_text())
    assert res["setup"]["quick"] is True and list(res["cases"]) == ["builtin"]
    e = res["cases"]["builtin"]
    assert "error" not in e and e["exit_code"] == 0 and e["wall_s"] > 0
    assert e["exported"]  # --export-anyway: written whatever the verdict
    assert "--export-anyway" in e["fit_argv"] and "--quick" not in e["fit_argv"]
    assert e["verdict"]["outcome"] == doc["verdict"]["outcome"] in ("win", "tie", "loss")
    assert e["verdict"]["sentence"] == doc["verdict"]["sentence"]
    assert e["slo"]["ttft_s"] > 0 and e["slo"]["tpot_s"] > 0
    assert e["workload"]["requests"] == 256
    assert e["params"] == doc["params"] and e["bucket_bounds_tokens"]
    assert e["system"] == doc["system"] == res["setup"]["systems"]["builtin"] == "odma"
    assert set(POLICIES) <= set(e["policies"])
    mets = {"tuned": doc["metrics"]["tuned"], "default": doc["metrics"]["default"],
            **doc["metrics"]["baselines"]}
    for p in POLICIES:
        m = e["policies"][p]
        assert m["goodput_rps"] == mets[p]["goodput_rps"] > 0, p
        assert m["samples"] == 2 and m["whole_trace"]["samples"] == 2, p
        for where in (m, m["whole_trace"]):
            lo, hi = where["goodput_rps_ci"]
            g = where["goodput_rps"]
            tol = 1e-9 * max(1.0, abs(g))
            assert lo - tol <= g <= hi + tol, (p, lo, g, hi)
        for k in ("slo_attainment", "ttft_p99_s", "tpot_p99_s", "saturation_tps"):
            assert m[k] == mets[p][k], (p, k)
    f = res["findings"]
    assert [r["case"] for r in f[doc["verdict"]["outcome"]]] == ["builtin"]
    assert f["failed"] == []


def test_markdown_carries_the_fits_verdict(quick_run):
    md = quick_run.joinpath("capacity_table.md").read_text()
    doc = json.loads(quick_run.joinpath("builtin.policy.json").read_text())
    assert doc["verdict"]["sentence"] in md
    assert "## Where tuning wins and where a baseline wins" in md
    for p in POLICIES:
        assert f"| builtin | {p} |" in md or f"| builtin | **{p}** |" in md


def test_bad_case_name_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert ct.main(["--out", str(out), "--cases", "builtin,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nope" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_engine_cases_are_the_named_deployments_and_odma_cases_vary_one():
    """The default run is the engine group: each case the fit on a named vllm-v1
    deployment as it stands; the odma cases vary the mlu370-azure deployment."""
    from pathlib import Path

    from tuner.scenario.deployments import DEPLOYMENTS

    assert ct.CASE_NAMES == ct.GROUPS["engine"] == ct.ENGINE_CASES
    assert len(ct.ENGINE_CASES) >= 4
    cases = {c[0]: c for c in ct.CASES}
    for name in ct.ENGINE_CASES:
        argv = ct._fit_argv(cases[name][1], False, None, Path("p.json"))
        assert argv[:2] == ["--deployment", name] and "--system" not in argv
        assert DEPLOYMENTS[name].system == "vllm-v1"
        assert cases[name][2] == DEPLOYMENTS[name].description
        assert ct._case_system(cases[name][1]) == "vllm-v1"
    for name in ct.GROUPS["odma"]:
        assert cases[name][1][:4] == ct.ODMA == ["--deployment", "mlu370-azure",
                                                 "--system", "odma"]


def test_a_group_name_expands_to_its_cases(tmp_path, monkeypatch):
    seen = []

    class Ran(Exception):
        pass

    def fake_run(names, *a, **k):
        seen.append(list(names))
        raise Ran

    monkeypatch.setattr(ct, "run", fake_run)
    with pytest.raises(Ran):
        ct.main(["--out", str(tmp_path / "o"), "--cases", "odma,h100-interactive,builtin"])
    assert seen == [["builtin", "builtin-tight", "azure-conv", "sharegpt",
                     "h100-interactive"]]


def test_the_tuned_cell_shows_bounds_or_the_parameters():
    assert ct._tuned({"bucket_bounds_tokens": [312, 585]}) == "bounds [312, 585] tokens"
    params = {"max_num_seqs": 128.0, "gpu_memory_utilization": 0.979952}
    want = "max_num_seqs 128, gpu_memory_utilization 0.98"
    assert ct._tuned({"params": params}) == want
    # an engine's policy file derives its KV block as one bucket: its parameters instead
    assert ct._tuned({"system": "vllm-v1", "params": params,
                      "bucket_bounds_tokens": [16]}) == want


def test_the_chart_draws_each_case_over_its_default_and_only_policies_that_ran():
    def pol(v):
        return {"goodput_rps": v}

    res = {"cases": {
        "engine": {"policies": {"tuned": pol(8.0), "default": pol(4.0), "paged": pol(4.2)}},
        "odma": {"policies": {"tuned": pol(30.0), "default": pol(15.0),
                              "paged": pol(16.0)}},
        "broken": {"error": "the fit failed"},
        "no-default": {"policies": {"tuned": pol(2.0)}}}}
    names, scale, shown = ct.chart_layout(res)
    assert names == ["engine", "odma", "no-default"]
    assert scale == [4.0, 15.0, 1.0]
    assert shown == ["tuned", "default", "paged"]  # static ran nowhere: not drawn
    res["cases"]["odma"]["policies"]["static"] = pol(14.0)
    assert ct.chart_layout(res)[2] == ["tuned", "default", "static", "paged"]
