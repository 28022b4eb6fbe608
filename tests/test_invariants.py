"""Invariants every registered system must keep, parametrised over ``list_systems()`` so a
new family is checked the moment it registers (the fixture family included): memory
never over capacity or negative in exact mode, every request finished or dropped,
determinism, and relaxed mode converging to exact as T -> 0. Synthetic workloads: no
trace needed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tests.fixture_family  # noqa: F401  (registers the fixture family)
from models import (family_of, get_system, list_systems, make_inputs, make_options,
                    make_workload, metrics, simulate, simulate_until_done)
from tests.sim_fixtures import DEP, HW, config, engine_deployment, engine_util_for

SYSTEMS = list_systems()
N, MAX_LEN, CAP = 64, 256, 3000.0
# an engine system (vllm-v1): max_model_len 1024 and the memory utilisation that leaves
# about CAP KV tokens at 12 sequences / 800 batched tokens
ENGINE_DEP = engine_deployment(1024)
ENGINE_UTIL = engine_util_for(ENGINE_DEP, CAP, seqs=12, batched=800)


def _workload(seed):
    rng = np.random.default_rng(seed)
    out = rng.integers(1, MAX_LEN + 1, N)
    return make_workload(np.cumsum(rng.exponential(0.05, N)), rng.integers(20, 300, N),
                         out, np.maximum(out * rng.uniform(0.4, 2.5, N), 1.0),
                         rng.uniform(0, 1, N), pad_to=72)


def _setup(system, seed=0, record=True):
    opts = make_options(system, block=4, record=record)
    spec = get_system(system)
    if spec.device_defaults:  # an engine system: its arguments set the KV capacity
        dep = ENGINE_DEP
        cfg = config(CAP, n_slots=16, admit_window=4, max_len=MAX_LEN, max_prefill=800.0,
                     chunked=True)
        params = spec.default_params(MAX_LEN, HW, dep)
        params.update(max_num_seqs=np.float32(12), max_num_batched_tokens=np.float32(800),
                      gpu_memory_utilization=np.float32(ENGINE_UTIL))
    else:
        dep = DEP
        cfg = config(CAP, n_slots=16, admit_window=4, max_len=MAX_LEN, max_prefill=800.0)
        params = spec.default_params(MAX_LEN, HW)
    params = {k: jnp.asarray(v) for k, v in params.items()}
    return make_inputs(_workload(seed), cfg, opts, deployment=dep), params, opts


def _limit(inputs, params, opts):
    """The tokens a system's memory may never exceed: its family's ``memory_limit``
    (e.g. the elastic family's pool, which eLLM's KV may inflate into), else the KV
    capacity."""
    fn = getattr(family_of(opts.system), "memory_limit", None)
    return float(fn(inputs, params, opts)) if fn else CAP


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_run_keeps_memory_and_accounts_for_every_request(system, seed):
    inputs, params, opts = _setup(system, seed)
    st = simulate_until_done(inputs, HW, params, opts, chunk_blocks=16)
    m = {k: float(v) for k, v in metrics(st, inputs, opts).items()}
    assert m["completed"] + m["dropped"] == N, m
    assert m["unserved"] == m["dropped"]
    limit = _limit(inputs, params, opts)
    assert 0.0 <= m["max_pool_use"] <= 1.0 and 0.0 <= m["peak_kv_tokens"] <= limit
    fin = np.asarray(st.rec.finish_iter)[:N]
    assert int(np.sum(fin >= 0)) == m["completed"]
    # the same run again: bit-identical
    st2 = simulate_until_done(inputs, HW, params, opts, chunk_blocks=16)
    for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(st2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def relaxed_runs():
    """Per system, a compiled fixed-length run ``run(t) -> (metrics, used tokens per
    iteration)`` over the exact run's horizon (record off), shared by the memory and the
    convergence tests: one compile per system instead of one per test. The horizon is
    the iteration count of the exact-test run (record on: the same iterations, and the
    code ``test_exact_run_keeps_memory_and_accounts_for_every_request`` compiled)."""
    cache = {}

    def get(system):
        if system not in cache:
            inputs, params, opts = _setup(system, record=False)
            r_inputs, _, r_opts = _setup(system)
            steps = int(simulate_until_done(r_inputs, HW, params, r_opts,
                                            chunk_blocks=16).it)

            @jax.jit
            def run(t):
                st, used = simulate(inputs, HW, params, t, opts, steps)[:2]
                return metrics(st, inputs, opts), used

            cache[system] = (run, inputs, params, opts)
        return cache[system]

    yield get
    cache.clear()


@pytest.mark.parametrize("system", SYSTEMS)
def test_memory_per_iteration_within_capacity(system, relaxed_runs):
    """Exact mode, every iteration of the whole run (until every request finished or
    was dropped): memory never negative nor over the family's limit."""
    run, inputs, params, opts = relaxed_runs(system)
    m, used = run(jnp.float32(0.0))
    assert float(m["completed"]) + float(m["dropped"]) == N  # the horizon: whole run
    used = np.asarray(used)
    limit = _limit(inputs, params, opts)
    assert used.min() >= 0.0 and used.max() <= limit, (used.min(), used.max(), limit)


@pytest.mark.parametrize("system", SYSTEMS)
def test_relaxed_converges_to_exact(system, relaxed_runs):
    run, _, _, _ = relaxed_runs(system)
    exact = run(jnp.float32(0.0))[0]
    assert float(exact["completed"]) + float(exact["dropped"]) == N
    errs = []
    for t in (0.3, 0.003, 0.0001):
        m = run(jnp.float32(t))[0]
        errs.append(max(abs(float(m[k]) - float(exact[k])) / max(abs(float(exact[k])), 1e-9)
                        for k in ("tps", "completed", "peak_kv_tokens")))
    assert errs[-1] < 1e-3 and errs[-1] <= errs[0], errs


def test_bucketed_state_keeps_the_shared_fields():
    """The driver and the shared metrics read the core fields of a family's state."""
    import dataclasses

    from models.bucketed.state import BucketAcc, BucketRecord, BucketSlots
    from models.server import Acc, Record, Slots

    for core, ext in ((Slots, BucketSlots), (Acc, BucketAcc), (Record, BucketRecord)):
        names = {f.name for f in dataclasses.fields(ext)}
        assert {f.name for f in dataclasses.fields(core)} <= names, ext.__name__
