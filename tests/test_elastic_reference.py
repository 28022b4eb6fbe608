"""Exact mode of the elastic family equals the independent NumPy reference
(tests/reference_elastic.py) on real-trace slices: the same admission and finish
iteration of every request, the same first-token and finish times, preemptions,
offloaded/fetched tokens and Algorithm 2 events. The reference derives the pool, the
chunk and the activation coefficients itself from the model's shapes (its
``memory_model``); they must equal the family's bit for bit, and both are checked
against hand-computed values on a small model."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import get_system, make_inputs, make_options, metrics, simulate_until_done
from models.elastic.family import POLICIES
from models.elastic.step import memory
from tests.reference_elastic import memory_model, simulate_reference
from tests.sim_fixtures import DEP, HW, KVB, config, step_time, trace_workload

# system, trace, start, n, capacity (tokens), server, params, family options, what the
# case must exercise (checked, so that a case cannot silently stop covering it)
CASES = [
    ("vllm", "azure-llm-2023-conv.csv", 0, 160, 12000, {}, {}, {}, "preemptions"),
    ("vllm-cp", "mooncake-conversation.jsonl", 100, 60, 20000, {}, {"chunk": 512.0}, {},
     "preemptions"),
    ("ellm", "azure-llm-2023-conv.csv", 0, 160, 12000,
     {"ttft_slo_s": 0.1, "tpot_slo_s": 10.0},
     {"cpu_buffer_gib": 2.0}, {"chunk_mib": 0.25}, "offloads"),
    ("ellm", "mooncake-conversation.jsonl", 100, 60, 60000, {"tpot_slo_s": 0.05},
     {"theta": 0.02, "k": 1.0}, {}, "tpot_events"),
    # the buffer unit read as one chunk (the previous reading), TTFT events from requests
    # still waiting past their SLO
    ("ellm", "azure-llm-2023-conv.csv", 0, 160, 12000,
     {"ttft_slo_s": 0.1, "tpot_slo_s": 10.0},
     {"cpu_buffer_gib": 2.0}, {"chunk_mib": 0.25, "buffer_unit_mib": 0.25},
     "ttft_events"),
]


def _run(system, wl, cfg, params, family):
    opts = make_options(system, block=4, record=True, **family)
    inputs = make_inputs(wl, cfg, opts, deployment=DEP)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    st = simulate_until_done(inputs, HW, p, opts, chunk_blocks=32)
    mem = memory(inputs.extra, cfg, p, POLICIES[system])
    # the reference's own memory constants, from the model's shapes (DEP has no vLLM
    # profile: the family takes vLLM V0's profiling terms)
    assert getattr(DEP, "profile", None) is None
    rm = memory_model(DEP.model, tp=DEP.tp, version="v0",
                      capacity_tokens=float(cfg.capacity_tokens),
                      max_prefill=float(cfg.max_prefill), max_batch=int(cfg.max_batch),
                      chunk_mib=family.get("chunk_mib", 2.0))
    # ... which are the JAX family's, bit for bit
    assert rm["kv_bytes"] == KVB == float(cfg.kv_bytes_per_token)
    assert rm["chunk"] == float(inputs.extra.chunk)
    np.testing.assert_array_equal(np.asarray(inputs.extra.coef), np.array(rm["coef"]))
    assert rm["pool"] == np.float32(mem.pool)

    ref = simulate_reference(
        np.asarray(wl.arrival_s), np.asarray(wl.prompt_tokens),
        np.asarray(wl.output_tokens), np.asarray(wl.valid), system=system,
        params={k: float(np.asarray(v)) for k, v in params.items()},
        n_slots=cfg.n_slots, admit_window=cfg.admit_window, max_batch=int(cfg.max_batch),
        max_prefill=float(cfg.max_prefill), pool_tokens=float(rm["pool"]),
        chunk_tokens=rm["chunk"], act_coef=tuple(float(x) for x in rm["coef"]),
        watermark_tokens=float(cfg.watermark_tokens), ttft_slo_s=float(cfg.ttft_slo_s),
        tpot_slo_s=float(cfg.tpot_slo_s), iteration_time=step_time,
        kv_bytes_per_token=rm["kv_bytes"], host_link_bw=float(DEP.device.host_link_bw),
        buffer_unit_mib=family.get("buffer_unit_mib", 1024.0))
    return st, {k: float(v) for k, v in metrics(st, inputs, opts).items()}, ref


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1][:7]}" for c in CASES])
def test_exact_mode_equals_numpy_reference(case):
    system, trace, start, n, cap, server, over, family, exercised = case
    wl = trace_workload(trace, start, n, max_len=1024, max_prompt=3000)
    cfg = config(cap, n_slots=32, admit_window=8, max_len=1024, max_prefill=4096.0,
                 watermark=float(np.floor(0.01 * cap)))
    cfg = cfg.replace(**{k: jnp.float32(v) for k, v in server.items()})
    params = get_system(system).default_params(1024, HW)
    params.update({k: np.float32(v) for k, v in over.items()})
    st, m, ref = _run(system, wl, cfg, params, family)
    np.testing.assert_array_equal(np.asarray(st.rec.admit_iter)[:n], ref["admit_iter"][:n])
    np.testing.assert_array_equal(np.asarray(st.rec.finish_iter)[:n],
                                  ref["finish_iter"][:n])
    np.testing.assert_allclose(np.asarray(st.rec.first_s)[:n], ref["first_token_s"][:n],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(st.rec.finish_s)[:n], ref["finish_s"][:n],
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(st.rec.offloaded)[:n] > 0,
                                  ref["offloaded"][:n])
    assert m["completed"] == ref["completed"] and m["dropped"] == ref["dropped"]
    assert m["preemptions"] == ref["preemptions"] and m["stalls"] == ref["stalls"]
    gib = KVB / 2 ** 30
    assert m["offload_gib"] == pytest.approx(ref["offload_tokens"] * gib, rel=1e-6)
    assert m["fetch_gib"] == pytest.approx(ref["fetch_tokens"] * gib, rel=1e-6)
    assert m["peak_host_gib"] == pytest.approx(ref["peak_host_tokens"] * gib, rel=1e-6)
    for key, rkey in (("ttft_events", "ttft_events"), ("tpot_events", "tpot_events"),
                      ("inflation_events", "inflation_events"),
                      ("deflation_events", "deflation_events"),
                      ("max_batch_size", "max_decode_batch")):
        assert m[key] == ref[rkey], key
    assert float(st.acc.peak_gpu) == ref["peak_gpu_tokens"]
    assert m["completed"] + m["dropped"] == n
    assert ref[{"offloads": "offload_tokens"}.get(exercised, exercised)] > 0, exercised


def test_pool_and_activation_coefficients_by_hand():
    """The memory constants of a small made-up model, worked out by hand from vLLM's
    profiling run (docs/elastic-semantics.md, "Units and memory model"): both the
    reference's own arithmetic (tests/reference_elastic.py ``memory_model``) and the
    code under test (``hardware.memory_profile.activation_coefficients``, the family's
    inputs and ``models.elastic.step.pool_tokens``/``memory``) must give them."""
    from types import SimpleNamespace

    from hardware.llm import LLMSpec
    from hardware.memory_profile import activation_coefficients
    from models.family import family_of
    from models.elastic.step import pool_tokens

    # hidden 8, MLP 24 (gated), vocab 100 (padded to 128), 2 layers, 2 KV heads of 4,
    # 2-byte dtype, tp = 2 (one KV head and 12 MLP columns per device)
    spec = LLMSpec(name="tiny-hand", n_layers=2, hidden_size=8, n_heads=4, n_kv_heads=2,
                   head_dim=4, intermediate_size=24, vocab_size=100, n_params=10_000,
                   dtype_bytes=2, max_position=4096)
    kvb = 2 * 2 * 1 * 4 * 2  # K and V x 2 layers x 1 head x 4 x 2 B = 32 B per token
    f_b = (3 * 8 + 2 * 12 + 12) * 2  # 3 hidden + gate_up + SiluAndMul = 120 B per token
    h_b = 8 * 2  # the [T, hidden] output held through the sampler: 16 B per token
    r_v0 = 128 * 2 + 9.29 * 100 * 4  # bf16 logits (padded) + 9.29 fp32 copies = 3972 B
    r_v1 = 128 * 2 + 3 * 100 * 4  # V1: 3 fp32 copies = 1456 B
    z_v1 = 0.117 * 2 ** 30  # V1 sampler workspace
    assert tuple(activation_coefficients(spec, tp=2, version="v0")) == pytest.approx(
        (f_b, h_b, r_v0, 0.0), rel=1e-12)
    assert tuple(activation_coefficients(spec, tp=2, version="v1")) == pytest.approx(
        (f_b, h_b, r_v1, z_v1), rel=1e-12)
    # the other MLPs: fc1/fc2 (OPT): 3 hidden + fc1's 2 I/tp = (24 + 24) * 2 = 96 B;
    # MoE, 2 of 4 experts per token: 3 hidden + 2 (3 I/tp + hidden) = (24 + 88) * 2
    from dataclasses import replace

    from tests.reference_elastic import activation_bytes
    for other, f_other in ((replace(spec, gated_mlp=False), 96.0),
                           (replace(spec, n_experts=4, n_experts_per_token=2), 224.0)):
        assert activation_coefficients(other, tp=2).forward == f_other
        assert activation_bytes(other, tp=2)[0] == f_other
    # in KV tokens: f = 3.75, h = 0.5, r = 124.125 (V0), 45.5 (V1), z = 0 / 3925868.5
    want_v0 = (3.75, 0.5, 124.125, 0.0)
    assert (f_b / kvb, h_b / kvb, r_v0 / kvb, 0.0) == pytest.approx(want_v0, rel=1e-12)

    # chunk: 2**-12 MiB = 256 B = 8 tokens. Pool = capacity + act(max_prefill, max_batch)
    # at (64 tokens, 4 rows): max(3.75*64 = 240, 0.5*64 + 124.125*4 = 528.5) -> 536;
    # at (512, 1): max(1920, 256 + 124.125 = 380.125) = 1920 (the forward term wins)
    cases = [(64.0, 4, 1000.0 + 536.0), (512.0, 1, 1000.0 + 1920.0)]
    for version, want in (("v0", want_v0),
                          ("v1", (3.75, 0.5, 45.5, np.float32(z_v1 / 32)))):
        rm = memory_model(spec, tp=2, version=version, capacity_tokens=1000.0,
                          max_prefill=64.0, max_batch=4, chunk_mib=2.0 ** -12)
        assert rm["kv_bytes"] == kvb and rm["chunk"] == 8
        assert np.array(rm["coef"]).tolist() == pytest.approx(want, rel=1e-7), version
    fam = family_of("ellm")
    opts = make_options("ellm", chunk_mib=2.0 ** -12)
    for max_prefill, rows, pool in cases:
        rm = memory_model(spec, tp=2, version="v0", capacity_tokens=1000.0,
                          max_prefill=max_prefill, max_batch=rows, chunk_mib=2.0 ** -12)
        assert rm["pool"] == pool
        cfg = config(1000.0, n_slots=rows, max_prefill=max_prefill).replace(
            kv_bytes_per_token=jnp.float32(kvb))
        extra = fam.extra(None, cfg, opts, deployment=SimpleNamespace(
            model=spec, tp=2, profile=None))
        assert float(extra.chunk) == 8.0
        np.testing.assert_array_equal(np.asarray(extra.coef), np.float32(want_v0))
        assert float(pool_tokens(extra, cfg)) == pool
        # vLLM's static split: K = P - act(max_prefill, max_batch) = the capacity
        mem = memory(extra, cfg, {}, POLICIES["vllm"])
        assert float(mem.space) == 1000.0
