"""experiments/bench_validate.py: the ways are timed interleaved, each by its median,
and the report says when the fastest and CPU_LANES cannot be told apart."""

import pytest

from experiments import bench_validate as bv


def _fake(times: dict, order: list):
    """``_once`` replaced: each way's calls take the next of its ``times``; the call
    order is recorded."""
    left = {k: list(v) for k, v in times.items()}

    def once(jobs, hints, lanes):
        order.append(lanes)
        return left[lanes].pop(0), [{"capacity": {"runs": 3}, "goodput_rps": 1.0}]
    return once


def test_ways_are_interleaved_and_timed_by_their_median(monkeypatch):
    order = []
    times = {1: [9.0, 5.0, 7.0, 6.0], 2: [9.0, 3.0, 4.0, 8.0]}
    monkeypatch.setattr(bv, "_once", _fake(times, order))
    ways = bv.measure([0], [1.0], lanes_list=(1, 2), rounds=3, log=lambda s: None)
    # first the compiling runs, then round k starting with way k
    assert order == [1, 2, 1, 2, 2, 1, 1, 2]
    by = {w["lanes"]: w for w in ways}
    assert by[1]["first_s"] == 9.0 and by[1]["walls_s"] == [5.0, 7.0, 6.0]
    assert by[1]["wall_s"] == pytest.approx(6.0)
    assert by[2]["walls_s"] == [3.0, 4.0, 8.0] and by[2]["wall_s"] == pytest.approx(4.0)


@pytest.mark.parametrize("mine, overlap", [([5.0, 6.0, 7.0], True),
                                           ([9.0, 10.0, 11.0], False)])
def test_the_report_says_whether_the_ranges_overlap(mine, overlap):
    fast = {"lanes": 2, "walls_s": [3.0, 4.0, 8.0], "wall_s": 4.0, "runs": 3,
            "first_s": 9.0, "jobs": 1}
    cpu = {"lanes": 4, "walls_s": mine, "wall_s": mine[1], "runs": 3, "first_s": 9.0,
           "jobs": 1}
    res = {"ways": [cpu, fast], "cpus": 2, "jax": "x", "cpu_lanes": 4,
           "max_rel_diff": 0.0, **bv.fastest([cpu, fast], 4)}
    assert res["fastest"] == 2 and res["overlap"] == overlap
    md = bv.render(res)
    assert ("does not tell them apart" in md) == overlap
    assert ("do not overlap" in md) == (not overlap)
    assert "| 2 | 3 | 4.0 | 3.0-8.0 |" in md
