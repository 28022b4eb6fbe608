"""The elastic family (eLLM, vLLM, vLLM-CP): memory model, Algorithm 2's buffer, the
relaxed gradient against finite differences, and bad input. Exact mode against the
NumPy reference: tests/test_elastic_reference.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hardware
from hardware.memory_profile import activation_coefficients, activation_peak_bytes
from models import (deployment_values, get_system, make_inputs, make_options,
                    make_workload, metrics, simulate, validate_params)
from models.elastic.state import LogicalBuffer, W_MAX
from models.elastic.step import _buffer, buffer_bounds, memory
from models.elastic.family import POLICIES
from tests.sim_fixtures import DEP, HW, config


def _inputs(system, cap=3000.0, n=48, seed=0, **cfg_kw):
    rng = np.random.default_rng(seed)
    out = rng.integers(1, 200, n)
    wl = make_workload(np.cumsum(rng.exponential(0.03, n)), rng.integers(20, 400, n), out,
                       out * 1.0, rng.uniform(0, 1, n), pad_to=n)
    cfg = config(cap, n_slots=16, admit_window=4, max_len=256,
                 max_prefill=cfg_kw.pop("max_prefill", 800.0), **cfg_kw)
    opts = make_options(system, block=4)
    return make_inputs(wl, cfg, opts, deployment=DEP), opts


def _params(system, **over):
    p = get_system(system).default_params(256, HW)
    p.update({k: np.float32(v) for k, v in over.items()})
    return {k: jnp.asarray(v) for k, v in p.items()}


def test_activation_coefficients_reproduce_vllm_profile_peak():
    m = hardware.get_model("llama-3-8b-262k")
    for version in ("v0", "v1"):
        c = activation_coefficients(m, version=version)
        for tokens, rows in ((8192, 256), (262144, 256), (512, 64)):
            rows_used = rows if version == "v0" else min(rows, tokens)
            mine = max(c.forward * tokens, c.held * tokens + c.per_row * rows_used + c.fixed)
            ref = activation_peak_bytes(m, max_num_batched_tokens=tokens, max_num_seqs=rows,
                                        version=version)["peak"]
            assert mine == pytest.approx(ref, rel=1e-12)


def test_llama3_8b_262k_preset_has_llama3_shapes_and_long_context():
    a, b = hardware.get_model("llama-3-8b"), hardware.get_model("llama-3-8b-262k")
    assert b.max_position == 262144 and a.max_position == 8192
    for f in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "intermediate_size",
              "vocab_size", "n_params"):
        assert getattr(a, f) == getattr(b, f), f
    assert hardware.get_model("gradientai/Llama-3-8B-Instruct-262k").name == b.name


def test_pool_split_per_system():
    """One pool P = KV capacity + vLLM's activation reservation: vLLM keeps the
    capacity as KV space, vLLM-CP more (its reservation is for 512 tokens), eLLM all."""
    ins, _ = _inputs("vllm")
    cap = float(ins.cfg.capacity_tokens)
    spaces = {}
    for system, pol in POLICIES.items():
        mem = memory(ins.extra, ins.cfg, _params(system), pol)
        spaces[system] = float(mem.space)
        assert float(mem.pool) == pytest.approx(spaces.get("ellm", float(mem.pool)))
    assert spaces["vllm"] == pytest.approx(cap)
    assert cap < spaces["vllm-cp"] < spaces["ellm"]
    # a chunk is 2 MiB of KV (rounded to whole tokens)
    assert float(ins.extra.chunk) == round(2 ** 21 / float(ins.cfg.kv_bytes_per_token))


def _buf(size):
    z = jnp.zeros(W_MAX, jnp.float32)
    return LogicalBuffer(size=jnp.float32(size), ttft_ring=z, tpot_ring=z,
                         owned=jnp.float32(0))


@pytest.mark.parametrize("t", [0.0, 1e-4])
def test_algorithm2_buffer_moves_by_a_on_k_misses_in_w(t):
    p = _params("ellm", a=2.0, k=3.0, w=5.0, cpu_buffer_gib=1.0)
    bnd = (jnp.float32(16.0), jnp.float32(1024.0))  # floor (one unit), B_max in tokens
    b = _buf(16.0)
    sizes = []
    for miss in (1.0, 1.0, 0.0, 1.0):  # 3 TTFT misses within 5 iterations: one event
        b, _ = _buffer(b, jnp.float32(miss), jnp.float32(0.0), p, bnd, jnp.float32(t))
        sizes.append(float(b.size))
    assert sizes == pytest.approx([16.0, 16.0, 16.0, 32.0], rel=1e-3)
    assert float(jnp.sum(b.ttft_ring)) == pytest.approx(0.0, abs=1e-3)  # cleared
    for _ in range(30):  # an event every 3 missed iterations: capped at B_max
        b, _ = _buffer(b, jnp.float32(1.0), jnp.float32(0.0), p, bnd, jnp.float32(t))
    assert float(b.size) == pytest.approx(1024.0, rel=1e-3)
    for _ in range(30):  # TPOT events halve it, never below one unit
        b, _ = _buffer(b, jnp.float32(1.0), jnp.float32(1.0), p, bnd, jnp.float32(t))
    assert float(b.size) == pytest.approx(16.0, rel=1e-3)


def test_algorithm2_relaxed_buffer_gradient_in_a_matches_finite_differences():
    """The relaxed buffer after soft misses is smooth in the factor a: autodiff equals a
    central difference and is not zero. (On the pressured pool below the waiting-request
    TTFT misses drive the buffer to B_max within a few dozen iterations, so a run's
    offloads no longer depend on a: measured |FD| < 1e-3 at T = 0.1 to 2.)"""
    p = _params("ellm", k=2.0, w=5.0)
    bnd = (jnp.float32(16.0), jnp.float32(1e6))
    misses = [(0.9, 0.1), (0.8, 0.0), (0.7, 0.3), (0.9, 0.2), (0.2, 0.9), (0.6, 0.1)] * 3

    def size(a):
        b = _buf(16.0)
        for mt, mp in misses:
            b, _ = _buffer(b, jnp.float32(mt), jnp.float32(mp), dict(p, a=a), bnd,
                           jnp.float32(0.5))
        return b.size

    g = float(jax.grad(size)(jnp.float32(2.0)))
    h = 1e-2
    fd = (float(size(jnp.float32(2.0 + h))) - float(size(jnp.float32(2.0 - h)))) / (2 * h)
    assert abs(fd) > 1e-2 and g == pytest.approx(fd, rel=0.02), (g, fd)


def test_algorithm2_window_excludes_old_misses():
    """Missed iterations older than w do not count (3 misses, the first 5 lags before
    the last: outside a 5-iteration window, inside a 6-iteration one)."""
    p = _params("ellm", k=3.0, w=5.0)
    b = _buf(16.0)
    for miss in (1.0, 0.0, 0.0, 0.0, 1.0, 1.0):
        b, _ = _buffer(b, jnp.float32(miss), jnp.float32(0.0), p,
                       (jnp.float32(16.0), jnp.float32(2.0 ** 36)), jnp.float32(0.0))
    assert float(b.size) == 16.0
    p = _params("ellm", k=3.0, w=6.0)  # the same misses inside a 6-iteration window
    b = _buf(16.0)
    for miss in (1.0, 0.0, 0.0, 0.0, 1.0, 1.0):
        b, _ = _buffer(b, jnp.float32(miss), jnp.float32(0.0), p,
                       (jnp.float32(16.0), jnp.float32(2.0 ** 36)), jnp.float32(0.0))
    assert float(b.size) == 32.0


def test_buffer_unit_is_the_start_and_floor_and_is_capped_by_b_max():
    """docs/elastic-semantics.md step 8: B_logic starts at one buffer unit (1 GiB unless
    the family option says otherwise), in KV tokens of the deployment, and B_max caps
    it."""
    ins, opts = _inputs("ellm")
    kvb = float(ins.cfg.kv_bytes_per_token)
    for gib, unit in ((64.0, 2.0 ** 30 / kvb), (0.5, 0.5 * 2.0 ** 30 / kvb)):
        floor, b_max = buffer_bounds(ins.extra, _params("ellm", cpu_buffer_gib=gib), kvb)
        assert float(floor) == pytest.approx(unit, rel=1e-6)
        assert float(b_max) == pytest.approx(gib * 2.0 ** 30 / kvb, rel=1e-6)
    st, _ = jax.jit(lambda p: simulate(ins, HW, p, 0.0, opts, 0))(_params("ellm"))
    assert float(st.buf.size) == pytest.approx(2.0 ** 30 / kvb, rel=1e-6)
    small = make_options("ellm", block=4, buffer_unit_mib=1.0)
    ins2 = make_inputs(ins.wl, ins.cfg, small, deployment=DEP)
    floor, _ = buffer_bounds(ins2.extra, _params("ellm"), kvb)
    assert float(floor) == pytest.approx(2.0 ** 20 / kvb, rel=1e-6)
    with pytest.raises(ValueError, match="buffer_unit_mib"):
        make_options("ellm", buffer_unit_mib=0.0)


def test_violation_events_need_a_request_that_misses():
    """Algorithm 2 counts SLO misses of requests (the paper's TPOT: the mean time
    between a request's tokens): with SLOs just above every request's TTFT and TPOT of
    the run without events, no event fires and the run is the same. (A detector that
    took early tokens' TPOT-so-far fired here with every request meeting both SLOs.)"""
    ins, opts = _loaded()
    opts = make_options("ellm", block=4, chunk_mib=0.25, buffer_unit_mib=0.25,
                        record=True)
    run = jax.jit(lambda cfg, p: simulate(ins.replace(cfg=cfg), HW, p, 0.0, opts, 1500)[0])
    base = ins.cfg.replace(ttft_slo_s=jnp.float32(1e6), tpot_slo_s=jnp.float32(1e6))
    st = run(base, _params("ellm"))
    wl, rec = ins.wl, st.rec
    done = np.asarray(rec.finish_iter) >= 0
    assert done.all()
    first, fin = np.asarray(rec.first_s), np.asarray(rec.finish_s)
    out = np.asarray(wl.output_tokens)
    ttft = first - np.asarray(wl.arrival_s) + float(HW.request_overhead_s)
    tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), 0.0)
    # the per-token gaps are uneven (prefill-first iterations stall the decoders)
    cfg = base.replace(ttft_slo_s=jnp.float32(ttft.max() * 1.01),
                       tpot_slo_s=jnp.float32(tpot.max() * 1.01))
    st2 = run(cfg, _params("ellm"))
    m = {k: float(v) for k, v in metrics(st2, ins.replace(cfg=cfg), opts).items()}
    assert m["tpot_events"] == 0 and m["ttft_events"] == 0
    np.testing.assert_array_equal(np.asarray(st2.rec.finish_s), fin)
    assert m["slo_attainment"] == 1.0


