"""tuner.calibration / tuner.calibrate: schedule latencies, gradients, recovery, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hardware
from hardware.devices import device_record, register_record
from tuner.calibration import roofline_fit as cal
from tuner.calibrate import main as calibrate_main
from tuner.scenario import ScenarioSpec, build_scenario

TRUE = {"mfu": 0.7, "bw_eff": 0.75, "step_overhead_s": 0.005, "token_overhead_s": 3e-6,
        "request_overhead_s": 0.004}


@pytest.fixture(scope="module")
def sc():
    return build_scenario(ScenarioSpec(
        trace="default", hardware="a100-80gb", model="llama-3-8b", n_requests=40,
        rate=0.5, scheduler="chunked", n_slots=32, max_batch=32))


@pytest.fixture(scope="module")
def truth(sc):
    """The schedule and per-request latencies of a run under TRUE (the 'measurement')."""
    return cal.schedule(sc, cal.apply(sc.hw, TRUE))


def _arrays(sc, sched, ttft, tpot):
    target = cal.Target(ttft_s=ttft, tpot_s=tpot, summary={},
                        fit_mask=np.ones(len(ttft), bool))
    return cal._arrays(target, np.asarray(sched.done),
                       np.asarray(sc.workload.prompt_tokens),
                       np.asarray(sc.workload.output_tokens))


def test_schedule_latencies_equal_the_exact_run(sc, truth):
    sched, ttft, tpot = truth
    a, b = cal.latencies(cal.apply(sc.hw, TRUE), sched)
    done = np.asarray(sched.done)
    assert done.all()
    np.testing.assert_allclose(np.asarray(a), ttft, rtol=1e-4, atol=2e-5)
    fin = np.isfinite(tpot)
    np.testing.assert_allclose(np.asarray(b)[fin], tpot[fin], rtol=1e-4, atol=2e-5)  # f32 clock
    # the request overhead is on every TTFT and nowhere else
    a2, b2 = cal.latencies(cal.apply(sc.hw, {**TRUE, "request_overhead_s": 0.0}), sched)
    np.testing.assert_allclose(np.asarray(a) - np.asarray(a2), 0.004, atol=1e-6)
    np.testing.assert_allclose(np.asarray(b2)[fin], np.asarray(b)[fin])


def test_schedule_gradient_matches_finite_differences(sc, truth):
    sched, ttft, tpot = truth
    arrays = _arrays(sc, sched, ttft * 1.1, tpot * 0.9)  # a loss away from its minimum
    names = cal.DEFAULT_FIT
    base = cal.apply(sc.hw, TRUE)

    def loss(u):
        return cal.total_loss(*cal.latencies(cal.apply(base, cal.from_u(u, names)), sched),
                              arrays)

    u = jnp.asarray(cal.to_u(TRUE, names))
    g = np.asarray(jax.grad(loss)(u))
    for i in range(len(names)):
        e = jnp.zeros(len(names)).at[i].set(1e-2)
        fd = float(loss(u + e) - loss(u - e)) / 2e-2
        assert g[i] == pytest.approx(fd, rel=0.05, abs=1e-5), names[i]


def test_polish_recovers_every_parameter_on_the_true_schedule(sc, truth):
    """Gauss-Newton on the schedule: from the device preset to TRUE within 2%."""
    sched, ttft, tpot = truth
    arrays = _arrays(sc, sched, ttft, tpot)
    names = cal.DEFAULT_FIT
    start = cal._start(sc.hw, names)
    assert all(abs(start[n] / TRUE[n] - 1) > 0.1 for n in names)  # a real distance
    got = cal._polish(start, names, (cal.apply(sc.hw, start),), (sched,), (arrays,))
    for n in names:
        assert got[n] == pytest.approx(TRUE[n], rel=0.02), n


def test_fit_recovers_known_parameters_end_to_end(sc, truth):
    """The whole loop (exact runs, Adam, polish) from the preset: the compute
    efficiency and the per-iteration overhead within 2% of the values that made the
    measurement (the other terms held at their true values)."""
    _, ttft, tpot = truth
    known = {k: TRUE[k] for k in ("bw_eff", "token_overhead_s", "request_overhead_s")}
    sc2 = type(sc)(**{**sc.__dict__, "hw": cal.apply(sc.hw, known)})
    target = cal.Target(ttft_s=ttft, tpot_s=tpot, summary={},
                        fit_mask=np.ones(len(ttft), bool))
    res = cal.fit([(sc2, target)], fit_names=("mfu", "step_overhead_s"), starts=4,
                  steps=150)
    assert res.loss < res.loss_start
    for n in ("mfu", "step_overhead_s"):
        assert res.params[n] == pytest.approx(TRUE[n], rel=0.02), (n, res.params)


def _bench(tmp_path, **over):
    d = {"request_rate": 2.0, "burstiness": 1.0, "input_lens": [100, 200, 300, 50],
         "output_lens": [20, 30, 40, 10], "ttfts": [0.03, 0.04, 0.05, 0.02],
         "request_timestamps": [0.0, 0.5, 1.0, 1.5], "median_tpot_ms": 12.0,
         "p99_tpot_ms": 15.0}
    d.update(over)
    p = tmp_path / "run.json"
    p.write_text(json.dumps(d))
    return p


def test_cli_no_fit_json_keys_and_profile_roundtrip(tmp_path, capsys):
    run = _bench(tmp_path)
    rc = calibrate_main(["--no-fit", "--measured", str(run), "--hardware", "a100-80gb",
                         "--model", "llama-3-8b", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for m in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        for suffix in ("measured", "predicted", "rel_error"):
            assert f"{m}_{suffix}" in out
    assert out["ttft_p50_s_measured"] == pytest.approx(np.percentile([.03, .04, .05, .02],
                                                                     50))
    # a profile file is a --hardware everywhere a scenario is built
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"format": cal.PROFILE_FORMAT, "device": "a100-80gb",
                                "params": {"mfu": 0.5, "request_overhead_s": 0.01}}))
    sc = build_scenario(ScenarioSpec(trace=str(run), hardware=str(prof),
                                     model="llama-3-8b"))
    assert float(sc.hw.mfu) == 0.5 and float(sc.hw.request_overhead_s) == 0.01
    plain = build_scenario(ScenarioSpec(trace=str(run), hardware="a100-80gb",
                                        model="llama-3-8b"))
    assert sc.fingerprint != plain.fingerprint


@pytest.mark.parametrize("over, field", [
    ({"ttfts": None}, "ttfts"),
    ({"ttfts": [0.1, 0.2]}, "ttfts"),
    ({"ttfts": [0.03, float("nan"), 0.05, 0.02]}, "ttfts"),
    ({"request_timestamps": [0.0, -1.0, 1.0, 1.5]}, "request_timestamps"),
])
def test_cli_bad_result_files_exit_2_naming_the_field(tmp_path, capsys, over, field):
    run = _bench(tmp_path, **over)
    if over.get("ttfts", 0) is None:
        d = json.loads(run.read_text())
        del d["ttfts"]
        run.write_text(json.dumps(d))
    out = tmp_path / "profile.json"
    rc = calibrate_main(["--measured", str(run), "--hardware", "a100-80gb", "--model",
                         "llama-3-8b", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and field in err and str(run) in err
    assert not out.exists()


def test_cli_zero_outputs_dropped_with_a_warning(tmp_path, capsys):
    # five requests, one dropped: the four left have the shapes the run above compiled
    run = _bench(tmp_path, input_lens=[100, 200, 300, 50, 80],
                 output_lens=[20, 0, 40, 10, 30], ttfts=[0.03, 0.04, 0.05, 0.02, 0.03],
                 request_timestamps=[0.0, 0.5, 1.0, 1.5, 2.0])
    rc = calibrate_main(["--no-fit", "--measured", str(run), "--hardware", "a100-80gb",
                         "--model", "llama-3-8b", "--json"])
    assert rc == 0
    assert "1 of 5" in capsys.readouterr().err


def test_cli_bad_arguments_exit_2(tmp_path, capsys):
    run = _bench(tmp_path)
    for argv in (["--fit", "mfu,nonsense", "--out", str(tmp_path / "a.json")],
                 [],  # fitting needs --out
                 ["--holdout", "1.5", "--no-fit"]):
        rc = calibrate_main(["--measured", str(run), "--hardware", "a100-80gb",
                             "--model", "llama-3-8b", *argv])
        assert rc == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
            "tuner.calibrate: error:")


@pytest.mark.parametrize("argv,needle", [
    (["--no-fit", "--starts", "3"], "--starts: not read with --no-fit"),
    (["--no-fit", "--method", "cma"], "--method: not read with --no-fit"),
    (["--method", "cma", "--starts", "3", "--out", "P"],
     "--starts: read by --method gradient only, not cma"),
    (["--budget", "50", "--out", "P"], "--budget: read by --method cma only"),
    (["--bud", "50", "--out", "P"], "--budget: read by --method cma only"),
])
def test_cli_refuses_a_flag_the_run_would_ignore(argv, needle, tmp_path, capsys):
    run = _bench(tmp_path)
    argv = [str(tmp_path / "p.json") if a == "P" else a for a in argv]
    rc = calibrate_main(["--measured", str(run), "--hardware", "a100-80gb", "--model",
                         "llama-3-8b", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "p.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "x", "device": "a100-80gb", "params": {}}))
    with pytest.raises(ValueError, match="format"):
        cal.load_profile(bad)
    bad.write_text(json.dumps({"format": cal.PROFILE_FORMAT, "device": "a100-80gb",
                               "params": {"mfu": -1}}))
    with pytest.raises(ValueError, match="params.mfu"):
        cal.load_profile(bad)


def test_profile_model_is_the_default_and_a_mismatch_is_refused(tmp_path):
    """A profile calibrated on one model gives that model to a command given no --model;
    another model is one clear error naming both, never the CLI default used silently."""
    import argparse

    from tuner.cli import add_scenario_args, spec_from_args

    run = _bench(tmp_path)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"format": cal.PROFILE_FORMAT, "device": "a100-80gb",
                                "model": "llama-3-8b", "params": {"mfu": 0.5}}))
    ap = argparse.ArgumentParser()
    add_scenario_args(ap)
    spec = spec_from_args(ap.parse_args(["--hardware", str(prof), "--trace", str(run)]))
    assert spec.model == "llama-3-8b"
    assert build_scenario(spec).deployment.model.name == build_scenario(
        spec.replace(hardware="a100-80gb")).deployment.model.name
    other = spec_from_args(ap.parse_args(["--hardware", str(prof), "--trace", str(run),
                                          "--model", "qwen3-8b"]))
    with pytest.raises(ValueError, match=r"calibrated on model 'llama-3-8b', not "
                                         r"'qwen3-8b'"):
        build_scenario(other)
    # a library caller who names no model gets the same error, not the preset default
    with pytest.raises(ValueError, match="calibrated on model"):
        build_scenario(ScenarioSpec(trace=str(run), hardware=str(prof)))


def test_a_profile_calibrated_on_a_device_file_loads_without_the_file(tmp_path):
    """A profile of a device read from a device file carries the device's fields: a new
    process (which never read that file) loads it; a preset's profile carries none;
    a clash with a known device of that name is refused naming the field."""
    rec = device_record(hardware.get_device("a100-80gb"))
    rec["name"] = "test-profile-dev"
    dev_file = tmp_path / "dev.json"
    dev_file.write_text(json.dumps(rec))
    run = _bench(tmp_path)
    prof = tmp_path / "profile.json"
    assert calibrate_main(["--measured", str(run), "--hardware", str(dev_file), "--model",
                           "llama-3-8b", "--out", str(prof), "--fit", "mfu"]) == 0
    doc = json.loads(prof.read_text())
    assert doc["device"] == doc["device_record"]["name"] == "test-profile-dev"
    code = ("from hardware.profile import load_profile; from hardware import get_device; "
            f"d = load_profile({str(prof)!r}); print(get_device(d['device']).memory_bytes)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) == rec["memory_bytes"]
    preset = tmp_path / "preset.json"
    assert calibrate_main(["--measured", str(run), "--hardware", "a100-80gb", "--model",
                           "llama-3-8b", "--out", str(preset), "--fit", "mfu"]) == 0
    assert "device_record" not in json.loads(preset.read_text())
    other = dict(rec, memory_bytes=rec["memory_bytes"] / 2)
    with pytest.raises(ValueError, match="device_record.*memory_bytes"):
        register_record(other, f"{prof} field 'device_record'")
