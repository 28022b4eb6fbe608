"""Relaxed mode: converges to exact as T falls, finite gradients, gradients equal finite
differences of the relaxed simulator where its structure is fixed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import make_inputs, metrics, relax, simulate
from tests.sim_fixtures import HW, config, opts_for, params_for, trace_workload

needs_azure = pytest.mark.needs_traces("azure-llm-2023-conv.csv")
ODMA_EXTRA = {"large_share": 0.3}


@pytest.fixture(scope="module")
def azure():
    return trace_workload("azure-llm-2023-conv.csv", 2000, 150, max_len=1024, pad_to=160)


def _runner(wl, cfg, kind, n_steps):
    opts = opts_for(kind, record=False)
    inputs = make_inputs(wl, cfg, opts)

    @jax.jit
    def run(p, t):
        st, _ = simulate(inputs, HW, p, t, opts, n_steps)
        return metrics(st, inputs, opts)

    return run


@needs_azure
@pytest.mark.parametrize("kind", ["s3", "odma"])
def test_relaxed_converges_to_exact(azure, kind):
    cfg = config(60000)
    run = _runner(azure, cfg, kind, 4000)
    p = params_for(kind, 1024, **(ODMA_EXTRA if kind == "odma" else {}))
    exact = run(p, jnp.float32(0.0))
    assert float(exact["unserved"]) == 0.0
    errs = []
    for t in (0.3, 0.03, 0.003, 0.0003):
        m = run(p, jnp.float32(t))
        errs.append(max(abs(float(m[k] - exact[k])) / abs(float(exact[k]))
                        for k in ("tps", "kv_utilization", "accuracy")))
    assert errs[-1] < 1e-3, errs
    assert errs[-1] <= errs[0], errs


@needs_azure
@pytest.mark.parametrize("kind", ["paged", "s3", "odma"])
def test_gradients_are_finite(azure, kind):
    cfg = config(30000)
    run = _runner(azure, cfg, kind, 1500)
    p = params_for(kind, 1024, **(ODMA_EXTRA if kind == "odma" else {}))

    def obj(q):
        m = run(q, jnp.float32(0.05))
        return m["tps"] * m["kv_utilization"]

    g = jax.grad(obj)(p)
    for k, v in g.items():
        assert np.all(np.isfinite(np.asarray(v))), k
    if kind == "odma":  # every continuous ODMA parameter influences the objective
        assert all(np.any(np.asarray(g[k]) != 0) for k in ("levels", "gamma", "tau"))


@needs_azure
def test_gradient_matches_relaxed_finite_differences(azure):
    """Implementation check: with ample memory the structure does not move under small
    perturbations, so the relaxed simulator is smooth and grad == central FD."""
    cfg = config(2_000_000)
    run = _runner(azure, cfg, "odma", 300)
    t = jnp.float32(0.5)
    p = params_for("odma", 1024, **ODMA_EXTRA)

    def util(q):
        return run(q, t)["kv_utilization"]

    g = jax.grad(util)(p)
    for name, idx in (("levels", 1), ("levels", 2), ("gamma", None), ("tau", None)):
        base = np.asarray(p[name], np.float64)
        eps = 2e-3
        vals = []
        for s in (1, -1):
            v = base.copy()
            if idx is None:
                v = v + s * eps
            else:
                v[idx] += s * eps
            vals.append(float(util(dict(p, **{name: jnp.asarray(v, jnp.float32)}))))
        fd = (vals[0] - vals[1]) / (2 * eps)
        got = float(np.asarray(g[name]).reshape(-1)[idx or 0])
        assert got == pytest.approx(fd, rel=0.05, abs=1e-4), (name, idx, got, fd)


def test_relax_primitives_against_finite_differences():
    x = jnp.linspace(-2.0, 2.0, 9)
    t = jnp.float32(0.5)
    g = jax.vmap(jax.grad(lambda v: relax.soft_ge(v, 0.3, t)))(x)
    fd = (relax.soft_ge(x + 1e-3, 0.3, t) - relax.soft_ge(x - 1e-3, 0.3, t)) / 2e-3
    np.testing.assert_allclose(g, fd, rtol=1e-2, atol=1e-4)
    # hard at T = 0, and no NaN gradient leaks from the unused soft branch
    assert float(relax.soft_ge(0.3, 0.3, 0.0)) == 1.0
    assert float(relax.soft_gt(0.3, 0.3, 0.0)) == 0.0
    assert np.isfinite(float(jax.grad(lambda v: relax.soft_ge(v, 0.3, 0.0))(0.3)))
    probs = relax.first_true_probs(jnp.array([[0.2, 0.7, 0.9]]))
    assert float(jnp.sum(probs)) == pytest.approx(1.0)
    # the soft quantile is smooth in the level and exact at T = 0
    lengths = np.array([3, 3, 5, 8, 8, 8, 13, 40])
    hist = np.bincount(lengths, minlength=64).astype(np.float32)
    cdf = jnp.cumsum(hist) / hist.sum()
    for p in (0.1, 0.3, 0.5, 0.74, 0.9):
        want = np.quantile(lengths, p, method="inverted_cdf")
        assert float(relax.quantile_from_cdf(cdf, p, 0.0)) == want
    gq = jax.grad(lambda p: relax.quantile_from_cdf(cdf, p, 0.02))(0.7)
    fq = (relax.quantile_from_cdf(cdf, 0.701, 0.02)
          - relax.quantile_from_cdf(cdf, 0.699, 0.02)) / 0.002
    assert float(gq) == pytest.approx(float(fq), rel=2e-2)
