"""Bad input gets one ``error:`` line naming the file or field, exit 2 and no output,
before any long work (issue 28, items 13-17); and what used to be refused by mistake
(an all-at-once benchmark run, an operator's own trace with a long-tailed length
distribution) now runs. Each test drives the real command (``main(argv)``)."""

import json
from pathlib import Path

import numpy as np
import pytest

from tuner import calibrate as cal_cli
from tuner import evaluate as ev
from tuner import explain as ex
from tuner import fit as fit_cli
from tuner import sweep as sweep_cli
from tuner.export.policy import load_policy, make_policy
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.workloads.traces import load_trace

SMALL = ["--n-requests", "100", "--slots", "32"]


def _errors(capsys, tool_prefix=None) -> list[str]:
    """The stderr lines of the last command (progress lines of the tool dropped)."""
    err = capsys.readouterr().err.strip().splitlines()
    return [e for e in err if not (tool_prefix and e.startswith(tool_prefix)
                                   and "error:" not in e)]


def _one_error(capsys, *needles, prefix=None):
    err = _errors(capsys, prefix)
    assert len(err) == 1 and "error:" in err[0], err
    for n in needles:
        assert n in err[0], (n, err[0])
    return err[0]


# ---- 13: every field of a policy file ------------------------------------------------

def _policy_doc() -> dict:
    m = {"objective": 1.0, "tps": 1.0}
    spec = ScenarioSpec(n_requests=120, n_slots=32, max_batch=32)
    return make_policy(system="paged", params={}, scenario=spec,
                       workload={"fingerprint": "x"},
                       metrics={"tuned": m, "default": m, "baseline": m},
                       objective="tps", tuner={}, seed=0,
                       verdict={"outcome": "tie", "sentence": "s"},
                       provenance={"command": "python3 -m tuner.fit"}, wall_s=1.5)


def _set(doc, dotted, value):
    *head, last = dotted.split(".")
    for k in head:
        doc = doc[k]
    doc[last] = value


BAD_POLICY = [  # (field, value, text the error must hold)
    ("system", ["token-pd"], "field 'system' must be a non-empty string"),
    ("system", "paged-v9", "field 'system': unknown system 'paged-v9'"),
    ("objective", 5, "field 'objective' must be a non-empty string"),
    ("objective", "foo_bar", "field 'objective': objective: bad goal term 'foo_bar'"),
    ("objective", "attention_lost", "field 'objective'"),  # not a metric of paged
    ("scenario.n_requests", "many", "field 'scenario': n_requests must be a positive "
     "integer, got 'many'"),
    ("scenario.capacity_tokens", 0, "field 'scenario': capacity_tokens must be a "
     "positive integer, got 0"),
    ("scenario.rate", "fast", "field 'scenario': rate must be a finite number"),
    ("scenario.options", [1, 2], "field 'scenario': options must be an object"),
    ("seed", "zero", "field 'seed' must be an integer >= 0"),
    ("seed", -1, "field 'seed' must be an integer >= 0"),
    ("created", "yesterday", "field 'created' must be an ISO 8601 date-time"),
    ("version", 1, "field 'version' must be a non-empty string"),
    ("params", [], "field 'params' must be a JSON object"),
    ("params", {"block_size": "big"}, "field 'params'"),
    ("metrics.tuned", 3, "field 'metrics.tuned' must be an object"),
    ("tuner", "gradient", "field 'tuner' must be a JSON object"),
    ("verdict.outcome", "maybe", "field 'verdict.outcome' must be one of"),
    ("slo", {"ttft_s": -1.0, "tpot_s": 0.1}, "field 'slo.ttft_s' must be a finite"),
    ("wall_s", -3, "field 'wall_s' must be a finite number of seconds >= 0"),
    ("provenance", "git", "field 'provenance' must be a JSON object"),
]


def test_a_valid_policy_file_loads_and_explains(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_policy_doc()))
    doc = load_policy(path)
    assert doc["wall_s"] == 1.5 and doc["provenance"]["command"].startswith("python3")
    assert ex.main([str(path)]) == 0
    assert "paged policy" in capsys.readouterr().out


