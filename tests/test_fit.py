"""The gradient tuner: end-to-end CLI, checkpoint/resume equivalence, corrupt files."""

import json

import numpy as np
import pytest

from tuner import fit as fit_cli
from tuner.fitting import FitSettings, fit
from tuner.policy import load_policy
from tuner.scenario import ScenarioSpec

SPEC = ScenarioSpec(n_requests=100, n_slots=32, max_batch=32)
SETTINGS = FitSettings(budget=4, crn=1, check_every=2, checkpoint_every=1,
                       temperatures=(0.3, 0.03))


class Killed(Exception):
    pass


def test_killed_fit_resumes_to_the_same_result(tmp_path):
    quiet = dict(log=lambda s: None)
    whole = fit(SPEC, SETTINGS, **quiet)
    ckpt = tmp_path / "p.json.ckpt"

    def die(rec):
        if rec["step"] == 3:
            raise Killed

    with pytest.raises(Killed):
        fit(SPEC, SETTINGS, checkpoint=ckpt, progress=die, **quiet)
    assert ckpt.exists() and not list(tmp_path.glob(".*.tmp"))
    resumed = fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, **quiet)
    assert resumed.steps == whole.steps == 4
    for k in whole.params:
        np.testing.assert_allclose(resumed.params[k], whole.params[k], rtol=1e-6)
    assert [h["step"] for h in resumed.history] == [1, 2, 3, 4]
    assert resumed.estimators == whole.estimators
    # every coordinate's estimator is logged with a reason, from the check
    assert set(whole.estimators.values()) <= {"relaxed", "fd-crn"}

    ckpt.write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="checkpoint"):
        fit(SPEC, SETTINGS, checkpoint=ckpt, resume=True, **quiet)


def test_fit_cli_exports_a_validated_policy(tmp_path, capsys):
    out = tmp_path / "policy.json"
    argv = ["--budget", "3", "--n-train", "100", "--n-holdout", "100", "--slots", "32",
            "--crn", "1", "--holdout-seeds", "1", "--quiet", "--out", str(out)]
    rc = fit_cli.main(argv)
    text = capsys.readouterr()
    assert rc in (0, 3), text.err
    if rc == 3:  # the gate refused: nothing is written, and it says by how much
        assert not out.exists() and "worse than the default" in text.err
        return
    doc = load_policy(out)
    for k in ("schema", "system", "hardware", "model", "params", "metrics"):
        assert k in doc
    for name in ("tuned", "default", "baseline"):
        assert "objective" in doc["metrics"][name] and "tps" in doc["metrics"][name]
    assert doc["metrics"]["tuned"]["objective"] >= doc["metrics"]["default"]["objective"]
    assert doc["tuner"]["estimators"] and doc["tuner"]["simulated_request_iterations"] > 0
    assert not (tmp_path / "policy.json.ckpt").exists()
    assert json.loads(out.read_text())["system"] == "odma"


def test_fit_cli_bad_input_leaves_no_file(tmp_path, capsys):
    out = tmp_path / "policy.json"
    assert fit_cli.main(["--system", "static", "--n-train", "50", "--n-holdout", "50",
                         "--slots", "32", "--quiet", "--out", str(out)]) == 2
    assert "no gradient-tunable" in capsys.readouterr().err
    assert fit_cli.main(["--budget", "0", "--out", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []
