"""The ``vllm-v1`` system: vLLM V1's engine arguments as traced policy parameters.

Exact mode: the KV capacity the traced arguments give equals vLLM's memory profile
(``hardware.memory_profile.vllm_memory_profile``, float64 on the host) on a grid of
devices, models and settings, 0 where vLLM refuses; a run equals ``paged`` on a server
config built from that profile (the same simulator, configured on the host instead);
a refused setting serves nothing and its reason is named. Relaxed mode: the capacity's
gradient in the memory utilisation against finite differences.
Synthetic workloads: no trace needed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hardware
from hardware.memory_profile import vllm_memory_profile
from models import (get_system, make_inputs, make_options, make_workload, metrics,
                    simulate_until_done, validate_params)
from models.bucketed.engine import WATERMARK, engine_cfg, engine_inputs
from tests.sim_fixtures import HW, config, engine_deployment, engine_util_for

N, MAX_LEN = 96, 256
SEQS, TOKENS = 12, 800


def _workload(seed=0, n=N):
    rng = np.random.default_rng(seed)
    out = rng.integers(1, MAX_LEN + 1, n)
    return make_workload(np.cumsum(rng.exponential(0.02, n)), rng.integers(20, 400, n),
                         out, np.maximum(out * rng.uniform(0.4, 2.5, n), 1.0),
                         rng.uniform(0, 1, n), pad_to=n)


def _cfg(capacity=1000.0, *, seqs=16, tokens=800.0):
    return config(capacity, n_slots=16, admit_window=4, max_len=MAX_LEN,
                  max_batch=seqs, max_prefill=tokens, chunked=True)


def _params(seqs, tokens, util, block=16):
    return {"max_num_seqs": jnp.float32(seqs), "max_num_batched_tokens": jnp.float32(tokens),
            "gpu_memory_utilization": jnp.float32(util), "block_size": jnp.float32(block)}


CASES = [("h100-80gb", "qwen3-8b", 1, 40960), ("a100-40gb", "qwen3-8b", 1, 40960),
         ("h100-80gb", "llama-3.1-70b", 4, 32768), ("l40s-48gb", "qwen3-30b-a3b", 2, 8192),
         ("rtx-3090-24gb", "llama-3.2-3b", 1, 4096)]


@pytest.mark.parametrize("device,model,tp,max_model_len", CASES)
def test_capacity_equals_vllms_memory_profile(device, model, tp, max_model_len):
    dep = hardware.make_deployment(device, model, tp=tp, engine="vllm-v1",
                                   engine_args={"max_model_len": max_model_len})
    ex = engine_inputs(dep)
    grid = [(s, t, u, b) for s in (8, 64, 256, 1024) for t in (64, 512, 2048, 8192, 16384)
            for u in (0.5, 0.72, 0.9, 0.98) for b in (16, 32)]
    want, refused = [], 0
    for s, t, u, b in grid:
        try:  # refusals at configuration raise; memory refusals come back marked
            p = vllm_memory_profile(device, model, tp=tp, gpu_memory_utilization=u,
                                    max_model_len=max_model_len, max_num_batched_tokens=t,
                                    max_num_seqs=s, block_size=b, version="v1",
                                    strict=False, enable_chunked_prefill=True)
            # CUDA graphs are captured beyond gpu_memory_utilization: out of memory
            # when what it leaves of the device is less than them
            ok = p.refusal is None and (1 - u) * p.total_bytes >= p.cuda_graph_bytes
        except hardware.VllmRefusal:
            ok = False
        want.append(p.kv_cache_tokens if ok else 0)
        refused += not ok
    cols = np.asarray(grid, np.float32).T
    cap = jax.jit(jax.vmap(lambda s, t, u, b: engine_cfg(_cfg(), _params(s, t, u, b),
                                                         ex).capacity_tokens))(*cols)
    np.testing.assert_array_equal(np.asarray(cap), np.asarray(want, np.float32))
    assert 0 < refused < len(grid) or device == "h100-80gb", refused  # both kinds seen


def _engine_setup(util, seqs=SEQS, tokens=TOKENS, record=True):
    dep = engine_deployment(1024)
    opts = make_options("vllm-v1", block=4, record=record)
    inputs = make_inputs(_workload(), _cfg(), opts, deployment=dep)
    return dep, inputs, _params(seqs, tokens, util), opts


def test_run_equals_paged_on_the_server_the_profile_gives():
    """Same simulator, configured two ways: the traced engine arguments (vllm-v1) and a
    paged server config built on the host from vLLM's profile at those arguments."""
    dep0 = engine_deployment(1024)
    util = engine_util_for(dep0, 2500.0, seqs=SEQS, batched=TOKENS)
    dep, inputs, params, opts = _engine_setup(util)
    prof = vllm_memory_profile(dep.device, dep.model, tp=1, gpu_memory_utilization=util,
                               max_model_len=1024, max_num_batched_tokens=TOKENS,
                               max_num_seqs=SEQS, version="v1")
    cap = float(prof.kv_cache_tokens)
    assert 2000 < cap < 3000
    st = simulate_until_done(inputs, HW, params, opts, chunk_blocks=16)
    got = {k: float(v) for k, v in metrics(st, inputs, opts).items()}
    cfg = config(cap, n_slots=16, admit_window=4, max_len=MAX_LEN, max_batch=SEQS,
                 max_prefill=float(TOKENS), watermark=np.floor(WATERMARK * cap),
                 chunked=True)
    p_opts = make_options("paged", block=4, record=True)
    p_inputs = make_inputs(_workload(), cfg, p_opts)
    p_params = {"block_size": jnp.float32(16)}
    st2 = simulate_until_done(p_inputs, HW, p_params, p_opts, chunk_blocks=16)
    want = {k: float(v) for k, v in metrics(st2, p_inputs, p_opts).items()}
    assert got == want
    assert want["preemptions"] > 0 and want["completed"] == N  # memory binds, all served
    np.testing.assert_array_equal(np.asarray(st.rec.finish_s), np.asarray(st2.rec.finish_s))