def _loaded():
    """A pressured pool: eLLM inflates and (with a small TTFT SLO) offloads. The buffer
    unit is one chunk, so Algorithm 2 must grow the buffer before it holds a prompt."""
    rng = np.random.default_rng(3)
    n = 48
    out = rng.integers(20, 160, n)
    wl = make_workload(np.cumsum(rng.exponential(0.01, n)), rng.integers(50, 300, n), out,
                       out * 1.0, rng.uniform(0, 1, n), pad_to=n)
    cfg = config(2500.0, n_slots=24, admit_window=4, max_len=256, max_prefill=600.0)
    cfg = cfg.replace(ttft_slo_s=jnp.float32(0.05), tpot_slo_s=jnp.float32(5.0))
    opts = make_options("ellm", block=4, chunk_mib=0.25, buffer_unit_mib=0.25)
    return make_inputs(wl, cfg, opts, deployment=DEP), opts


def test_ellm_offloads_and_fetches_under_pressure_and_inflates():
    ins, opts = _loaded()
    st, _ = jax.jit(lambda p: simulate(ins, HW, p, 0.0, opts, 1500))(_params("ellm"))
    m = {k: float(v) for k, v in metrics(st, ins, opts).items()}
    assert m["completed"] == 48
    assert m["offloads"] > 0 and m["offload_gib"] > 0
    assert m["fetch_gib"] == pytest.approx(m["offload_gib"], rel=1e-6)
    assert m["inflation_events"] > 0 and m["peak_inflated_gib"] > 0
    assert m["ttft_events"] > 0
    assert m["peak_gpu_share"] <= 1.0 + 1e-6


