"""Roofline cost of one continuous-batching iteration, jit/vmap/grad friendly.

Assumptions (defaults of :func:`roofline_params`, all overridable):

* ``mfu = 0.5``: achievable share of dense peak FLOP/s for the large GEMMs of a
  serving step (assumption; prefill-heavy steps on tuned kernels reach ~0.4-0.6).
* ``bw_eff = 0.8``: achievable share of streaming bandwidth, inside the 60-85%
  model-bandwidth-utilisation band reported for vLLM/TensorRT-LLM decode
  (open-source-ai.tech glossary, "model bandwidth utilization").
* ``step_overhead_s = 2e-3``: fixed scheduling + launch time per iteration
  (assumption; vLLM v0.6 release notes put CPU overhead among the main costs of a
  step, which multi-step scheduling amortises).

Not modelled: tensor-parallel all-reduces, pipeline bubbles and activation traffic,
KV writes of the new tokens (small next to the reads), prefill attention's reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from hardware.deploy import Deployment

__all__ = ["RooflineParams", "effective_bandwidth", "iteration_time", "roofline_params"]

DEFAULT_MFU = 0.5
DEFAULT_BW_EFF = 0.8
DEFAULT_STEP_OVERHEAD_S = 2e-3


def effective_bandwidth(stream_bw, alpha, burst_bytes, chunk_bytes):
    """Bandwidth when reading contiguous chunks of ``chunk_bytes`` at random places.

    ``stream_bw * (alpha + (1 - alpha) * chunk / (chunk + burst))``: ``alpha *
    stream_bw`` for tiny chunks, ``stream_bw`` for huge ones, half-way at ``chunk ==
    burst``. Arithmetic only, so floats, NumPy and traced JAX arrays all work.
    """
    frac = chunk_bytes / (chunk_bytes + burst_bytes)
    return stream_bw * (alpha + (1 - alpha) * frac)


class RooflineParams(NamedTuple):
    """Per-device numbers of one deployment; a pytree of float leaves (vmap-able)."""

    weight_bytes: float  # weights read once per iteration, per device
    kv_bytes_per_token: float  # K+V of one token, all of this device's layers
    kv_bytes_per_token_layer: float  # K+V of one token in one layer on this device
    dense_flops_per_token: float  # 2 * n_params / (tp * pp)
    attn_flops_per_ctx_token: float  # per new token per attended token, per device
    stream_bw: float  # bytes/s
    alpha: float  # random/sequential bandwidth ratio for tiny chunks
    burst_bytes: float  # chunk size recovering half the random-access penalty
    peak_flops: float  # FLOP/s
    host_link_bw: float  # bytes/s per direction
    network_bw: float  # bytes/s per device per direction
    mfu: float  # achievable fraction of peak_flops
    bw_eff: float  # achievable fraction of stream_bw
    step_overhead_s: float  # fixed seconds per iteration
    pp: float  # pipeline stages an iteration passes through


def roofline_params(
    dep: Deployment,
    *,
    mfu: float = DEFAULT_MFU,
    bw_eff: float = DEFAULT_BW_EFF,
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> RooflineParams:
    """The :class:`RooflineParams` (Python floats) of ``dep``."""
    for field, v, hi in (("mfu", mfu, 1.0), ("bw_eff", bw_eff, 1.0)):
        if not 0.0 < v <= hi:
            raise ValueError(
                f"roofline_params: field {field!r} must be in (0, 1], got {v!r}"
            )
    if not step_overhead_s >= 0.0:
        raise ValueError(
            f"roofline_params: field 'step_overhead_s' must be >= 0, "
            f"got {step_overhead_s!r}"
        )
    shards = dep.tp * dep.pp
    m, d = dep.model, dep.device
    return RooflineParams(
        weight_bytes=float(dep.weight_bytes_per_device),
        kv_bytes_per_token=float(dep.kv_bytes_per_token_per_device),
        kv_bytes_per_token_layer=float(dep.kv_bytes_per_token_layer_device),
        dense_flops_per_token=float(2 * m.n_params / shards),
        attn_flops_per_ctx_token=float(m.attn_flops_per_ctx_token / shards),
        stream_bw=float(d.stream_bw),
        alpha=float(d.alpha),
        burst_bytes=float(d.burst_bytes),
        peak_flops=float(d.peak_flops),
        host_link_bw=float(d.host_link_bw),
        network_bw=float(d.network_bw),
        mfu=float(mfu),
        bw_eff=float(bw_eff),
        step_overhead_s=float(step_overhead_s),
        pp=float(dep.pp),
    )


def _as_float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(float)


def iteration_time(
    p: RooflineParams,
    prefill_tokens,
    decode_seqs,
    decode_ctx_tokens,
    kv_chunk_tokens,
    copy_bytes=0.0,
    prefill_ctx_tokens=None,
):
    """Seconds for one iteration of a continuous batch (scalar or batched inputs).

    * ``prefill_tokens``: prompt tokens processed this iteration (all requests).
    * ``decode_seqs``: sequences producing one token each.
    * ``decode_ctx_tokens``: cached tokens those sequences attend to, summed.
    * ``kv_chunk_tokens``: contiguous tokens per KV read; a contiguous reservation
      passes its length (or any large value), paged KV its block size ``k``.
    * ``copy_bytes``: bytes each device copies device-to-device this iteration
      (e.g. a KV migration; read + write at streaming bandwidth).
    * ``prefill_ctx_tokens``: attended (query, key) pairs of the prefill tokens;
      None assumes one fresh prompt, ``n * (n + 1) / 2``.

    Per stage: ``max(compute, memory)`` with compute = FLOPs / (peak * mfu) and
    memory = weights (only if the iteration has work) / (stream * bw_eff) + KV reads
    at :func:`effective_bandwidth`. The batch passes ``pp`` stages in turn (no
    microbatch overlap); then the copy and ``step_overhead_s`` are added.
    """
    prefill = _as_float(prefill_tokens)
    decode = _as_float(decode_seqs)
    ctx = _as_float(decode_ctx_tokens)
    chunk = _as_float(kv_chunk_tokens)
    if prefill_ctx_tokens is None:
        prefill_ctx = prefill * (prefill + 1.0) / 2.0
    else:
        prefill_ctx = _as_float(prefill_ctx_tokens)
    new_tokens = prefill + decode
    flops = (
        new_tokens * p.dense_flops_per_token
        + (ctx + prefill_ctx) * p.attn_flops_per_ctx_token
    )
    compute_s = flops / (p.peak_flops * p.mfu)
    bw = p.stream_bw * p.bw_eff
    kv_bw = effective_bandwidth(
        bw, p.alpha, p.burst_bytes, chunk * p.kv_bytes_per_token_layer
    )
    weights_s = jnp.where(new_tokens > 0, p.weight_bytes / bw, 0.0)
    memory_s = weights_s + ctx * p.kv_bytes_per_token / kv_bw
    copy_s = 2.0 * _as_float(copy_bytes) / bw
    return p.pp * jnp.maximum(compute_s, memory_s) + copy_s + p.step_overhead_s