@pytest.mark.parametrize("field,value,needle", BAD_POLICY)
def test_every_policy_field_is_checked(field, value, needle, tmp_path, capsys):
    doc = _policy_doc()
    _set(doc, field, value)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert ex.main([str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and needle in err[0], err
    if field in ("system", "objective", "scenario.n_requests"):  # read by evaluate too
        assert ev.main(["--policy", str(path)]) == 2
        _one_error(capsys, str(path), needle)


# ---- 14: positive-integer flags --------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [
    (["--capacity-tokens", "0"], "--capacity-tokens 0: must be a positive integer"),
    (["--capacity-tokens", "-10"], "--capacity-tokens -10: must be a positive integer"),
    (["--n-requests", "0"], "--n-requests 0: must be a positive integer"),
    (["--tp", "0"], "--tp 0: must be a positive integer"),
    (["--offset", "-1"], "--offset -1: must be an integer >= 0"),
    (["--rate", "nan"], "--rate nan: must be a finite number > 0"),
])
def test_size_flags_must_be_positive(argv, needle, tmp_path, capsys):
    argv = [*SMALL, *argv] if "--n-requests" not in argv else ["--slots", "32", *argv]
    assert ev.main(["--system", "paged", *argv]) == 2
    _one_error(capsys, needle)
    out = tmp_path / "new" / "p.json"
    assert fit_cli.main(["--quiet", "--out", str(out), *argv]) == 2
    _one_error(capsys, needle, prefix="tuner.fit:")
    sweep_out = tmp_path / "sweep"
    assert sweep_cli.main(["--system", "paged", "--quiet", "--out", str(sweep_out),
                           *argv]) == 2
    _one_error(capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_zero_capacity_is_not_replaced_by_the_deployments():
    with pytest.raises(ValueError, match="capacity_tokens must be a positive integer"):
        build_scenario(ScenarioSpec(n_requests=100, n_slots=32, max_batch=32,
                                    capacity_tokens=0))


# ---- 15: outputs checked first, nothing created on refusal ---------------------------

def test_sweep_checks_out_first_and_stamps_its_results(tmp_path, capsys):
    out = tmp_path / "new" / "sweep"
    argv = ["--system", "paged", "--grid", "block_size=16", "--objective", "tps",
            "--n-requests", "70", "--slots", "16", "--steps", "32", "--quiet",
            "--out", str(out)]
    assert sweep_cli.main(argv) == 0
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["provenance"]["command"] == "python3 -m tuner.sweep " + " ".join(argv)
    assert doc["provenance"]["sources"]["sha256"] and doc["rows"]


def test_sweep_out_naming_a_file_is_one_error(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("mine")
    assert sweep_cli.main(["--system", "paged", "--quiet", "--out", str(f), *SMALL]) == 2
    _one_error(capsys, f"--out {f}: exists and is not a directory")
    assert f.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [
        "taken"]
    # a bad argument after a good --out creates no folder either
    assert sweep_cli.main(["--system", "paged", "--quiet", "--out",
                           str(tmp_path / "a" / "b"), "--grid", "nope=1", *SMALL]) == 2
    _one_error(capsys, "--grid 'nope=1'")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--budget", "0"], "--budget must be >= 1"),
    (["--objective", "foo_bar"], "bad goal term 'foo_bar'"),
    (["--windows", "0"], "--windows must be >= 1"),
])
def test_fit_creates_no_folder_before_its_checks(argv, needle, tmp_path, capsys):
    out = tmp_path / "results" / "deep" / "policy.json"
    log = tmp_path / "logs" / "fit.log"
    assert fit_cli.main(["--quiet", "--out", str(out), "--log", str(log), *SMALL,
                         *argv]) == 2
    _one_error(capsys, needle, prefix="tuner.fit:")
    assert list(tmp_path.iterdir()) == []


