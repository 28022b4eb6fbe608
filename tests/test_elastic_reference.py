"""Exact mode of the elastic family equals the independent NumPy reference
(tests/reference_elastic.py) on real-trace slices: the same admission and finish
iteration of every request, the same first-token and finish times, preemptions,
offloaded/fetched tokens and Algorithm 2 events."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import get_system, make_inputs, make_options, metrics, simulate_until_done
from models.elastic.family import POLICIES
from models.elastic.step import memory
from tests.reference_elastic import simulate_reference
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
     {"theta": 0.02}, {}, "tpot_events"),
]


def _run(system, wl, cfg, params, family):
    opts = make_options(system, block=4, record=True, **family)
    inputs = make_inputs(wl, cfg, opts, deployment=DEP)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    st = simulate_until_done(inputs, HW, p, opts, chunk_blocks=32)
    mem = memory(inputs.extra, cfg, p, POLICIES[system])

    ref = simulate_reference(
        np.asarray(wl.arrival_s), np.asarray(wl.prompt_tokens),
        np.asarray(wl.output_tokens), np.asarray(wl.valid), system=system,
        params={k: float(np.asarray(v)) for k, v in params.items()},
        n_slots=cfg.n_slots, admit_window=cfg.admit_window, max_batch=int(cfg.max_batch),
        max_prefill=float(cfg.max_prefill), pool_tokens=float(mem.pool),
        chunk_tokens=int(inputs.extra.chunk),
        act_coef=tuple(float(x) for x in np.asarray(inputs.extra.coef)),
        watermark_tokens=float(cfg.watermark_tokens), ttft_slo_s=float(cfg.ttft_slo_s),
        tpot_slo_s=float(cfg.tpot_slo_s), iteration_time=step_time,
        kv_bytes_per_token=KVB, host_link_bw=float(HW.host_link_bw))
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