@pytest.fixture(scope="module")
def relaxed_loaded():
    """The relaxed metrics of the pressured pool as one compiled function of (params,
    T), shared by the gradient cases (the same code whatever the metric, the argument
    and the temperature: one compile, not one per case)."""
    ins, opts = _loaded()

    @jax.jit
    def run(params, t):
        st, _ = simulate(ins, HW, params, t, opts, 400)
        return metrics(st, ins, opts)

    return run


@pytest.mark.parametrize("t, metric, arg, rel", [
    (2.0, "completed", "theta", 0.05),   # admission weights at the theta gate
    (2.0, "tps", "theta", 0.1),
])
def test_relaxed_gradient_matches_finite_differences(t, metric, arg, rel, relaxed_loaded):
    """Autodiff of a relaxed metric equals a central finite difference of the same
    relaxed function, and is not zero (the relaxed path is smooth in theta and a)."""
    base = _params("ellm", theta=0.02 if arg == "theta" else 0.01)
    h = {"theta": 1e-3, "a": 2e-2}[arg]

    def f(x):
        return relaxed_loaded(dict(base, **{arg: x}), jnp.float32(t))[metric]

    g = float(jax.grad(f)(base[arg]))
    fd = (float(f(base[arg] + h)) - float(f(base[arg] - h))) / (2 * h)
    assert abs(fd) > 1e-3 and g == pytest.approx(fd, rel=rel), (g, fd)