def test_fit_log_and_dataset_paths_are_output_paths(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    out = tmp_path / "new" / "policy.json"
    for log, needle in ((tmp_path, "is a directory"),
                        (tmp_path / "f.txt" / "fit.log", "is not a directory"),
                        (out, "the same file as --out")):
        assert fit_cli.main(["--quiet", "--out", str(out), "--log", str(log),
                             *SMALL]) == 2
        _one_error(capsys, f"--log {log}", needle, prefix="tuner.fit:")
    (tmp_path / "policy.dataset.jsonl").mkdir()
    assert fit_cli.main(["--quiet", "--out", str(tmp_path / "policy.json"), *SMALL]) == 2
    _one_error(capsys, "policy.dataset.jsonl: is a directory", prefix="tuner.fit:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "policy.dataset.jsonl"]


# ---- 16: a vllm bench serve run at request_rate inf ----------------------------------

def _inf_run(tmp_path, n=24):
    """A vLLM result at the default request rate (inf): no send times, every request
    sent at t = 0 (the first file most operators have)."""
    rng = np.random.default_rng(0)
    out = [int(x) for x in rng.integers(2, 200, n)]
    doc = {"backend": "vllm", "model_id": "Qwen/Qwen3-8B", "num_prompts": n,
           "request_rate": "inf", "burstiness": 1.0, "duration": 5.0, "completed": n,
           "input_lens": [int(x) for x in rng.integers(20, 600, n)],
           "output_lens": out, "ttfts": [0.05 + 0.004 * i for i in range(n)],
           "itls": [[0.012] * (o - 1) for o in out], "errors": [""] * n,
           "median_ttft_ms": 100.0, "median_tpot_ms": 12.0}
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(doc))
    return path


def test_an_all_at_once_benchmark_run_loads_calibrates_and_is_predicted(tmp_path,
                                                                        capsys):
    path = _inf_run(tmp_path)
    t = load_trace(path)
    assert len(t) == 24 and np.all(t.arrival_s == 0.0)
    spec = ScenarioSpec(trace=str(path), hardware="a100-80gb", model="Qwen/Qwen3-8B",
                        n_slots=32, max_batch=32)
    sc = build_scenario(spec)
    assert np.all(np.asarray(sc.workload.arrival_s)[:24] == 0.0)  # replayed as it is
    assert sc.nominal_rps == float("inf")
    assert any("arrive at t = 0" in w and "Poisson" in w for w in sc.warnings)
    # a rate ladder places them as the stated Poisson pattern, at the rate asked for
    at2 = np.asarray(sc.at_rate(2.0).workload.arrival_s)[:24]
    assert at2[0] == 0.0 and np.all(np.diff(at2) > 0)
    assert 23 / at2[-1] == pytest.approx(2.0, rel=0.5)
    base = ["--hardware", "a100-80gb", "--slots", "32"]
    assert cal_cli.main(["--measured", str(path), "--no-fit", "--json", *base]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["files"][0]["n_requests"] == 24
    assert rep["ttft_p50_s_predicted"] > 0
    assert ev.main(["--system", "paged", "--trace", str(path), "--json",
                    "--model", "Qwen/Qwen3-8B", *base]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["goodput_rps"] > 0 and m["saturation_tps"] > 0 and m["unserved"] == 0
    assert any("places them as a Poisson process" in w for w in m["warnings"])
    # --rate on an all-at-once trace: Poisson at that rate, said so
    sc = build_scenario(spec.replace(rate=3.0))
    assert sc.nominal_rps == pytest.approx(3.0, rel=0.6)
    assert any("--rate 3 draws them as a Poisson process" in w for w in sc.warnings)


def test_a_rate_ladder_on_an_all_at_once_trace_is_refused_before_work(tmp_path, capsys):
    path = _inf_run(tmp_path, n=140)
    out = tmp_path / "o" / "p.json"
    argv = ["--trace", str(path), "--slots", "32", "--quiet"]
    assert fit_cli.main([*argv, "--windows", "1", "--out", str(out)]) == 2
    _one_error(capsys, "all 140 requests of the slice arrive at t = 0", "--rate R",
               prefix="tuner.fit:")
    assert sweep_cli.main(["--system", "paged", *argv, "--out", str(tmp_path / "s")]) == 2
    _one_error(capsys, "arrive at t = 0", "--rate R")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inf.json"]


# ---- 17: settings derived once for the whole slice; the fit's log and provenance --

def _long_tailed_csv(tmp_path, n=260):
    """An operator's own trace: plain CSV, long-tailed output lengths, one very long
    output in the first training window only (per-window max_len would differ)."""
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(0.5, n))
    t -= t[0]
    p = np.clip(rng.lognormal(5, 1, n).astype(int), 1, 2000)
    o = np.clip(rng.lognormal(4.2, 0.8, n).astype(int), 1, 250)
    o[10] = 1000  # max_len 1024 for the first training window, 256 for the second
    path = tmp_path / "own.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"{a:.4f},{b},{c}\n" for a, b, c in zip(t, p, o)))
    return path


def _stub_validate(system, policies, objective, win, seeds, log=None, whole_slice=True,
                   **_):
    """Held-out validation replaced (the training run above it is real): every policy
    the same, so the verdict is decided without simulating."""
    assert len({w.max_len for w in (*win.train, *win.holdout, win.whole)}) == 1
    out = {}
    for name, (sys_name, _) in policies.items():
        m = {"objective": 1.0, "tps": 1.0, "samples": 2,
             "ci": {"objective": [0.5, 1.5]}}
        out[name] = {**m, "system": sys_name, "objective_per_sample": [0.9, 1.1],
                     "whole_trace": dict(m)}
    return out


def test_fit_on_an_own_trace_derives_max_len_once_and_logs(tmp_path, capsys,
                                                           monkeypatch):
    import tuner.objective.validation as val

    monkeypatch.setattr(val, "validate", _stub_validate)
    trace = _long_tailed_csv(tmp_path)
    out, log = tmp_path / "res" / "policy.json", tmp_path / "logs" / "fit.log"
    argv = ["--trace", str(trace), "--system", "s3", "--method", "random", "--evals",
            "2", "--crn", "1", "--objective", "tps", "--slots", "16", "--export-anyway",
            "--out", str(out), "--log", str(log)]
    rc = fit_cli.main(argv)
    text = capsys.readouterr()
    assert rc == 0, text.err
    doc = load_policy(out)
    assert doc["scenario"]["max_len"] == 1024  # the whole slice's: 1000 -> 1024
    assert doc["provenance"]["command"] == "python3 -m tuner.fit " + " ".join(argv)
    assert doc["provenance"]["sources"]["sha256"]
    assert isinstance(doc["wall_s"], float) and doc["wall_s"] > 0
    lines = log.read_text().splitlines()
    assert lines[0].startswith("Made by `python3 -m tuner.fit --trace") and \
        "at commit" in lines[0] and doc["provenance"]["sources"]["sha256"] in lines[0]
    assert any(ln.startswith("verdict (") for ln in lines)  # what it printed
    assert any(ln.startswith("fit wall time") for ln in lines)


def test_experiments_check_their_out_folder_before_any_work(tmp_path, capsys):
    from experiments import bench_validate, main_job

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for mod in (bench_validate, main_job):
        assert mod.main(["--out", str(blocker / "sub")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --out ") and "a_file" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


# ---- output folders where no file can be created; writes that fail at the end --------

@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_folder_that_passes_access_but_takes_no_file_is_refused(
        tmp_path, capsys, monkeypatch):
    """As root, ``os.access`` says yes to /proc's folders (a pseudo-filesystem); the
    check must create a file to know, and leave nothing behind where it can."""
    import os

    from tuner.common.atomic import unwritable_reason

    monkeypatch.setattr(os, "access", lambda *a, **k: True)  # root's view
    assert "creating a file there fails" in unwritable_reason("/proc/kvtune-out")
    assert "creating a file there fails" in unwritable_reason("/proc")
    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    assert unwritable_reason(tmp_path) is None
    assert list(tmp_path.iterdir()) == []  # the probe left nothing
    assert fit_cli.main(["--quiet", "--out", "/proc/kvtune-out/policy.json",
                         *SMALL]) == 2
    _one_error(capsys, "--out /proc/kvtune-out/policy.json", "creating a file there fails",
               prefix="tuner.fit:")


@pytest.mark.parametrize("failing", ["policy", "kit"])
def test_a_write_failing_at_the_end_is_one_line_and_leaves_nothing(
        failing, tmp_path, capsys, monkeypatch):
    import tuner.export.bench_dataset as bd
    import tuner.objective.validation as val

    monkeypatch.setattr(val, "validate", _stub_validate)

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fit_cli if failing == "policy" else bd,
                        "write_json_atomic" if failing == "policy" else "write_dataset",
                        full)
    trace = _long_tailed_csv(tmp_path)
    out = tmp_path / "res" / "policy.json"
    rc = fit_cli.main(["--trace", str(trace), "--system", "s3", "--method", "random",
                       "--evals", "2", "--crn", "1", "--objective", "tps", "--slots",
                       "16", "--export-anyway", "--quiet", "--out", str(out)])
    assert rc == 2
    what = "the policy" if failing == "policy" else "the measurement kit"
    _one_error(capsys, f"--out {out}: writing {what}", "No space left on device",
               "nothing written", prefix="tuner.fit:")
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_the_measure_kit_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import tuner.export.bench_dataset as bd
    from tuner.export.deployment import write_measure_kit

    sc = build_scenario(ScenarioSpec(n_requests=20, n_slots=16, max_batch=16))
    real, calls = bd.write_dataset, []

    def second_fails(sc, path, fmt="custom", **k):
        calls.append(fmt)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(sc, path, fmt, **k)
    monkeypatch.setattr(bd, "write_dataset", second_fails)
    with pytest.raises(OSError, match="No space"):
        write_measure_kit(sc, tmp_path / "policy.json")
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []  # the first one removed
    monkeypatch.setattr(bd, "write_dataset", real)
    paths = write_measure_kit(sc, tmp_path / "policy.json")
    assert len(paths) == len(bd.FORMATS) and all(p.is_file() for p in paths.values())


def test_calibrate_write_failing_at_the_end_is_one_line(tmp_path, capsys, monkeypatch):
    import tuner.calibrate as cal_mod

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cal_mod, "write_json_atomic", full)
    out = tmp_path / "res" / "a100.profile.json"
    assert cal_cli.main(["--measured", str(_inf_run(tmp_path)), "--no-fit",
                         "--hardware", "a100-80gb", "--slots", "32", "--out",
                         str(out)]) == 2
    _one_error(capsys, f"--out {out}: writing it failed", "No space left on device",
               prefix="tuner.calibrate:")
    assert not out.exists()


def test_sweep_write_failing_midway_leaves_nothing(tmp_path, capsys, monkeypatch):
    import tuner.search.pareto as pareto

    real = pareto.write_bytes_atomic

    def png_fails(path, data):
        if path.name == "pareto.png":
            raise OSError(28, "No space left on device")
        return real(path, data)
    monkeypatch.setattr(pareto, "write_bytes_atomic", png_fails)
    out = tmp_path / "s"
    assert sweep_cli.main(["--system", "paged", "--quiet", "--out", str(out),
                           *SMALL]) == 2
    _one_error(capsys, "No space left on device")
    assert not out.exists() or list(out.iterdir()) == []  # sweep.json etc. removed


@pytest.mark.parametrize("argv,needle", [
    (["sharegpt", "--seed", "5"], "--seed 5: only the 'default' trace is drawn"),
    (["sharegpt", "--sample", "2"], "--sample 2: 'sharegpt' has one output length"),
    (["sharegpt", "--sample=1"], "--sample 1: 'sharegpt' has one output length"),
    (["sharegpt", "--se", "3"], "--seed 3: only the 'default' trace"),  # abbreviated
])
def test_trace_summary_refuses_a_flag_the_trace_does_not_read(argv, needle, capsys):
    from tuner.workloads import trace as trace_cli

    assert trace_cli.main(argv) == 2
    _one_error(capsys, needle)
    assert trace_cli.main(["default", "--seed", "5", "-n", "50"]) == 0  # it reads it


@pytest.mark.parametrize("tool", ["evaluate", "sweep"])
def test_a_temperature_in_exact_mode_is_refused(tool, tmp_path, capsys):
    """An exact run has no temperature: --temperature without --mode relaxed is an
    error, not silently dropped."""
    argv = ["--system", "paged", "--temperature", "0.3", *SMALL]
    rc = (ev.main(argv) if tool == "evaluate" else
          sweep_cli.main([*argv, "--quiet", "--out", str(tmp_path / "s")]))
    assert rc == 2
    _one_error(capsys, "--temperature 0.3: read with --mode relaxed only")
    assert list(tmp_path.iterdir()) == []
