"""experiments/bench_compare: its inputs checked before any benchmark runs, and the
baseline's commit recorded (a before/after ratio must say what "before" was). The
benchmark itself is the experiment's (minutes)."""

import subprocess
from pathlib import Path

import pytest

from experiments import bench_compare as bc

ROOT = Path(__file__).resolve().parents[1]


def test_bad_inputs_exit_2_before_any_run(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(bc, "_run", lambda *a: ran.append(a) or [])
    with pytest.raises(SystemExit) as e:
        bc.main(["--baseline", str(tmp_path), "--rounds", "1"])
    assert e.value.code == 2 and "no experiments/bench_sim.py" in capsys.readouterr().err
    (tmp_path / "f").write_text("a file")
    with pytest.raises(SystemExit) as e:
        bc.main(["--baseline", str(ROOT), "--rounds", "1", "--out",
                 str(tmp_path / "f" / "out")])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    assert ran == []


def test_the_baseline_commit_is_recorded(tmp_path):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert bc._commit(ROOT).split("+")[0] == head
    assert bc._commit(tmp_path) is None