def test_deployment_values_describe_the_split():
    ins, opts = _inputs("vllm-cp")
    d = deployment_values(ins, _params("vllm-cp"), opts)
    assert d["max_num_batched_tokens"] == 512 and d["kv_space_tokens"] < d["pool_tokens"]
    ins, opts = _inputs("ellm")
    d = deployment_values(ins, _params("ellm"), opts)
    assert d["violation_event"] == "3 SLO misses within 5 iterations"
    assert d["theta_tokens"] == int(0.01 * d["pool_tokens"])


def test_bad_input_is_one_clear_error():
    rng = np.random.default_rng(0)
    wl = make_workload(np.arange(4.0), np.full(4, 10), np.full(4, 5), np.full(4, 5.0),
                       rng.uniform(0, 1, 4))
    cfg = config(1000.0)
    with pytest.raises(ValueError, match="needs the deployment"):
        make_inputs(wl, cfg, make_options("ellm"))
    with pytest.raises(ValueError, match="unknown option"):
        make_options("ellm", window=3)
    with pytest.raises(ValueError, match="chunk_mib"):
        make_options("ellm", chunk_mib=0)
    with pytest.raises(ValueError, match="'a'"):
        validate_params(get_system("ellm"), {"a": 0.5}, 256)
    with pytest.raises(ValueError, match="'theta'"):
        validate_params(get_system("ellm"), {"theta": math.nan}, 256)


def test_fit_warns_when_a_window_is_one_burst():
    """40 requests that eLLM's pool holds at once: goodput (rescaled arrivals) exceeds
    the saturation throughput, which sustained load cannot; tuner.fit warns."""
    from tuner.objective.evaluate import evaluate
    from tuner.search.fitting import finite_window
    from tuner.scenario import ScenarioSpec, build_scenario

    sc = build_scenario(ScenarioSpec(
        trace="fixed:2048:256:40", hardware="a100-80gb", model="llama-3-8b-262k",
        max_model_len=262144, max_prefill=262144, gpu_memory_utilization=0.95, rate=1.0,
        n_slots=64, max_batch=64, admit_window=16))
    cap = evaluate(sc, "ellm", {}, objective="goodput_rps")
    assert cap["goodput_rps"] > 1.5 * cap["saturation_rps"], cap
    msg = finite_window(sc, cap)
    assert "40 requests" in msg and "one burst" in msg and "--window-requests" in msg
