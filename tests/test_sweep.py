"""``python -m tuner.sweep``: parity with single runs, sharding over devices, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from models import metrics, simulate
from tuner.objective.objectives import parse_objective
from tuner.search.pareto import pareto_mask
from tuner.scenario import ScenarioSpec
from tuner.search.sweep import build_scenarios, random_points
from tuner.sweep import main

ROOT = Path(__file__).resolve().parents[1]
STEPS = 600  # rounded up to 608 (a multiple of the block, 16 iterations)
HARDWARE = ["mlu370-x4", "h100-80gb"]
SMALL = ["--n-requests", "150", "--slots", "32"]
ARGS = ["--system", "odma", "--grid", "gamma=0.1,0.5,1.0", "--objective", "tps_mig",
        "--hardware", ",".join(HARDWARE), *SMALL, "--steps", str(STEPS), "--quiet"]
FILES = {"sweep.json", "sweep.csv", "sweep.md", "pareto.png"}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    assert main([*ARGS, "--out", str(out)]) == 0
    return out


def _rows(path):
    return json.loads((Path(path) / "sweep.json").read_text())


def test_sweep_matches_individual_runs(sweep_dir):
    doc = _rows(sweep_dir)
    rows, meta = doc["rows"], doc["meta"]
    assert meta["n_points"] == len(rows) == 6 and meta["steps"] == 608
    scs = build_scenarios(ScenarioSpec(n_requests=150, n_slots=32, max_batch=32),
                          HARDWARE, ["default"])
    opts, obj = scs[0].options("odma"), parse_objective(meta["objective"])

    @jax.jit
    def single(params, inputs, hw):
        state, _ = simulate(inputs, hw, params, 0.0, opts, meta["steps"])
        m = metrics(state, inputs, opts)
        return {**m, "objective": obj(m)}

    for row in rows:  # parameter-major, then hardware
        gamma = [0.1, 0.5, 1.0][row["index"] // 2]
        sc = scs[row["index"] % 2]
        assert row["hardware"] == sc.spec.hardware and row["params"]["gamma"] == gamma
        params = {k: np.asarray(v, np.float32) for k, v in row["params"].items()}
        want = single(params, sc.inputs("odma"), sc.hw)
        for k, v in want.items():
            np.testing.assert_allclose(row["metrics"][k], float(v), rtol=1e-5,
                                       atol=1e-6, err_msg=f"#{row['index']} {k}")
    # the grid matters: gamma moves the migration rate, hardware moves the throughput
    assert len({r["metrics"]["migration_rate"] for r in rows}) > 1
    assert len({r["metrics"]["tps"] for r in rows}) > 1


def test_sharded_over_four_host_devices_matches_one_device(sweep_dir, tmp_path):
    # the suite's own XLA flags kept (tests/conftest.py): the same compiler on both sides,
    # so that only the sharding differs between the two sweeps
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "four"
    # 6 points in chunks of 4 on 4 devices: the last chunk is padded
    proc = subprocess.run([sys.executable, "-m", "tuner.sweep", *ARGS, "--batch", "4",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "on 4 cpu device(s)" in proc.stdout
    four, one = _rows(out), _rows(sweep_dir)
    assert four["meta"]["devices"] == 4 and one["meta"]["devices"] == jax.device_count()
    assert four["rows"] == one["rows"]


def test_cli_writes_the_four_files(sweep_dir):
    assert {p.name for p in sweep_dir.iterdir()} == FILES
    assert (sweep_dir / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_lines = (sweep_dir / "sweep.csv").read_text().splitlines()
    assert len(csv_lines) == 7 and csv_lines[0].startswith("index,system,hardware")
    md = (sweep_dir / "sweep.md").read_text()
    assert md.count("\n| ") == 7  # header + 6 rows (all fit in the top 20)
    rows = _rows(sweep_dir)["rows"]
    assert all(set(r["pareto"]) == {"tps_ttft", "util_migration"} for r in rows)
    assert any(r["pareto"]["tps_ttft"] for r in rows)
    for r in rows:
        assert {"objective", "tps", "kv_utilization", "ttft_p99_s", "tpot_p99_s",
                "migration_rate", "unserved"} <= set(r["metrics"])


@pytest.mark.parametrize("bad", [
    ["--system", "nope"],
    ["--system", "odma", "--grid", "bogus=1"],
    ["--system", "odma", "--grid", "gamma="],
    ["--system", "odma", "--grid", "gamma=5"],
    ["--system", "odma", "--grid", "levels=0.9,0.5,0.99"],
    ["--system", "odma", "--hardware", "no-such-gpu"],
    ["--system", "odma", "--grid", "gamma=0.1", "--random", "3"],
    ["--system", "odma", "--random", "0"],
])
def test_bad_input_exits_2_and_writes_nothing(bad, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*bad, *SMALL, "--steps", "16", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists() or not any(out.iterdir())


def test_random_points_stay_in_their_domains():
    a = random_points("odma", 50, seed=3, max_len=1024)
    assert len(a) == 50
    for p in a:
        assert np.all(np.diff(p["levels"]) > 0) and 0.05 <= p["levels"][0] < 1
        assert 0 <= p["gamma"] <= 4 and 0 <= p["tau"] <= 1
        assert 0 <= p["large_share"] <= 0.9
    b = random_points("odma", 50, seed=3, max_len=1024)
    assert all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)


def test_pareto_mask():
    # maximise y, minimise x; (3, 5) is dominated by (2, 5); nan never on the front
    x = [1.0, 2.0, 3.0, 4.0, np.nan]
    y = [1.0, 5.0, 5.0, 6.0, 9.0]
    assert pareto_mask(x, y, (False, True)).tolist() == [True, True, False, True, False]


def test_a_goodput_sweep_runs_each_scenarios_ladder():
    """The default objective (goodput) in a sweep: each scenario's rate ladder runs in
    the same compiled call, and a point's goodput is that of its own ladder."""
    import jax.numpy as jnp

    from tuner.objective.problem import Ladder, measure
    from tuner.search.sweep import ladders, run_sweep

    scs = build_scenarios(ScenarioSpec(n_requests=150, n_slots=32, max_batch=32),
                          HARDWARE[:1], ["default"])
    rates, steps = ladders(scs, "static")
    rows = run_sweep(scs, "static", [{}], n_steps=steps, objective="goodput_rps",
                     rates=rates)
    obj = parse_objective("goodput_rps")
    for row, sc, r in zip(rows, scs, rates):
        m = measure({}, sc.inputs("static"), sc.hw, 0.0,
                    Ladder(jnp.asarray(r), jnp.float32(sc.nominal_rps)),
                    opts=sc.options("static"), n_steps=steps, objective=obj)
        assert row["metrics"]["goodput_rps"] == pytest.approx(float(m["goodput_rps"]),
                                                              rel=1e-5)
        assert row["metrics"]["objective"] == row["metrics"]["goodput_rps"] > 0
        assert r[0] < row["metrics"]["goodput_rps"] <= r[-1]  # within its own ladder