@pytest.mark.parametrize("seqs,tokens,util,field", [
    (64, 32, 0.9, "max_num_batched_tokens"),   # fewer batched tokens than sequences
    (12, 800, 0.05, "gpu_memory_utilization"),  # no memory left for one block
    (12, 800, 0.995, "gpu_memory_utilization"),  # no room left for the CUDA graphs
])
def test_refused_setting_serves_nothing_and_names_the_reason(seqs, tokens, util, field):
    dep, inputs, params, opts = _engine_setup(util, seqs, tokens)
    spec = get_system("vllm-v1")
    reason = spec.refusal(dep, {k: float(v) for k, v in params.items()})
    assert reason is not None and reason[0] == field, reason
    st = simulate_until_done(inputs, HW, params, opts, chunk_blocks=16)
    m = metrics(st, inputs, opts)
    assert float(m["completed"]) == 0 and float(m["dropped"]) == N
    ok = {k: float(v) for k, v in
          _params(SEQS, TOKENS, engine_util_for(dep, 2500.0, seqs=SEQS, batched=TOKENS)
                  ).items()}
    assert spec.refusal(dep, ok) is None


def test_defaults_are_vllms_own_for_the_device():
    spec = get_system("vllm-v1")
    big = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v1")
    small = hardware.make_deployment("a100-40gb", "qwen3-8b", tp=1, engine="vllm-v1",
                                     engine_args={"max_model_len": 8192})
    d_big, d_small = (spec.default_params(4096, HW, d) for d in (big, small))
    assert (float(d_big["max_num_seqs"]), float(d_big["max_num_batched_tokens"])) \
        == (1024, 8192)
    assert (float(d_small["max_num_seqs"]), float(d_small["max_num_batched_tokens"])) \
        == (256, 2048)
    assert float(d_big["gpu_memory_utilization"]) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="deployment"):
        spec.default_params(4096, HW)
    # a policy file gives every parameter: no deployment needed to validate it
    validate_params(spec, {k: float(v) for k, v in d_big.items()}, 4096)
    with pytest.raises(ValueError, match="max_num_seqs"):
        validate_params(spec, {**d_big, "max_num_seqs": 5000.0}, 4096, HW, big)
    # vLLM's default threshold (0, off) is at or above every budget: it never binds
    assert float(d_big["long_prefill_token_threshold"]) == 16384
    assert float(d_big["max_num_partial_prefills"]) == 1
    with pytest.raises(ValueError, match="integer"):
        validate_params(spec, {**d_big, "max_num_batched_tokens": 100.5}, 4096, HW, big)


