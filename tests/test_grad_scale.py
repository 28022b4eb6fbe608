"""experiments/grad_scale.py: gradient checks at several finite-difference steps."""

import numpy as np
import pytest

from experiments import grad_scale as gs
from tuner.search.gradcheck import classify


class _Space:
    def coords(self):
        return [("a", 0), ("a", 1), ("b", 0)]


class _Prob:
    """Relaxed derivatives that depend on T, exact differences on h (rough at small h:
    the sign of coordinate a[0]'s difference flips between h = 0.1 and 0.3)."""
    space = _Space()

    def grad(self, theta, t):
        return 0.0, {"a": np.array([-1.0 * t, 2.0]), "b": np.array([1e-9])}, {}

    def fd(self, theta, coords, h):
        table = {0.1: {("a", 0): 0.5, ("a", 1): 1.0, ("b", 0): 0.0},
                 0.3: {("a", 0): -0.2, ("a", 1): 1.5, ("b", 0): 3.0}}
        return {c: table[h][c] for c in coords}


def test_each_cell_is_the_fits_rule_on_that_temperature_and_step():
    rows = gs.measure(_Prob(), {}, steps=(0.1, 0.3), temperatures=(0.1, 0.03),
                      log=lambda s: None)
    assert [r["coordinate"] for r in rows] == ["a[0]", "a[1]", "b[0]"]
    a0 = rows[0]
    assert a0["relaxed"] == {"0.1": pytest.approx(-0.1), "0.03": pytest.approx(-0.03)}
    assert a0["exact"] == {"0.1": 0.5, "0.3": -0.2}
    assert a0["classes"]["0.1"] == {"0.1": "disagree", "0.3": "agree"}
    for r, c in zip(rows, _Space().coords()):
        for t in (0.1, 0.03):
            for h in (0.1, 0.3):
                g = _Prob().grad(None, t)[1][c[0]][c[1]]
                assert r["classes"][f"{t:g}"][f"{h:g}"] == classify(g, _Prob().fd(
                    None, [c], h)[c])
    assert rows[2]["classes"]["0.1"] == {"0.1": "flat", "0.3": "vanishing"}
    assert "disagree/agree" in gs.render({
        "problem": "p", "seed": 0, "system": "s", "start_value": 1.0, "quick": False,
        "steps": [0.1, 0.3], "temperatures": [0.1, 0.03], "rows": rows, "wall_s": 1.0,
        "counts": {"0.1": {"agree": 1}, "0.3": {"agree": 2}}})


@pytest.mark.parametrize("argv,word", [(["--problem", "nope"], "--problem"),
                                       (["--problem", "odma", "--steps", "0"], "--steps"),
                                       (["--problem", "odma", "--steps", "0.1,x"],
                                        "--steps"),
                                       (["--problem", "odma", "--temperatures", "nan"],
                                        "--temperatures"),
                                       (["--problem", "odma", "--seed", "-1"], "--seed")])
def test_bad_arguments_exit_2_with_one_line_before_any_work(tmp_path, capsys, argv, word):
    out = tmp_path / "o"
    assert gs.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]
    assert not out.exists()
