"""The README's Tour commands run as written, in order, in a scratch directory: the fit
writes the policy that explain and evaluate then read. Each ``python3 -m MODULE ARGS``
line is run as ``MODULE.main(ARGS)`` in this process, so it shares compiled code with
the other tests (``tests/test_fit.py`` runs the same fit); the policy it writes is
checked as a deployable file."""

import importlib
import json
import re
import shlex
from pathlib import Path

import numpy as np

from models import get_system, validate_params
from tuner.export.policy import SCHEMA, load_policy
from tuner.objective.validation import OUTCOMES

README = Path(__file__).resolve().parents[1] / "README.md"
# Simulator programs (traced, hence compiled) the Tour's fit needs, by its own count on its
# last line: the exact run-until-done of ODMA on a training window and of ODMA and its
# three baselines on the held-out windows, and the relaxed problem's value, gradient and
# batch. A change that makes the main job compile
# more must raise this knowingly (issue 30: every exact evaluation batched).
TOUR_FIT_SIMULATOR_PROGRAMS = 8


def tour_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"<!-- tour -->\s*```\n(.*?)```\s*<!-- /tour -->", text, re.S)
    assert block, "README lost its <!-- tour --> block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]


def test_tour_commands_run_as_written(tmp_path, monkeypatch, capsys):
    cmds = tour_commands()
    assert any("tuner.fit" in c for c in cmds) and any("tuner.sweep" in c for c in cmds)
    monkeypatch.chdir(tmp_path)
    for cmd in cmds:
        argv = shlex.split(cmd)
        assert argv[:2] == ["python3", "-m"], cmd
        module = importlib.import_module(argv[2])
        rc = module.main(argv[3:])
        out = capsys.readouterr()
        assert rc == 0, f"{cmd}\n{out.err[-2000:]}"
        assert out.out.strip(), cmd
        if argv[2] == "tuner.fit":
            built = re.search(r"; (\d+) simulator programs \(([^)]*)\)", out.out)
            assert built, "the fit no longer says how many simulator programs it built"
            assert int(built[1]) <= TOUR_FIT_SIMULATOR_PROGRAMS, (
                f"the Tour's fit compiled {built[1]} simulator programs ({built[2]}); "
                f"bound {TOUR_FIT_SIMULATOR_PROGRAMS}")
    assert (tmp_path / "sweep").is_dir()
    _check_policy(tmp_path / "policy.json")


def _check_policy(out: Path):
    """What the Tour's fit exported: validated metrics with intervals, the verdict, and
    what an engineer applies (units, bounds in tokens, SLOs, vLLM arguments)."""
    raw = json.loads(out.read_text())
    doc = load_policy(out)  # schema, fields, scenario and params validated
    assert raw["schema"] == doc["schema"] == SCHEMA and raw["system"] == "odma"
    assert doc["verdict"]["outcome"] in OUTCOMES and doc["verdict"]["sentence"]
    spec = get_system(raw["system"])
    checked = validate_params(spec, raw["params"], raw["scenario"]["max_len"] or 16384)
    assert set(raw["params"]) == set(checked)
    for k, v in checked.items():  # exported as given: already within the valid ranges
        np.testing.assert_allclose(np.asarray(raw["params"][k], np.float32),
                                   np.asarray(v, np.float32), rtol=1e-6)
    assert set(doc["metrics"]["baselines"]) == {"static", "s3", "paged"}
    for name in ("tuned", "default", "baseline"):
        m = doc["metrics"][name]
        for k in ("objective", "goodput_rps", "saturation_tps", "slo_attainment"):
            assert isinstance(m[k], (int, float)) and np.isfinite(m[k]), (name, k)
            lo, hi = m["ci"][k]
            assert lo <= m[k] + 1e-9 and m[k] <= hi + 1e-9, (name, k)
        assert m["objective"] == m["goodput_rps"] > 0
        assert len(m["objective_per_sample"]) == m["samples"] == 2  # 1 window x 2 seeds
        assert "whole_trace" not in m  # the in-sample whole slice only with --whole-slice
    dep = doc["deployment"]
    assert {p["name"] for p in dep["parameters"]} == set(raw["params"])
    assert all(p["unit"] and p["meaning"] for p in dep["parameters"])
    assert dep["derived"]["bucket_bounds_tokens"] and dep["vllm"]["command"]
    assert doc["slo"]["ttft_s"] > 0 and doc["slo"]["tpot_s"] > 0
    assert doc["scenario"]["n_requests"] == 256
    assert doc["workload"]["train"] == [[0, 128]] and doc["workload"]["holdout"] == [[128, 256]]
    assert doc["tuner"]["rates_rps"] and doc["tuner"]["simulated_request_iterations"] > 0
    assert not list(out.parent.glob("*.ckpt")) and not list(out.parent.glob(".*.tmp"))
