"""token-pd-tiers (Token-PD with eta, lam, mu_0 and delta per priority tier of streams,
docs/tokenpd-semantics.md section "Per-tier Token-PD"): with equal entries it is
token-pd (exact metrics and the relaxed value), a tier's values act on that tier's
tokens, relaxed gradients w.r.t. per-tier parameters match finite differences, and bad
values are refused. Exact agreement with the token-level reference with different
per-tier values: tests/test_tokenpd_reference.py; invariants: tests/test_invariants.py.

One real-trace slice for every run; per system one compiled run ``run(params, t)`` (the
driver's block loop, plus per-tier kept and held tokens summed over the iterations) is
shared by the tests, and one compiled gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import (family_of, get_system, make_inputs, make_options, metrics,
                    validate_params)
from models.eviction.state import N_TIERS, TIER_BOUNDS
from models.eviction.step import stream_tier
from models.simulate import absorb, init_state
from tests.reference_tokenpd import simulate_reference
from tests.sim_fixtures import HW, config, params_for, trace_workload

N, STEPS, BLOCK = 96, 1600, 8   # STEPS: every request of the slice finishes (asserted)
VECTORS = ("eta", "lam", "mu_0", "delta")


def _tiers(p, **over):
    """token-pd's parameters ``p`` as token-pd-tiers' (every entry equal), then
    ``over`` (name -> (tier, value)) set single entries."""
    out = {k: (jnp.full(N_TIERS, v, jnp.float32) if k in VECTORS else v)
           for k, v in p.items()}
    for k, (tier, v) in over.items():
        out[k] = out[k].at[tier].set(v)
    return out


@pytest.fixture(scope="module")
def runs():
    """``get(system) -> run(params, t) -> (metrics, kept [4], held [4])``: kept and held
    tokens of the running streams of each tier, summed over the iterations (after
    each step). The block loop is ``models.simulate.run_blocks``'s."""
    wl = trace_workload("azure-llm-2023-conv.csv", 0, N, max_len=512, max_prompt=1500)
    # C = 6,000 with budget 0.3: Token-PD's hard budget M = 1,800 tokens
    cfg = config(6000, n_slots=16, admit_window=8, max_len=512, max_prefill=2048.0)
    cache = {}

    def get(system):
        if system in cache:
            return cache[system]
        opts = make_options(system, block=BLOCK)
        inputs = make_inputs(wl, cfg, opts)
        fam = family_of(system)
        sink = fam.sink(opts)

        @jax.jit
        def run(p, t):
            def inner(c, _):
                s, kept, held = c
                s, out = fam.step(s, inputs, p, hw=HW, t=t, opts=opts)
                sl = s.slots
                tier = stream_tier(sl.prompt, TIER_BOUNDS)
                live = sl.status == 1
                k_s = jnp.sum(sl.old_x, 1) + jnp.sum(sl.ring_x, 1)
                n_s = jnp.sum(sl.old_n, 1) + jnp.sum(sl.ring_g >= 0, 1)
                kept = kept + jax.ops.segment_sum(jnp.where(live, k_s, 0.0), tier, N_TIERS)
                held = held + jax.ops.segment_sum(jnp.where(live, n_s, 0.0), tier, N_TIERS)
                return (s, kept, held), out

            def block(c, _):
                c, out = jax.lax.scan(inner, c, None, length=BLOCK)
                s = absorb(c[0], out[1], latency=opts.latency_hist, sink=sink)
                return (fam.end_block(s, inputs, p, t=t, opts=opts),) + c[1:], None

            z = jnp.zeros(N_TIERS, jnp.float32)
            (st, kept, held), _ = jax.lax.scan(block, (init_state(inputs, p, t, opts), z, z),
                                               None, length=STEPS // BLOCK)
            return metrics(st, inputs, opts), kept, held

        cache[system] = run
        return run

    yield get
    cache.clear()


@pytest.fixture(scope="module")
def base():
    return params_for("token-pd", 512, lam=0.0, budget=0.3)


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_equal_vectors_are_token_pd(runs, base):
    """Every entry equal to token-pd's scalar: the same run (every metric, exact and
    relaxed), on a real-trace slice that fills all four tiers and evicts and restores."""
    pd, tiers = runs("token-pd"), runs("token-pd-tiers")
    p4 = _tiers(base)
    for t in (0.0, 0.1):
        want, _, held = pd(base, jnp.float32(t))
        got, _, _ = tiers(p4, jnp.float32(t))
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(float(got[k]), float(want[k]), rtol=1e-6,
                                       atol=1e-9, err_msg=f"{k} at T = {t}")
        if t == 0.0:
            assert float(want["completed"]) == N  # the whole slice within STEPS
            assert float(want["evicted_tokens"]) > 0 and float(want["recompute_tokens"]) > 0
            assert np.all(np.asarray(held) > 0), held  # every tier has streams


@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_a_tiers_values_act_on_that_tiers_tokens(runs, base):
    """Raising tier 3's risk aversion, or its initial price, keeps fewer of tier 3's
    tokens (a smaller share of the tokens its streams hold, over the run); the other
    tiers' tokens are not evicted more for it (their prices see the same or a lower
    memory signal). (Measured before the budget became a hard cap, C = 3,000, budget
    0.5: tier 3's kept share 0.092 -> 0.022 (lam) and 0.013 (mu_0); tiers 0-2 0.32 /
    0.15 / 0.11 -> 0.39 / 0.16 / 0.12.)"""
    run = runs("token-pd-tiers")
    _, kept0, held0 = run(_tiers(base), jnp.float32(0.0))
    share0 = np.asarray(kept0) / np.asarray(held0)
    for over in ({"lam": (3, 100.0)}, {"mu_0": (3, float(base["mu_0"]) * 20.0)}):
        m, kept, held = run(_tiers(base, **over), jnp.float32(0.0))
        share = np.asarray(kept) / np.asarray(held)
        assert float(m["completed"]) == N
        assert share[3] < share0[3] - 0.01, (over, share, share0)
        assert np.all(share[:3] >= share0[:3] - 1e-3), (over, share, share0)


@pytest.mark.xfail(strict=True, reason=(
    "since Token-PD's budget is a hard cap (docs/tokenpd-semantics.md), the exact heap "
    "binds in about every other iteration and orders tokens across tiers by g, which "
    "each tier's own price shifts: the relaxed objective jumps where two tiers' units "
    "swap places. Measured (budget 0.3, 0.4, 0.5 of C = 6,000; step 0.05): 2, 1 and 1 "
    "of the 16 per-tier gradients within 15% of their finite differences. A soft heap "
    "for relaxed runs would be the fix (open)."))
@pytest.mark.needs_traces("azure-llm-2023-conv.csv")
def test_relaxed_gradients_wrt_per_tier_parameters_match_finite_differences(runs, base):
    """d attention_lost / d theta of the relaxed run (T = 0.1; theta = log eta, lam,
    log mu_0, delta, each per tier) equals the central finite difference of the same
    relaxed objective (the same compiled run) for one coordinate of each parameter, in
    different tiers. Measured at these settings (step 0.05): 14 of the 16 gradients
    lie within 20% of their finite differences; not delta[1] (finite difference 9e-5
    at step 0.05, -3.6e-5 at 0.1: a kink) nor mu_0[3] (gradient 0.0014; finite
    difference 0.0011 at step 0.05, -0.0002 at 0.2: the relaxed objective curves)."""
    run = runs("token-pd-tiers")
    p0 = _tiers(dict(base, lam=jnp.float32(0.25)))  # token-pd's default lam, inside
    log = {"eta": True, "lam": False, "mu_0": True, "delta": False}

    def f(z, t):
        p = dict(p0, **{k: jnp.exp(z[i]) if log[k] else z[i] for i, k in enumerate(log)})
        return run(p, t)[0]["attention_lost"]

    z0 = jnp.stack([jnp.log(p0[k]) if log[k] else p0[k] for k in log])
    t = jnp.float32(0.1)
    grad = np.asarray(jax.jit(jax.grad(f))(z0, t))
    h = 0.05
    for i, tier in ((0, 0), (1, 3), (2, 2), (3, 2)):
        e = np.zeros(z0.shape, np.float32)
        e[i, tier] = h
        fd = float(f(z0 + e, t) - f(z0 - e, t)) / (2 * h)
        assert grad[i, tier] == pytest.approx(fd, rel=0.15), (list(log)[i], tier, grad, fd)


def test_reference_with_equal_vectors_is_token_pd():
    """The NumPy reference: token-pd-tiers with every entry equal to token-pd's scalars
    gives token-pd's run (prices per tier equal to the scalar price)."""
    rng = np.random.default_rng(3)
    n = 10
    arrival = np.sort(rng.uniform(0.0, 2.0, n)).astype(np.float32)
    prompt, output = rng.integers(3, 40, n), rng.integers(2, 16, n)
    scalar = {"eta": 0.3, "lam": 0.5, "mu_0": 0.02, "delta": 0.5, "budget": 0.4}
    kw = dict(n_slots=4, max_batch=4, max_prefill=80, capacity=60, watermark=1.0,
              step_time=lambda p, d, c, k, pr: 0.05 + 0.001 * p + 0.01 * d, window=8)
    want = simulate_reference(arrival, prompt, output, np.ones(n, bool),
                              system="token-pd", params=scalar, **kw)
    got = simulate_reference(
        arrival, prompt, output, np.ones(n, bool), system="token-pd-tiers",
        params={k: (v if k == "budget" else [v] * N_TIERS) for k, v in scalar.items()},
        tier_bounds=(10, 20, 30), **kw)
    assert want["restored"] > 0 and want["lost"] > 0
    for k in ("admit_iter", "finish_iter", "finish_s"):
        np.testing.assert_array_equal(got[k], want[k])
    for k in ("restored", "lost", "regret", "violation_signed", "peak_kept", "clock"):
        assert got[k] == want[k], k
    assert got["mu"] == [want["mu"]] * N_TIERS


def test_bad_values_are_refused_with_the_field_named():
    spec = get_system("token-pd-tiers")
    with pytest.raises(ValueError, match=r"'eta' has shape \(3,\), expected \(4,\)"):
        validate_params(spec, {"eta": [0.1, 0.1, 0.1]}, 512)
    with pytest.raises(ValueError, match=r"'eta' must be > 0"):
        validate_params(spec, {"eta": [0.1, -0.1, 0.1, 0.1]}, 512)
    with pytest.raises(ValueError, match=r"'lam' must lie in \[0.0, 100.0\]"):
        validate_params(spec, {"lam": [0.0, 0.0, 0.0, 101.0]}, 512)
    with pytest.raises(ValueError, match=r"'delta' has shape"):
        validate_params(spec, {"delta": 1.0}, 512)
    ok = validate_params(spec, {"lam": [0.0, 0.1, 0.2, 0.3]}, 512)
    assert ok["lam"].shape == (N_TIERS,) and ok["budget"].shape == ()
    # defaults: token-pd's, in every tier
    pd = get_system("token-pd").default_params(512)
    for k, v in spec.default_params(512).items():
        np.testing.assert_array_equal(v, np.broadcast_to(pd[k], v.shape))
    # the tier bounds: three strictly ascending integers, static and hashable
    opts = make_options("token-pd-tiers", tier_bounds=[10, 20, 30])
    assert opts.family.tier_bounds == (10, 20, 30) and hash(opts)
    assert make_options("token-pd-tiers").family.tier_bounds == TIER_BOUNDS
    for bad in ([10, 20], [30, 20, 10], [10, 10, 20], [1.5, 2, 3], [-1, 2, 3]):
        with pytest.raises(ValueError, match="tier_bounds"):
            make_options("token-pd-tiers", tier_bounds=bad)
    tiers = stream_tier(jnp.array([0, 9, 10, 29, 30, 10 ** 6], jnp.int32), (10, 20, 30))
    np.testing.assert_array_equal(np.asarray(tiers), [0, 0, 1, 2, 3, 3])
