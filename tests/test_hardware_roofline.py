"""The roofline step model: hand calculations, limits, and jit/vmap/grad behaviour."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hardware as hw
from hardware import _device_presets as presets
from hardware import roofline as roofline_mod

OVERHEAD = roofline_mod.DEFAULT_STEP_OVERHEAD_S


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
    assert (mlu.stream_bw, mlu.alpha, mlu.peak_flops) == (307.2e9, 0.66, 96e12)
    assert (mlu.mfu, mlu.bw_eff, mlu.step_overhead_s, mlu.pp) == (0.5, 0.8, 4e-3, 1.0)
    assert (mlu.tp, mlu.allreduces_per_stage) == (4.0, 2 * 28)
    assert mlu.activation_bytes_per_token == 3584 * 2
    assert (mlu.tp_link_bw, mlu.tp_allreduce_latency_s) == (32e9, 25e-6)
    assert all(isinstance(leaf, float) for leaf in mlu)


def _mlu_comm(tokens):
    """Hand ring all-reduce time on the 4-card MLU370 node (56 per iteration)."""
    return 56 * (2 * 3 / 4 * tokens * 3584 * 2 / 32e9 + 25e-6)


def test_decode_bound_by_hand(mlu):
    seqs, ctx, chunk = 32, 32 * 2048, 2048  # contiguous 2048-token reservations
    bw = 307.2e9 * 0.8
    b = 64 / 0.66
    kv_bw = bw * (0.66 + 0.34 * (chunk * 512) / (chunk * 512 + b))
    memory = 7_615_616_512 * 2 / 4 / bw + ctx * 14336 / kv_bw
    compute = (seqs * 2 * 7_615_616_512 / 4 + ctx * 4 * 28 * 28 * 128 / 4) / 48e12
    assert memory > 5 * compute
    got = hw.iteration_time(mlu, 0, seqs, ctx, chunk)
    assert float(got) == pytest.approx(memory + _mlu_comm(seqs) + 4e-3, rel=1e-6)


def test_compute_bound_by_hand(h100):
    assert h100.tp == 1.0  # llama-3-8b fits one H100: no all-reduce
    n = 8192  # one fresh prompt
    flops = n * 2 * 8_030_261_248 + n * (n + 1) / 2 * 4 * 32 * 32 * 128
    compute = flops / 794.5e12  # MAMF-measured BF16 GEMM rate of an H100 SXM
    memory = 2 * 8_030_261_248 / 2.97e12  # BabelStream-Triad-measured bandwidth
    assert compute > 10 * memory
    got = hw.iteration_time(h100, n, 0, 0, 16)
    assert float(got) == pytest.approx(compute + OVERHEAD, rel=1e-6)
    explicit = hw.iteration_time(h100, n, 0, 0, 16, prefill_ctx_tokens=n * (n + 1) / 2)
    assert float(explicit) == pytest.approx(float(got), rel=1e-6)


def test_empty_iteration_costs_only_overhead(mlu):
    assert float(hw.iteration_time(mlu, 0, 0, 0, 16)) == pytest.approx(OVERHEAD)
    assert float(hw.tp_allreduce_time(mlu, 0)) == 0.0


def test_copy_reads_and_writes(mlu):
    base = float(hw.iteration_time(mlu, 0, 1, 100, 100))
    with_copy = float(hw.iteration_time(mlu, 0, 1, 100, 100, copy_bytes=1e9))
    assert with_copy - base == pytest.approx(2e9 / (307.2e9 * 0.8), rel=1e-5)


def test_lpddr_kv_block_bandwidth_matches_cited_measurement():
    """The LPDDR5 curve: Steiner et al.'s measured random/sequential ratio (0.66)
    for one-burst (64 B) accesses, and one row activation per random chunk beyond
    that; no LPDDR5 measurement at KV-block size exists, so the block value is
    that extrapolation (see the preset's sources)."""
    dep = hw.make_deployment("mlu370-x4", "deepseek-r1-distill-qwen-7b")
    d = dep.device
    block = 16 * dep.kv_bytes_per_token_layer_device  # one 16-token block, 1 layer
    assert block == 8192.0  # 16 tokens x 1 KV head x 128 x 2 (K, V) x 2 bytes
    ratio = presets.LPDDR5_RANDOM_RATIO
    assert d.alpha == ratio == 0.66
    assert "2209.14756" in d.source("alpha") and "66%" in d.source("alpha")
    assert hw.effective_bandwidth(1.0, d.alpha, d.burst_bytes, 0.0) == ratio
    overhead = presets.LPDDR5_ACCESS_BYTES * (1 - ratio) / ratio  # bytes per chunk
    at_block = hw.effective_bandwidth(1.0, d.alpha, d.burst_bytes, block)
    assert at_block == pytest.approx(block / (block + overhead), rel=1e-4)
    assert at_block == pytest.approx(0.996, abs=5e-4)
    one_token = hw.effective_bandwidth(1.0, d.alpha, d.burst_bytes, block / 16)
    assert one_token == pytest.approx(512 / (512 + overhead), rel=1e-2)
    assert 1 - one_token > 10 * (1 - at_block)  # per-token gathers pay, blocks not


def test_random_access_penalty_orders_memories():
    """One rule for every memory (one activation per random chunk): at any equal
    chunk size LPDDR5 keeps the least of its streaming bandwidth, HBM the most."""
    chunks = np.array([64.0, 256.0, 512.0, 4096.0, 8192.0, 65536.0])

    def frac(name):
        d = hw.get_device(name)
        return hw.effective_bandwidth(1.0, d.alpha, d.burst_bytes, chunks)

    lpddr, gddr, hbm = frac("mlu370-x4"), frac("l40s-48gb"), frac("a100-80gb")
    assert np.all(lpddr < gddr) and np.all(gddr < hbm) and np.all(hbm < 1.0)


def test_paging_penalty_lpddr_vs_hbm(mlu):
    a100 = hw.roofline_params(
        hw.make_deployment("a100-80gb", "deepseek-r1-distill-qwen-7b")
    )
    args = (0, 64, 64 * 4096)

    def slowdown(p, chunk):
        paged = hw.iteration_time(p, *args, kv_chunk_tokens=chunk)
        contiguous = hw.iteration_time(p, *args, kv_chunk_tokens=4096)
        return float(paged / contiguous)

    assert 1.01 < slowdown(mlu, 1) < 1.05  # per-token scatter costs LPDDR a little
    assert 1.0 < slowdown(mlu, 16) < 1.003  # 16-token blocks: under 0.3%
    assert slowdown(mlu, 1) > slowdown(a100, 1) > 1.0


def test_pipeline_stages_add_up():
    dep = hw.make_deployment("a100-80gb", "llama-2-70b", tp=2, pp=2)
    p = hw.roofline_params(dep)
    assert p.allreduces_per_stage == 2 * 80 / 2
    stage = float(
        hw.iteration_time(p._replace(pp=1.0, step_overhead_s=0.0), 0, 8, 8000, 16)
    )
    total = float(hw.iteration_time(p, 0, 8, 8000, 16))
    assert total == pytest.approx(2 * stage + OVERHEAD, rel=1e-6)


def _dep(tp, model="llama-2-70b", device="a100-80gb"):
    return hw.make_deployment(device, model, tp=tp)


def test_tp_comm_is_zero_at_tp1(h100):
    assert float(hw.tp_allreduce_time(h100, 4096)) == 0.0
    no_comm = h100._replace(allreduces_per_stage=0.0)
    for args in ((512, 0, 0, 16), (0, 32, 32 * 900, 16), (100, 8, 8000, 16)):
        got = float(hw.iteration_time(h100, *args))
        assert got == pytest.approx(float(hw.iteration_time(no_comm, *args)), rel=1e-7)


def test_tp_comm_ring_formula_by_hand():
    p = hw.roofline_params(_dep(2))  # Llama-2-70B at TP2 on A100 (Vidur's setup)
    assert (p.tp, p.allreduces_per_stage) == (2.0, 160.0)
    assert (p.tp_link_bw, p.tp_allreduce_latency_s) == (300e9, 10.14e-6)
    tokens = 250
    one = 2 * (2 - 1) / 2 * tokens * 8192 * 2 / 300e9 + 10.14e-6
    want = 160 * one  # 2 all-reduces x 80 layers
    assert float(hw.tp_allreduce_time(p, tokens)) == pytest.approx(want, rel=1e-6)
    alone = p._replace(tp=1.0)  # same roofline, no communication
    with_comm = float(hw.iteration_time(p, tokens, 0, 0, 16))
    added = with_comm - float(hw.iteration_time(alone, tokens, 0, 0, 16))
    assert added == pytest.approx(want, rel=1e-4)  # serial: no overlap


def test_tp_comm_grows_with_tp_and_tokens():
    ps = [hw.roofline_params(_dep(tp)) for tp in (2, 4, 8)]
    for tokens in (1, 64, 4096):
        times = [float(hw.tp_allreduce_time(p, tokens)) for p in ps]
        assert times[0] < times[1] < times[2]
    p = ps[1]
    by_tokens = [float(hw.tp_allreduce_time(p, n)) for n in (1, 16, 256, 4096)]
    assert all(a < b for a, b in zip(by_tokens, by_tokens[1:]))
    # bandwidth-bound for big batches, latency-bound for one token
    assert by_tokens[-1] > 10 * by_tokens[0]
    assert by_tokens[0] == pytest.approx(160 * p.tp_allreduce_latency_s, rel=0.05)


def test_tp_comm_uses_each_devices_fabric():
    nvlink = hw.roofline_params(_dep(4, "llama-3-8b", "h100-80gb"))
    pcie = hw.roofline_params(_dep(4, "llama-3-8b", "l40s-48gb"))
    assert nvlink.tp_link_bw == 450e9 and pcie.tp_link_bw == 32e9
    assert float(hw.tp_allreduce_time(pcie, 2048)) > 5 * float(
        hw.tp_allreduce_time(nvlink, 2048)
    )


def test_efficiencies_default_to_the_device_and_can_be_overridden():
    for name in ("a100-80gb", "h100-80gb", "mlu370-x4"):
        dep = hw.make_deployment(name, "deepseek-r1-distill-qwen-7b")
        p = hw.roofline_params(dep)
        assert (p.mfu, p.bw_eff) == (dep.device.mfu, dep.device.bw_eff)
        q = hw.roofline_params(dep, mfu=0.3, bw_eff=0.6, step_overhead_s=0.0)
        assert (q.mfu, q.bw_eff, q.step_overhead_s) == (0.3, 0.6, 0.0)
    a100 = hw.get_device("a100-80gb")
    assert a100.mfu == pytest.approx(271.2 / 312) and "MAMF" in a100.source("mfu")
    assert a100.bw_eff == pytest.approx(1.70 / 2.039) and "Triad" in a100.source(
        "bw_eff"
    )
    h100 = hw.get_device("h100-80gb")
    assert h100.mfu == pytest.approx(0.803, abs=1e-3)
    assert h100.bw_eff == pytest.approx(0.887, abs=1e-3)


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
    def f(ctx, chunk, alpha, link):
        p = mlu._replace(alpha=alpha, tp_link_bw=link)
        return hw.iteration_time(p, 0.0, 8.0, ctx, chunk)

    grads = jax.grad(f, argnums=(0, 1, 2, 3))(8000.0, 16.0, 0.5, 32e9)
    assert all(np.isfinite(g) for g in grads)
    assert grads[0] > 0 and grads[1] < 0 and grads[2] < 0 and grads[3] < 0


def test_roofline_params_validation():
    dep = hw.make_deployment("h100-80gb", "llama-3-8b")
    with pytest.raises(ValueError, match="mfu"):
        hw.roofline_params(dep, mfu=0.0)
    with pytest.raises(ValueError, match="bw_eff"):
        hw.roofline_params(dep, bw_eff=1.2)
    with pytest.raises(ValueError, match="step_overhead_s"):
        hw.roofline_params(dep, step_overhead_s=-1.0)


def test_reference_step_time_by_hand():
    """The step time every NumPy reference takes from the code under test
    (``tests.sim_fixtures.step_time``: ``hardware.iteration_time`` jitted, float32, on
    MLU370-X4 / DeepSeek-R1-Distill-Qwen-7B at tp = 1), worked out by hand from the
    model's dimensions, the preset's numbers and the formula of hardware/roofline.py:
    ``max(FLOPs / (peak * mfu), weights / bw + KV / kv_bw) + step_overhead_s`` with
    ``bw = stream_bw * bw_eff`` and ``kv_bw = bw * (alpha + (1 - alpha) * chunk_bytes /
    (chunk_bytes + burst))`` (tp = 1: no all-reduce)."""
    from tests.sim_fixtures import DEP, step_time

    # the preset table's MLU370-X4 (hardware/_device_presets.py)
    dev = hw.get_device("mlu370-x4")
    assert (dev.peak_flops, dev.mfu, dev.stream_bw, dev.bw_eff) == (96e12, 0.5, 307.2e9,
                                                                    0.8)
    assert dev.alpha == 0.66 and dev.burst_bytes == pytest.approx(64 / 0.66, rel=1e-15)
    assert DEP.tp == 1 and DEP.pp == 1
    # DeepSeek-R1-Distill-Qwen-7B: 7,615,616,512 params, 28 layers, 28 query heads and
    # 4 KV heads of 128, 2-byte dtype
    weights = 7_615_616_512 * 2  # bytes read once per iteration
    dense = 2 * 7_615_616_512  # FLOPs per new token
    attn = 4 * 28 * 28 * 128  # FLOPs per (new token, attended token): QK^T and PV
    kv_tok = 2 * 28 * 4 * 128 * 2  # K+V bytes of one token, all layers
    kv_layer = kv_tok // 28
    bw = 307.2e9 * 0.8
    peak = 96e12 * 0.5

    def kv_bw(chunk):
        b = chunk * kv_layer
        return bw * (0.66 + 0.34 * b / (b + 64 / 0.66))

    # (a) a mixed iteration, compute-bound: a 300-token prefill chunk after 200
    # computed tokens (pairs 300 * (200 + 301/2) = 105,150) and 5 decodes attending
    # 4,000 cached tokens, 16-token blocks
    flops = (300 + 5) * dense + (4000 + 105_150) * attn
    compute = flops / peak
    memory = weights / bw + 4000 * kv_tok / kv_bw(16)
    assert compute > 1.5 * memory
    got = float(step_time(300, 5, 4000, 16, 0.0, 105_150.0))
    assert got == pytest.approx(compute + 4e-3, rel=1e-6)
    assert got == pytest.approx(0.1016946, rel=1e-6)  # the numbers above, evaluated
    # (b) a decode iteration, memory-bound: 32 sequences attending 32,000 tokens
    flops = 32 * dense + 32_000 * attn
    memory = weights / bw + 32_000 * kv_tok / kv_bw(16)
    assert memory > 5 * flops / peak
    got = float(step_time(0, 32, 32_000, 16, 0.0, 0.0))
    assert got == pytest.approx(memory + 4e-3, rel=1e-6)
