"""Per-request priorities (vLLM V1's ``--scheduling-policy priority``) in the bucketed
server: exact mode equals the NumPy reference (its Interpretation 22), equal priorities
are first-come-first-served, every request is accounted for, and the families that do
not read priorities refuse them."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models import Inputs, make_inputs, make_options, make_workload
from models.simulate import init_state
from tests.sim_fixtures import config, params_for, run_jax, run_reference, trace_workload
from tests.test_bucketed_reference import _check_case, _compare, small_cases

TRACE = "azure-llm-2023-conv.csv"


def _with_priority(wl, prio):
    n = int(np.sum(np.asarray(wl.valid)))
    p = np.full(wl.size, np.inf, np.float32)
    p[:n] = prio[:n]
    return wl.replace(priority=np.asarray(p))


# kind, start, capacity, server settings, extra params
CASES = [
    ("paged", 5000, 20000, {"watermark": 200.0}, {}),
    ("paged", 0, 12000, {"chunked": True, "max_prefill": 1024.0}, {"block_size": 32}),
    ("odma", 0, 30000, {}, {"large_share": 0.3}),
    ("s3", 9000, 20000, {"chunked": True}, {}),
    ("static", 0, 30000, {"priority_window": 12}, {}),
]


@pytest.mark.needs_traces(TRACE)
@pytest.mark.parametrize("kind,start,cap,server,extra", CASES)
def test_priority_matches_reference(kind, start, cap, server, extra):
    """Random integer priorities (ties broken by arrival), the same requests, the
    same settings: every admission and finish iteration equals the reference's."""
    n = 200
    wl = trace_workload(TRACE, start, n, max_len=1024, pad_to=256)
    rng = np.random.default_rng(start + cap)
    wl = _with_priority(wl, rng.integers(0, 4, 256).astype(np.float32))
    cfg = config(cap, **server)
    m = _compare(wl, cfg, kind, params_for(kind, 1024, **extra))
    assert m["completed"] + m["unserved"] == n


@pytest.mark.needs_traces(TRACE)
def test_priority_reorders_admission():
    """Shortest prompt first against first-come-first-served on a queue that builds
    up: the admission order follows the priorities (a check that the ordering is live,
    not only equal to the reference)."""
    n = 200
    wl = trace_workload(TRACE, 0, n, max_len=1024, pad_to=256)
    cfg = config(8000, n_slots=16)
    params = params_for("paged", 1024)
    st0, _ = run_jax(wl, cfg, "paged", params)
    prompt = np.asarray(wl.prompt_tokens).astype(np.float32)
    st1, _ = run_jax(_with_priority(wl, prompt), cfg, "paged", params)
    a0 = np.asarray(st0.rec.admit_iter)[:n]
    a1 = np.asarray(st1.rec.admit_iter)[:n]
    assert np.all(np.diff(a0) >= 0)  # FCFS admits in arrival order
    assert np.any(np.diff(a1) < 0)  # by prompt length: later arrivals overtake
    # among requests admitted in the same or later iterations, shorter ones went first
    # more often than not
    late = a1 > 0
    short = prompt[:n] < np.median(prompt[:n])
    assert np.mean(a1[late & short]) < np.mean(a1[late & ~short])


@pytest.mark.needs_traces(TRACE)
@pytest.mark.parametrize("kind", ["paged", "odma"])
def test_equal_priorities_are_fcfs(kind):
    """A constant priority is first-come-first-served: the record equals the run
    without priorities."""
    n = 150
    wl = trace_workload(TRACE, 2000, n, max_len=1024, pad_to=256)
    cfg = config(15000, chunked=True)
    params = params_for(kind, 1024)
    st0, m0 = run_jax(wl, cfg, kind, params)
    st1, m1 = run_jax(_with_priority(wl, np.full(256, 3.0, np.float32)), cfg, kind,
                      params)
    for f in ("admit_iter", "finish_iter", "first_s", "finish_s"):
        np.testing.assert_array_equal(np.asarray(getattr(st0.rec, f)),
                                      np.asarray(getattr(st1.rec, f)), err_msg=f)
    assert m0 == m1


def test_make_workload_checks_priority():
    with pytest.raises(ValueError, match="'priority'.*NaN"):
        make_workload([0.0, 1.0], [5, 5], [3, 3], priority=[0.0, float("nan")])
    with pytest.raises(ValueError, match="'priority'.*shape"):
        make_workload([0.0, 1.0], [5, 5], [3, 3], priority=[0.0])
    wl = make_workload([1.0, 0.0], [5, 6], [3, 3], priority=[2.0, 1.0], pad_to=3)
    # sorted with the requests by arrival; the padding row last
    assert np.asarray(wl.priority).tolist() == [1.0, 2.0, np.inf]


@pytest.mark.parametrize("system", ["ellm", "token-pd", "kunserve"])
def test_other_families_refuse_priorities(system):
    wl = make_workload([0.0, 1.0], [5, 5], [3, 3], priority=[0.0, 1.0])
    opts = make_options(system)
    with pytest.raises(ValueError, match="per-request priorities"):
        make_inputs(wl, config(4000), opts)
    # a policy that sets priorities after the inputs were made (tuner.objective.learned)
    with pytest.raises(ValueError, match="per-request priorities"):
        init_state(Inputs(wl=wl, cfg=config(4000), extra=None), {}, 0.0, opts)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_cases(), st.data())
def test_priority_parity_on_random_workloads(case, data):
    """The reference parity and invariants of test_bucketed_reference's random cases,
    with random priorities (ties included) and windows shorter than the queue."""
    wl, cfg, kind, params, n, family = case
    prio = data.draw(st.lists(st.integers(0, 3), min_size=wl.size, max_size=wl.size))
    wl = _with_priority(wl, np.asarray(prio, np.float32))
    cfg = dataclasses.replace(cfg, priority_window=data.draw(st.sampled_from([4, 6, 256])))
    _check_case((wl, cfg, kind, params, n, family))


def test_priority_preemptions_refuses_bad_arguments(tmp_path, capsys):
    from experiments.priority_preemptions import main

    assert main(["--out", str(tmp_path / "o"), "--rates", "4,-1"]) == 2
    assert "--rates" in capsys.readouterr().err
    assert main(["--out", str(tmp_path / "o"), "--requests", "0"]) == 2
    assert "--requests 0: must be >= 1" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["--out", str(blocker / "o")]) == 2
    assert "--out" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_priority_preemptions_renders_what_it_measured():
    from experiments.priority_preemptions import render

    rows = [{"rate_rps": 4.4, "order": o, "preemptions": p, "completed": 10.0,
             "dropped": 0.0, "slo_attainment": 0.9} for o, p in
            (("fcfs", 0.0), ("short-prompt-first", 3.0))]
    md = render({"requests": 10, "capacity_tokens": 1000, "rows": rows, "wall_s": 1.0})
    assert "| 4.4 | short-prompt-first | 3 | 10 | 0 | 0.900 |" in md
    assert "At most 3 preemptions in a run of 10 requests" in md
