"""Small shared builders for simulator tests: real-trace workloads, configs, runners."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import hardware
from models import (ServerConfig, get_system, make_inputs, make_options, make_workload,
                    metrics, simulate_until_done)
from tests.reference_bucketed import simulate_reference

TRACES = Path(os.environ.get("KVTUNE_TRACES", Path(__file__).resolve().parents[2]
                             / "shared" / "traces"))
DEP = hardware.make_deployment("mlu370-x4", "deepseek-r1-distill-qwen-7b", tp=1)
HW = hardware.roofline_params(DEP)
HW32 = type(HW)(*[np.float32(x) for x in HW])
KVB = float(DEP.kv_bytes_per_token_per_device)
# hardware.iteration_time compiled once, HW32 passed as an argument as the simulator
# passes its roofline parameters: the NumPy references call it once per iteration, and
# evaluated op by op (eager jnp) each call cost ~1 ms, most of a reference run
_ITERATION_TIME = jax.jit(hardware.iteration_time)


def step_time(prefill, decode, ctx, chunk, copy_bytes, pairs):
    """The references' float32 iteration time (seconds, a 0-d array) of the roofline."""
    f = np.float32
    return _ITERATION_TIME(HW32, f(prefill), f(decode), f(ctx), f(chunk), f(copy_bytes),
                           prefill_ctx_tokens=f(pairs))


def trace_workload(name: str, start: int, n: int, *, max_len: int, seed: int = 0,
                   max_prompt: int = 4000, pad_to: int | None = None):
    """A slice of a real trace with predictions drawn from the shipped error model."""
    from tuner.workloads.error_model import load_default_error_model
    from tuner.workloads.traces import load_trace

    tr = load_trace(TRACES / name)
    sl = slice(start, start + n)
    out = np.minimum(tr.output_tokens[sl], max_len)
    pred, u = load_default_error_model().sample(out, seed)
    arr = tr.arrival_s[sl] - tr.arrival_s[sl][0]
    return make_workload(arr, np.minimum(tr.prompt_tokens[sl], max_prompt), out,
                         pred, u, pad_to=pad_to)


def config(capacity, *, n_slots=32, admit_window=8, max_len=1024, max_batch=None,
           max_prefill=4096.0, watermark=0.0, chunked=False, prefill_cap=None,
           priority_window=256):
    return ServerConfig(
        capacity_tokens=jnp.float32(capacity),
        max_batch=jnp.int32(max_batch or n_slots), max_prefill=jnp.float32(max_prefill),
        ttft_slo_s=jnp.float32(5.0), tpot_slo_s=jnp.float32(0.2),
        token_scale=jnp.float32(32.0), kv_bytes_per_token=jnp.float32(KVB),
        watermark_tokens=jnp.float32(watermark),
        n_slots=n_slots, admit_window=admit_window, max_len=max_len, chunked=chunked,
        priority_window=priority_window,
        prefill_cap=None if prefill_cap is None else jnp.float32(prefill_cap))


def engine_deployment(max_model_len: int = 1024):
    """A vLLM V1 deployment of DEP's model and device (the ``vllm-v1`` system's memory
    profile) with a short ``max_model_len`` so that small KV capacities start."""
    return hardware.make_deployment(DEP.device, DEP.model, tp=1, engine="vllm-v1",
                                    engine_args={"max_model_len": max_model_len})


def engine_util_for(dep, tokens: float, *, seqs: int, batched: int) -> float:
    """The ``gpu_memory_utilization`` that leaves about ``tokens`` KV tokens on ``dep``
    at these batch limits (the memory profile's arithmetic, solved for it)."""
    from hardware.memory_profile import activation_peak_bytes

    prof = dep.profile
    act = activation_peak_bytes(prof.model, tp=1, max_num_batched_tokens=batched,
                                max_num_seqs=seqs, version="v1")["peak"]
    need = prof.weights_bytes + prof.non_torch_bytes + act + tokens * prof.kv_bytes_per_token
    return float(need / prof.total_bytes)


def params_for(kind, max_len, **over):
    p = get_system(kind).default_params(max_len)
    p.update({k: np.asarray(v, np.float32) for k, v in over.items()})
    return {k: jnp.asarray(v) for k, v in p.items()}


def opts_for(kind, record=True, **family):
    return make_options(kind, record=record, window=256, refresh_every=32, block=4,
                        **family)


def run_jax(wl, cfg, kind, params, record=True, t=0.0, **family):
    opts = opts_for(kind, record, **family)
    inputs = make_inputs(wl, cfg, opts)
    st = simulate_until_done(inputs, HW, params, opts, t=t, chunk_blocks=32)
    return st, {k: float(v) for k, v in metrics(st, inputs, opts).items()}


def run_reference(wl, cfg, kind, params, **family):
    opts = opts_for(kind, **family)
    return simulate_reference(
        np.asarray(wl.arrival_s), np.asarray(wl.prompt_tokens),
        np.asarray(wl.output_tokens), np.asarray(wl.pred_tokens), np.asarray(wl.pred_u),
        np.asarray(wl.valid), kind=kind,
        params={k: np.asarray(v).tolist() for k, v in params.items()},
        n_slots=cfg.n_slots, capacity=float(cfg.capacity_tokens),
        max_batch=int(cfg.max_batch), max_prefill=float(cfg.max_prefill),
        admit_window=cfg.admit_window, max_len=cfg.max_len, iteration_time=step_time,
        kv_bytes_per_token=KVB, contiguous_chunk_tokens=cfg.max_len,
        window=opts.family.window, refresh_every=opts.family.refresh_every,
        refresh_check=opts.block, watermark=float(cfg.watermark_tokens),
        chunked=cfg.chunked, large_borrow=opts.family.large_borrow,
        prefill_cap=None if cfg.prefill_cap is None else int(float(cfg.prefill_cap)),
        priority=None if wl.priority is None else np.asarray(wl.priority),
        priority_window=cfg.priority_window)
