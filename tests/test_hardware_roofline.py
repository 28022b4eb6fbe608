"""The roofline step model: hand calculations, limits, and jit/vmap/grad behaviour."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hardware as hw


@pytest.fixture(scope="module")
def mlu():
    return hw.roofline_params(
        hw.make_deployment("mlu370-x4", "deepseek-r1-distill-qwen-7b")
    )


@pytest.fixture(scope="module")
def h100():
    return hw.roofline_params(hw.make_deployment("h100-80gb", "llama-3-8b"))


def test_effective_bandwidth_limits():
    b, a, burst = 307.2e9, 0.5, 1024.0
    assert hw.effective_bandwidth(b, a, burst, 0.0) == pytest.approx(a * b)
    assert hw.effective_bandwidth(b, a, burst, 1e-3) == pytest.approx(a * b, rel=1e-6)
    assert hw.effective_bandwidth(b, a, burst, 1e15) == pytest.approx(b, rel=1e-9)
    assert hw.effective_bandwidth(b, a, burst, burst) == pytest.approx((1 + a) / 2 * b)
    chunks = np.array([1.0, 64.0, 512.0, 4096.0, 1e6])
    bws = hw.effective_bandwidth(b, a, burst, chunks)  # NumPy in, NumPy out
    assert np.all(np.diff(bws) > 0) and np.all((bws > a * b) & (bws < b))


def test_params_by_hand(mlu):
    assert mlu.weight_bytes == 7_615_616_512 * 2 / 4
    assert mlu.kv_bytes_per_token == 57344 / 4
    assert mlu.kv_bytes_per_token_layer == 512
    assert mlu.dense_flops_per_token == 2 * 7_615_616_512 / 4
    assert mlu.attn_flops_per_ctx_token == 4 * 28 * 28 * 128 / 4
    assert (mlu.stream_bw, mlu.alpha, mlu.peak_flops) == (307.2e9, 0.5, 96e12)
    assert (mlu.mfu, mlu.bw_eff, mlu.step_overhead_s, mlu.pp) == (0.5, 0.8, 2e-3, 1.0)
    assert all(isinstance(leaf, float) for leaf in mlu)


def test_decode_bound_by_hand(mlu):
    seqs, ctx, chunk = 32, 32 * 2048, 2048  # contiguous 2048-token reservations
    bw = 307.2e9 * 0.8
    kv_bw = bw * (0.5 + 0.5 * (chunk * 512) / (chunk * 512 + 1024))
    memory = 7_615_616_512 * 2 / 4 / bw + ctx * 14336 / kv_bw
    compute = (seqs * 2 * 7_615_616_512 / 4 + ctx * 4 * 28 * 28 * 128 / 4) / 48e12
    assert memory > 5 * compute
    got = hw.iteration_time(mlu, 0, seqs, ctx, chunk)
    assert float(got) == pytest.approx(memory + 2e-3, rel=1e-6)


def test_compute_bound_by_hand(h100):
    n = 8192  # one fresh prompt
    flops = n * 2 * 8_030_261_248 + n * (n + 1) / 2 * 4 * 32 * 32 * 128
    compute = flops / (989.4e12 * 0.5)
    memory = 2 * 8_030_261_248 / (3.35e12 * 0.8)
    assert compute > 10 * memory
    got = hw.iteration_time(h100, n, 0, 0, 16)
    assert float(got) == pytest.approx(compute + 2e-3, rel=1e-6)
    explicit = hw.iteration_time(h100, n, 0, 0, 16, prefill_ctx_tokens=n * (n + 1) / 2)
    assert float(explicit) == pytest.approx(float(got), rel=1e-6)


def test_empty_iteration_costs_only_overhead(mlu):
    assert float(hw.iteration_time(mlu, 0, 0, 0, 16)) == pytest.approx(2e-3)


def test_copy_reads_and_writes(mlu):
    base = float(hw.iteration_time(mlu, 0, 1, 100, 100))
    with_copy = float(hw.iteration_time(mlu, 0, 1, 100, 100, copy_bytes=1e9))
    assert with_copy - base == pytest.approx(2e9 / (307.2e9 * 0.8), rel=1e-5)


def test_paging_penalty_lpddr_vs_hbm(mlu):
    a100 = hw.roofline_params(
        hw.make_deployment("a100-80gb", "deepseek-r1-distill-qwen-7b")
    )
    args = (0, 64, 64 * 4096)

    def slowdown(p):
        paged = hw.iteration_time(p, *args, kv_chunk_tokens=1)
        contiguous = hw.iteration_time(p, *args, kv_chunk_tokens=4096)
        return float(paged / contiguous)

    assert slowdown(mlu) > 1.2  # LPDDR pays for scattered KV reads
    assert 1.0 < slowdown(a100) < 1.15  # HBM barely does
    assert slowdown(mlu) > slowdown(a100)


def test_pipeline_stages_add_up():
    dep = hw.make_deployment("a100-80gb", "llama-2-70b", tp=2, pp=2)
    p = hw.roofline_params(dep)
    stage = float(
        hw.iteration_time(p._replace(pp=1.0, step_overhead_s=0.0), 0, 8, 8000, 16)
    )
    total = float(hw.iteration_time(p, 0, 8, 8000, 16))
    assert total == pytest.approx(2 * stage + 2e-3, rel=1e-6)


def test_jit_vmap_matches_python(mlu):
    prefill = np.array([0, 512, 0, 2048], np.int32)
    decode = np.array([16, 8, 0, 64], np.int32)
    ctx = np.array([16 * 900, 8 * 300, 0, 64 * 5000], np.float32)
    chunk = np.array([16, 16, 16, 5000], np.int32)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(p, *xs):
        return jax.vmap(hw.iteration_time, in_axes=(None, 0, 0, 0, 0))(p, *xs)

    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        got = run(mlu, prefill, decode, ctx, chunk)
        run(mlu, prefill + 1, decode, ctx, chunk)  # new values, no retrace
    want = [
        float(hw.iteration_time(mlu, int(a), int(b), float(c), int(d)))
        for a, b, c, d in zip(prefill, decode, ctx, chunk)
    ]
    chex.assert_shape(got, (4,))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_vmap_over_hardware(mlu, h100):
    stacked = jax.tree.map(lambda a, b: jnp.array([a, b], jnp.float32), mlu, h100)
    got = jax.vmap(hw.iteration_time, in_axes=(0, None, None, None, None))(
        stacked, 128, 32, 32 * 1000, 16
    )
    for i, p in enumerate((mlu, h100)):
        assert float(got[i]) == pytest.approx(
            float(hw.iteration_time(p, 128, 32, 32 * 1000, 16)), rel=1e-5
        )


def test_gradients_are_finite(mlu):
    def f(ctx, chunk, alpha):
        return hw.iteration_time(mlu._replace(alpha=alpha), 0.0, 8.0, ctx, chunk)

    grads = jax.grad(f, argnums=(0, 1, 2))(8000.0, 16.0, 0.5)
    assert all(np.isfinite(g) for g in grads)
    assert grads[0] > 0 and grads[1] < 0 and grads[2] < 0


def test_roofline_params_validation():
    dep = hw.make_deployment("h100-80gb", "llama-3-8b")
    with pytest.raises(ValueError, match="mfu"):
        hw.roofline_params(dep, mfu=0.0)
    with pytest.raises(ValueError, match="bw_eff"):
        hw.roofline_params(dep, bw_eff=1.2)
    with pytest.raises(ValueError, match="step_overhead_s"):
        hw.roofline_params(dep, step_overhead_s=-1.0)