def test_an_engine_system_needs_a_v1_deployment():
    opts = make_options("vllm-v1", block=4)
    v0 = hardware.make_deployment("h100-80gb", "qwen3-8b", tp=1, engine="vllm-v0",
                                  engine_args={"max_model_len": 8192})
    with pytest.raises(ValueError, match="V1"):
        make_inputs(_workload(), _cfg(), opts, deployment=v0)
    with pytest.raises(ValueError, match="chunked"):
        make_inputs(_workload(), config(1000.0, n_slots=16, max_len=MAX_LEN), opts,
                    deployment=engine_deployment(1024))


def test_capacity_gradient_matches_finite_differences():
    """Relaxed mode: the capacity's slope in the memory utilisation is the profile's
    (device bytes per KV token: the floors pass the gradient straight through) and
    agrees with central differences of the exact capacity over ~200 tokens."""
    dep0 = engine_deployment(1024)
    util = engine_util_for(dep0, 2500.0, seqs=SEQS, batched=TOKENS)
    dep, inputs, params, opts = _engine_setup(util, record=False)

    def cap(u):
        return engine_cfg(inputs.cfg, {**params, "gpu_memory_utilization": u},
                          inputs.extra).capacity_tokens

    slope = float(jax.grad(cap)(jnp.float32(util)))
    per_token = dep.profile.total_bytes / dep.profile.kv_bytes_per_token
    assert slope == pytest.approx(per_token, rel=1e-4)
    du = 200.0 / per_token
    fd = (float(cap(jnp.float32(util + du))) - float(cap(jnp.float32(util - du)))) / (2 * du)
    assert fd == pytest.approx(slope, rel=0.1)


def test_export_prints_the_tuned_engine_arguments_and_refuses_what_vllm_refuses():
    """describe(): the ``vllm serve`` command carries the tuned arguments and the KV
    capacity vLLM's profile gives at them, equal to the traced capacity; a setting vLLM
    would refuse is never exported."""
    from tuner.export.deployment import describe
    from tuner.scenario import ScenarioSpec, build_scenario

    sc = build_scenario(ScenarioSpec(n_requests=100, hardware="a100-40gb", model="qwen3-8b",
                                     scheduler="chunked", max_model_len=8192))
    p = {"max_num_seqs": 96, "max_num_batched_tokens": 1024,
         "gpu_memory_utilization": 0.93, "block_size": 16}
    d = describe(sc, "vllm-v1", p)
    args = d["vllm"]["args"]
    assert (args["--max-num-seqs"], args["--max-num-batched-tokens"],
            args["--gpu-memory-utilization"]) == (96, 1024, 0.93)
    assert "--max-num-seqs 96" in d["vllm"]["command"]
    want = vllm_memory_profile("a100-40gb", "qwen3-8b", gpu_memory_utilization=0.93,
                               max_model_len=8192, max_num_batched_tokens=1024,
                               max_num_seqs=96, version="v1").kv_cache_tokens
    assert d["vllm"]["kv_capacity_tokens_at_these_args"] == want
    assert d["derived"]["engine"]["kv_capacity_tokens"] == want == d["server"][
        "kv_capacity_tokens"]
    defaults = {x["name"]: x["paper_default"] for x in d["parameters"]}
    assert (defaults["max_num_seqs"], defaults["max_num_batched_tokens"]) == (256, 2048)
    with pytest.raises(ValueError, match="refuse"):
        describe(sc, "vllm-v1", {**p, "max_num_batched_tokens": 64})
    # a threshold below the budget is printed; at or above it, vLLM's default stands
    assert "--long-prefill-token-threshold" not in d["vllm"]["args"]
    cut = describe(sc, "vllm-v1", {**p, "long_prefill_token_threshold": 256})
    assert cut["vllm"]["args"]["--long-prefill-token-threshold"] == 256
    assert "--long-prefill-token-threshold 256" in cut["vllm"]["command"]
    assert cut["derived"]["engine"]["long_prefill_token_threshold"] == 256


