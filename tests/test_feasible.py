"""tuner/search/feasible.py: a gradient step that vLLM would refuse to start is repaired
by moving only coordinates the objective is flat in, the least distance that starts;
and the fit applies it (checked with vLLM's own start-up rule and memory profile)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import hardware
from models import get_system, validate_params
from tuner.objective.space import Space
from tuner.search.feasible import FLAT_TOL, Repair


@pytest.fixture(scope="module")
def engine():
    spec = get_system("vllm-v1")
    h100 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    base = validate_params(spec, {}, 4096, None, h100)
    return spec, h100, Space(spec, base)


def _theta(space, **params):
    return space.to_theta({**space.base, **{k: jnp.float32(v) for k, v in params.items()}})


def _grad(space, **nonzero):
    return {n: jnp.float32(nonzero.get(n, 0.0)) for n in space.names}


def test_a_refused_step_lowers_the_flat_coordinate_to_the_wall(engine):
    """1,024 sequences with a 900-token budget: vLLM refuses (budget < sequences).
    With the objective flat in max_num_seqs and steep in the budget, the repair lowers
    max_num_seqs to just at or below 900 and leaves every other coordinate alone."""
    spec, h100, space = engine
    rep = Repair(space, spec.refusal, h100)
    theta = _theta(space, max_num_seqs=1024.0, max_num_batched_tokens=900.0)
    assert rep.refused(theta)
    new, moved = rep(theta, _grad(space, max_num_batched_tokens=-0.3))
    assert [(n, i) for n, i, _ in moved] == [("max_num_seqs", 0)] and moved[0][2] < 0
    p = space.human(space.to_params(new))
    assert spec.refusal(h100, p) is None
    assert 0.97 * 900 <= p["max_num_seqs"] <= p["max_num_batched_tokens"]
    for n in space.names:
        if n != "max_num_seqs":
            assert float(new[n]) == float(theta[n]), n


def test_no_repair_where_it_starts_or_no_flat_coordinate_can_move(engine):
    spec, h100, space = engine
    rep = Repair(space, spec.refusal, h100)
    ok = _theta(space, max_num_seqs=256.0, max_num_batched_tokens=900.0)
    assert rep(ok, _grad(space))[1] == []
    bad = _theta(space, max_num_seqs=1024.0, max_num_batched_tokens=900.0)
    steep = {n: jnp.float32(1.0) for n in space.names}  # nothing flat: left as it is
    new, moved = rep(bad, steep)
    assert moved == [] and all(float(new[n]) == float(bad[n]) for n in space.names)
    # only the budget flat: raising it to the wall is the repair
    new, moved = rep(bad, _grad(space, max_num_seqs=1.0, gpu_memory_utilization=1.0,
                                long_prefill_token_threshold=1.0))
    assert [n for n, _, _ in moved] == ["max_num_batched_tokens"] and moved[0][2] > 0
    p = space.human(space.to_params(new))
    assert spec.refusal(h100, p) is None and p["max_num_batched_tokens"] >= 1024
    # the flat threshold is relative to the largest derivative
    near = _grad(space, max_num_batched_tokens=1.0, max_num_seqs=0.5 * FLAT_TOL)
    assert rep(bad, near)[1][0][0] == "max_num_seqs"
    with pytest.raises(ValueError, match="flat_tol"):
        Repair(space, spec.refusal, h100, flat_tol=math.nan)


def test_the_fit_repairs_a_step_into_the_wall(monkeypatch):
    """In :func:`tuner.search.fitting.fit` every optimiser step passes through the
    repair (recorded in the step's history) unless ``repair`` is off."""
    from tuner.search import fitting

    seen = []

    class Spy:
        def __call__(self, theta, g):
            seen.append(sorted(g))
            return theta, [("max_num_seqs", 0, -0.25)]

    monkeypatch.setattr(fitting, "for_problem", lambda prob, system: Spy())
    from tuner.scenario import ScenarioSpec
    spec = ScenarioSpec(n_requests=48, n_slots=16, max_batch=16, max_len=2048)
    st = fitting.FitSettings(system="s3", objective="tps", budget=2, checks="directions",
                             check_dirs=1, temperatures=(0.1,))
    res = fitting.fit(spec, st, log=lambda s: None)
    assert len(seen) == 2
    assert all(h["repaired"] == [{"param": "max_num_seqs", "index": 0,
                                  "theta_delta": -0.25}] for h in res.history)
    seen.clear()
    res = fitting.fit(spec, fitting.FitSettings(**{**st.to_dict(), "repair": False}),
                      log=lambda s: None)
    assert seen == [] and not any("repaired" in h for h in res.history)
    assert np.isfinite(res.best_exact)
