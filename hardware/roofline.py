"""Roofline cost of one continuous-batching iteration, jit/vmap/grad friendly.

Numbers (defaults of :func:`roofline_params`, all overridable):

* ``mfu`` and ``bw_eff``: per device, from published measurements carried on the
  :class:`hardware.Device` presets with their sources (achieved dense BF16 GEMM
  FLOP/s and STREAM-Triad bandwidth over the datasheet peaks; A100 0.869 / 0.834,
  H100 0.803 / 0.887). Devices without a measurement carry the former global
  assumptions 0.5 / 0.8 and say so in their sources.
* ``step_overhead_s = 4e-3``: fixed scheduling + input preparation + output
  processing per iteration, measured: "about 4ms of GPU bubble" per decode step in
  vLLM's profile before multi-step scheduling (vLLM RFC "Multi-Step Scheduling",
  github.com/vllm-project/vllm/issues/6854; the same RFC quotes 5-13 ms of bubble;
  vLLM PR #4261 measured ~2.5 ms for the scheduler call alone).
* Tensor parallelism (Megatron-style, as vLLM shards a decoder): two all-reduces per
  layer (after attention, after the MLP) of ``new tokens x hidden_size x dtype
  bytes`` each, as a ring: ``2 (tp-1)/tp * bytes / tp_link_bw`` plus the device's
  measured small-message latency ``tp_allreduce_latency_s``; zero at ``tp = 1``.
  vLLM issues the all-reduce on the compute stream and waits for it (no
  compute/communication overlap by default), so it is added to the stage time.

Not modelled: pipeline bubbles and activation traffic between stages, the
vocabulary-parallel embedding all-reduce and logits gather, KV writes of the new
tokens (small next to the reads), prefill attention's reads.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from hardware.placement import Deployment

__all__ = [
    "ALLREDUCES_PER_LAYER",
    "DEFAULT_STEP_OVERHEAD_S",
    "RooflineParams",
    "Work",
    "effective_bandwidth",
    "iteration_time",
    "roofline_params",
    "tp_allreduce_time",
    "work_time",
]

DEFAULT_STEP_OVERHEAD_S = 4e-3
ALLREDUCES_PER_LAYER = 2  # Megatron TP: after attention's o_proj, after the MLP


def effective_bandwidth(stream_bw, alpha, burst_bytes, chunk_bytes):
    """Bandwidth when reading contiguous chunks of ``chunk_bytes`` at random places.

    ``stream_bw * (alpha + (1 - alpha) * chunk / (chunk + burst))``: ``alpha *
    stream_bw`` for tiny chunks, ``stream_bw`` for huge ones, half-way at ``chunk ==
    burst``. Arithmetic only, so floats, NumPy and traced JAX arrays all work.
    """
    frac = chunk_bytes / (chunk_bytes + burst_bytes)
    return stream_bw * (alpha + (1 - alpha) * frac)


class RooflineParams(NamedTuple):
    """Per-device numbers of one deployment; a pytree of float leaves (vmap-able).

    New fields go at the end, so positional construction of the old fields keeps
    working.
    """

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
    tp: float = 1.0  # tensor-parallel degree (devices sharing each layer)
    allreduces_per_stage: float = 0.0  # ALLREDUCES_PER_LAYER * n_layers / pp
    activation_bytes_per_token: float = 0.0  # hidden_size * dtype bytes
    tp_link_bw: float = 1.0  # TP fabric, bytes/s per direction
    tp_allreduce_latency_s: float = 0.0  # fixed seconds per all-reduce
    # calibration terms (tuner.calibrate fits them to a measured server; 0 / 1 leave
    # the uncalibrated model unchanged)
    token_overhead_s: float = 0.0  # host seconds per token scheduled in an iteration
    tp_comm_eff: float = 1.0  # achieved fraction of tp_link_bw in the all-reduces
    request_overhead_s: float = 0.0  # client-seen seconds outside the engine loop
    #   (HTTP, tokenisation, first-token detokenisation), added to each TTFT


class Work(NamedTuple):
    """What one iteration computed: the arguments of :func:`iteration_time` after
    ``p`` (a simulator can log one per iteration so that its step times can be
    recomputed for other :class:`RooflineParams` on the same schedule)."""

    prefill_tokens: float
    decode_seqs: float
    decode_ctx_tokens: float
    kv_chunk_tokens: float
    copy_bytes: float = 0.0
    prefill_ctx_tokens: float = 0.0


def roofline_params(
    dep: Deployment,
    *,
    mfu: float | None = None,
    bw_eff: float | None = None,
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
    token_overhead_s: float = 0.0,
    tp_comm_eff: float = 1.0,
    request_overhead_s: float = 0.0,
) -> RooflineParams:
    """The :class:`RooflineParams` (Python floats) of ``dep``.

    ``mfu`` and ``bw_eff`` default to the device's measured figures
    (``dep.device.mfu`` / ``.bw_eff``, sources on the device); pass a number to
    override either. The calibration terms (``token_overhead_s``, ``tp_comm_eff``,
    ``request_overhead_s``) default to the uncalibrated model (0, 1, 0).
    """
    m, d = dep.model, dep.device
    mfu = d.mfu if mfu is None else mfu
    bw_eff = d.bw_eff if bw_eff is None else bw_eff
    for field, v, hi in (("mfu", mfu, 1.0), ("bw_eff", bw_eff, 1.0)):
        if not 0.0 < v <= hi:
            raise ValueError(
                f"roofline_params: field {field!r} must be in (0, 1], got {v!r}"
            )
    for field, v in (("step_overhead_s", step_overhead_s),
                     ("token_overhead_s", token_overhead_s),
                     ("request_overhead_s", request_overhead_s)):
        if not 0.0 <= v < float("inf"):
            raise ValueError(
                f"roofline_params: field {field!r} must be a finite number >= 0, "
                f"got {v!r}"
            )
    if not 0.0 < tp_comm_eff <= 1.0:
        raise ValueError(
            f"roofline_params: field 'tp_comm_eff' must be in (0, 1], got {tp_comm_eff!r}"
        )
    shards = dep.tp * dep.pp
    return RooflineParams(
        weight_bytes=float(dep.weight_bytes_per_device),
        kv_bytes_per_token=float(dep.kv_bytes_per_token_per_device),
        kv_bytes_per_token_layer=float(dep.kv_bytes_per_token_layer_device),
        dense_flops_per_token=float(2 * m.active_params / shards),
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
        tp=float(dep.tp),
        allreduces_per_stage=float(ALLREDUCES_PER_LAYER * m.n_layers / dep.pp),
        activation_bytes_per_token=float(m.hidden_size * m.dtype_bytes),
        tp_link_bw=float(d.tp_link_bw),
        tp_allreduce_latency_s=float(d.tp_allreduce_latency_s),
        token_overhead_s=float(token_overhead_s),
        tp_comm_eff=float(tp_comm_eff),
        request_overhead_s=float(request_overhead_s),
    )


def _as_float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(float)


def tp_allreduce_time(p: RooflineParams, tokens):
    """Seconds of tensor-parallel all-reduces one stage spends on ``tokens`` tokens.

    ``allreduces_per_stage`` ring all-reduces of ``tokens * hidden * dtype`` bytes,
    each ``2 (tp-1)/tp * bytes / (tp_link_bw * tp_comm_eff) + tp_allreduce_latency_s``;
    zero at
    ``tp = 1`` or with no tokens. Arithmetic and ``jnp.where`` only (traceable).
    """
    tokens = _as_float(tokens)
    ring = 2.0 * (p.tp - 1.0) / p.tp
    one = ring * tokens * p.activation_bytes_per_token / (p.tp_link_bw * p.tp_comm_eff)
    one = one + jnp.where(p.tp > 1.0, p.tp_allreduce_latency_s, 0.0)
    return jnp.where(tokens > 0, p.allreduces_per_stage * one, 0.0)


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
    at :func:`effective_bandwidth`, plus the stage's tensor-parallel all-reduces
    (:func:`tp_allreduce_time`), added serially because vLLM does not overlap them
    with compute. The batch passes ``pp`` stages in turn (no microbatch overlap);
    then the copy, ``step_overhead_s`` and ``token_overhead_s`` per new token are
    added.
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
    comm_s = tp_allreduce_time(p, new_tokens)
    copy_s = 2.0 * _as_float(copy_bytes) / bw
    stage_s = jnp.maximum(compute_s, memory_s) + comm_s
    return p.pp * stage_s + copy_s + p.step_overhead_s + p.token_overhead_s * new_tokens


def work_time(p: RooflineParams, work: Work):
    """:func:`iteration_time` of a logged :class:`Work` (any leading shape)."""
    return iteration_time(p, work.prefill_tokens, work.decode_seqs,
                          work.decode_ctx_tokens, work.kv_chunk_tokens, work.copy_bytes,
                          prefill_ctx_tokens=work.prefill_ctx_tokens)