def test_long_prefill_threshold_is_paged_with_the_cap_and_off_at_the_budget():
    """--long-prefill-token-threshold: a run with it equals paged on the host-built
    server with the same per-request cap (the cap itself is checked against the NumPy
    reference in test_bucketed_reference); at the budget it never binds (vLLM's 0);
    below it, prefills are cut into more, smaller chunks, so the run differs."""
    dep0 = engine_deployment(1024)
    util = engine_util_for(dep0, 2500.0, seqs=SEQS, batched=TOKENS)
    dep, inputs, params, opts = _engine_setup(util)

    def run(extra):
        st = simulate_until_done(inputs, HW, {**params, **extra}, opts, chunk_blocks=16)
        return {k: float(v) for k, v in metrics(st, inputs, opts).items()}

    off = run({})
    assert run({"long_prefill_token_threshold": jnp.float32(TOKENS)}) == off
    capped = run({"long_prefill_token_threshold": jnp.float32(48)})
    assert capped != off and capped["completed"] == N
    cap = float(engine_cfg(inputs.cfg, params, inputs.extra).capacity_tokens)
    cfg = config(cap, n_slots=16, admit_window=4, max_len=MAX_LEN, max_batch=SEQS,
                 max_prefill=float(TOKENS), watermark=np.floor(WATERMARK * cap),
                 chunked=True, prefill_cap=48)
    p_opts = make_options("paged", block=4, record=True)
    p_inputs = make_inputs(_workload(), cfg, p_opts)
    st2 = simulate_until_done(p_inputs, HW, {"block_size": jnp.float32(16)}, p_opts,
                              chunk_blocks=16)
    assert capped == {k: float(v) for k, v in metrics(st2, p_inputs, p_opts).items()}


def test_partial_prefills_other_than_one_are_refused_as_vllm_v1_does():
    dep, inputs, params, opts = _engine_setup(
        engine_util_for(engine_deployment(1024), 2500.0, seqs=SEQS, batched=TOKENS))
    spec = get_system("vllm-v1")
    two = {**{k: float(v) for k, v in params.items()}, "max_num_partial_prefills": 2.0}
    field, msg = spec.refusal(dep, two)
    assert field == "max_num_partial_prefills" and "V1" in msg
    st = simulate_until_done(inputs, HW, {**params, "max_num_partial_prefills":
                                          jnp.float32(2)}, opts, chunk_blocks=16)
    assert float(metrics(st, inputs, opts)["completed"]) == 0


def test_the_default_threshold_never_binds_at_any_budget():
    spec = get_system("vllm-v1")
    a100 = hardware.make_deployment("a100-40gb", "qwen3-8b", tp=1, engine="vllm-v1",
                                    engine_args={"max_model_len": 8192})
    d = spec.default_params(4096, HW, a100)
    top = next(p.upper for p in spec.params if p.name == "max_num_batched_tokens")
    assert float(d["long_prefill_token_threshold"]) >= top
    thr = next(p for p in spec.params if p.name == "long_prefill_token_threshold")
    assert thr.lower < float(d["long_prefill_token_threshold"]) < thr.upper  # searchable
