"""The smooth exact objective: each request's probability of meeting its SLOs under
lognormal latency noise (``models.outcomes.expected_slo_attainment``), against a NumPy
reference that reads the run's record; its goodput (``goodput_expected_rps``) as the
root of the expected attainment curve over workload realisations."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from models import get_system, metrics, simulate_until_done, validate_params
from models.outcomes import SLO_NOISE, expected_slo_attainment
from tuner.objective.capacity import RTOL_EXPECTED
from tuner.objective.evaluate import evaluate_many
from tuner.scenario import ScenarioSpec, build_scenario

SPEC = ScenarioSpec(n_requests=120, n_slots=32, max_batch=32)  # test_batched_eval's


def _reference(rec, wl, ttft_slo, tpot_slo, noise):
    """Per-request probability of meeting both SLOs, from the record, in plain NumPy."""
    def phi(z):
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    out = []
    for i in range(len(wl["valid"])):
        if not wl["valid"][i] or rec["finish_iter"][i] < 0:
            out.append(0.0)
            continue
        ttft = rec["first_s"][i] - wl["arrival_s"][i]
        p = phi(math.log(ttft_slo / ttft) / noise)
        if wl["output_tokens"][i] > 1:
            tpot = (rec["finish_s"][i] - rec["first_s"][i]) / (wl["output_tokens"][i] - 1)
            p *= phi(math.log(tpot_slo / tpot) / noise)
        out.append(p)
    return np.array(out)


@pytest.fixture(scope="module")
def finished_run():
    sc = build_scenario(SPEC).at_rate(6.0)  # loaded: some requests miss their SLOs
    system = "paged"
    opts = sc.options(system, record=True)
    p = {k: jnp.asarray(v) for k, v in
         validate_params(get_system(system), {}, sc.cfg.max_len, sc.hw).items()}
    x = sc.inputs(system)
    st = simulate_until_done(x, sc.hw, p, opts)
    return sc, x, st, {k: float(v) for k, v in metrics(st, x, opts).items()}


def test_expected_attainment_equals_the_numpy_reference(finished_run):
    sc, x, st, m = finished_run
    rec = {k: np.asarray(getattr(st.rec, k), np.float64)
           for k in ("first_s", "finish_s", "finish_iter")}
    wl = {k: np.asarray(getattr(x.wl, k), np.float64)
          for k in ("valid", "arrival_s", "output_tokens")}
    ttft_slo, tpot_slo = float(sc.cfg.ttft_slo_s), float(sc.cfg.tpot_slo_s)
    ref = _reference(rec, wl, ttft_slo, tpot_slo, SLO_NOISE)
    got = np.asarray(expected_slo_attainment(st, x, SLO_NOISE), np.float64)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    n = wl["valid"].sum()
    assert m["slo_attainment_expected"] == pytest.approx(ref.sum() / n, abs=1e-5)
    # not vacuous: some requests are neither sure to meet nor sure to miss
    assert 0.2 < m["slo_attainment"] < 0.98 and np.any((ref > 0.01) & (ref < 0.99))
    # noise -> 0: each factor is the SLO's indicator, the count behind slo_attainment
    sharp = np.asarray(expected_slo_attainment(st, x, 1e-5), np.float64)
    assert sharp.sum() / n == pytest.approx(m["slo_attainment"], abs=0.5 / n)


def test_expected_goodput_is_the_root_of_the_mean_curve_over_realisations():
    a, b = (build_scenario(SPEC.replace(seed=s, rate=5.0)) for s in (0, 1))
    assert not np.array_equal(np.asarray(a.workload.arrival_s),
                              np.asarray(b.workload.arrival_s))  # realisations differ
    rates = [2.0, 3.0, 4.5, 6.0, 8.0]
    ra, rb, both = evaluate_many([(a, "paged", None), (b, "paged", None),
                                  ((a, b), "paged", None)],
                                 objective="goodput_expected_rps", rates=[rates] * 3)
    # the realisations' job reads the mean of each realisation's curve
    ea, eb = ra["capacity"]["expected_rungs"], rb["capacity"]["expected_rungs"]
    shared = [r for r in both["capacity"]["expected_rungs"] if r in ea and r in eb]
    assert shared and any(ea[r] != eb[r] for r in shared)
    for r in shared:
        assert both["capacity"]["expected_rungs"][r] == pytest.approx(
            (ea[r] + eb[r]) / 2, abs=1e-6), r
    for res in (ra, rb, both):
        lo, hi = res["capacity"]["expected_bracket_rps"]
        rungs = res["capacity"]["expected_rungs"]
        # the bracket straddles the target and is bisected to RTOL_EXPECTED
        assert rungs[f"{lo:.6g}"] >= 0.9 > rungs[f"{hi:.6g}"]
        assert hi / lo <= 1 + RTOL_EXPECTED + 1e-9
        assert lo <= res["goodput_expected_rps"] <= hi
        assert res["goodput_rps"] > 0 and res["objective"] == res["goodput_expected_rps"]
    # the mean curve's root lies between the realisations' own roots
    g = sorted([ra["goodput_expected_rps"], rb["goodput_expected_rps"]])
    assert g[0] * (1 - RTOL_EXPECTED) <= both["goodput_expected_rps"] <= \
        g[1] * (1 + RTOL_EXPECTED)


def test_the_gradient_through_the_record_is_finite_where_requests_did_not_finish():
    """An unfinished request's record holds no (or a NaN) time; the masked branch of a
    ``where`` would still pass its NaN into the gradient of the finished ones."""
    import jax
    from types import SimpleNamespace as NS

    wl = NS(valid=jnp.array([True, True, True, False]),
            arrival_s=jnp.array([0.0, 0.5, 1.0, 0.0]),
            output_tokens=jnp.array([10, 1, 5, 3]))
    cfg = NS(ttft_slo_s=jnp.float32(1.0), tpot_slo_s=jnp.float32(0.1))
    inputs = NS(wl=wl, cfg=cfg)
    finish_iter = jnp.array([5, 3, -1, -1])

    def f(first_s, finish_s):
        st = NS(rec=NS(first_s=first_s, finish_s=finish_s, finish_iter=finish_iter))
        return jnp.sum(expected_slo_attainment(st, inputs, SLO_NOISE))

    first = jnp.array([0.9, 1.4, jnp.nan, jnp.nan])
    finish = jnp.array([1.8, 1.4, jnp.nan, 0.0])
    g_first, g_finish = jax.grad(f, argnums=(0, 1))(first, finish)
    assert np.all(np.isfinite(g_first)) and np.all(np.isfinite(g_finish))
    # the finished requests near their SLOs move the sum; the others do not
    assert g_first[0] != 0 and g_finish[0] != 0 and g_first[1] != 0
    assert g_first[2] == g_first[3] == g_finish[2] == g_finish[3] == 0
