"""vLLM V1's engine arguments as traced policy parameters (the ``vllm-v1`` system).

``max_num_seqs``, ``max_num_batched_tokens`` and ``gpu_memory_utilization`` are the
system's parameters, not the scenario's: :func:`engine_cfg` turns them into the server
config a run uses, inside the traced program, so they vmap and carry relaxed gradients:

- ``max_batch`` = ``max_num_seqs`` (running requests at most; the slot table
  ``n_slots`` bounds it from above: a setting above it runs as ``n_slots``);
- ``max_prefill`` = ``max_num_batched_tokens`` (the token budget of each step);
- ``capacity_tokens``: the KV cache vLLM's start-up memory profile leaves
  (``hardware.memory_profile.vllm_memory_profile``, V1 line): ``available = total *
  gpu_memory_utilization - weights - non-torch - max(forward * T, held * T + per_row *
  min(S, T) + fixed)`` with ``T`` = ``max_num_batched_tokens`` and ``S`` =
  ``max_num_seqs`` (the profiling run's activation peak,
  ``hardware.memory_profile.activation_coefficients``); ``blocks = floor(floor(available
  / page) / layers)`` (V1 divides by one layer's page of ``block_size`` tokens, then
  by the layers); ``capacity = blocks * block_size``. Exact mode reproduces the profile's ``kv_cache_tokens`` (a
  test checks it on a grid); relaxed mode keeps the floors' value with slope 1.
- A setting vLLM refuses at start-up (``max_num_batched_tokens < max_num_seqs``, no
  block left, or fewer KV tokens than ``max_model_len``), or one that runs out of
  memory when it captures CUDA graphs after allocating the KV cache (``total *
  gpu_memory_utilization`` plus the graphs above the device's memory: vLLM's own
  ``benchmarks/auto_tune`` meets these as crashes and steps the utilisation down),
  serves nothing: capacity 0, so every request is dropped. :func:`refusal` names the
  reason on the host.

- ``prefill_cap`` = ``long_prefill_token_threshold``: the prefill tokens one request
  may compute in a step (V1's scheduler caps each running and waiting request's new
  tokens at it before the budget); at or above ``max_num_batched_tokens`` it never
  binds, which is vLLM's default (0, off).
- ``max_num_partial_prefills`` must be 1: V1 refuses any other value at start-up
  (``EngineArgs._check_feature_supported``: concurrent partial prefill is a V0 feature).

All byte terms are carried in units of one token's K and V in one layer, so float32
keeps the profile's block count. ``block_size`` is a parameter too (paged's, fixed at
the deployment's: not tuned yet).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from models.server import ServerConfig

__all__ = ["EngineInputs", "WATERMARK", "engine_cfg", "engine_inputs", "kv_blocks",
           "refusal"]

# vLLM's block manager keeps 1% of the blocks free at admission (V0 BlockSpaceManager
# watermark=0.01; the first V1 KVCacheManager kept the same default): the share the
# scenario's paged runs use (tuner.scenario.ScenarioSpec.watermark).
WATERMARK = 0.01


@struct.dataclass
class EngineInputs:
    """The memory profile's constants of one deployment, in units of one token's K and
    V in one layer."""

    total: jax.Array      # [] driver-reported device memory
    fixed: jax.Array      # [] weights + non-torch (+ CUDA graphs when estimated)
    forward: jax.Array    # [] per batched token: the forward's live tensors
    held: jax.Array       # [] per batched token: hidden states held through sampling
    per_row: jax.Array    # [] per sampled row: logits and their fp32 copies
    workspace: jax.Array  # [] the sampler's fixed workspace
    layers: jax.Array     # [] layers on this device
    graphs: jax.Array     # [] CUDA graphs captured beyond gpu_memory_utilization (0 when
    #                       eager, or when the profile already took them out of the KV)
    max_model_len: jax.Array  # [] tokens: vLLM refuses a cache smaller than this


def engine_inputs(deployment) -> EngineInputs:
    """The constants of ``deployment``'s vLLM V1 memory profile (host side). Raises
    ValueError when the deployment has no V1 profile (the scenario's scheduler must be
    ``chunked``, vLLM V1's)."""
    from hardware.memory_profile import activation_coefficients

    prof = getattr(deployment, "profile", None)
    if prof is None or prof.version != "v1":
        raise ValueError("vllm-v1: the scenario must be a vLLM V1 deployment (scheduler "
                         "'chunked', a KV capacity from vLLM's memory profile, no "
                         "capacity_tokens override)")
    layers = math.ceil(prof.model.n_layers / prof.pp)
    unit = prof.kv_bytes_per_token / layers
    act = max(prof.forward_peak_bytes, prof.sampler_peak_bytes)
    u = prof.gpu_memory_utilization
    # what the profile took out beyond weights, activations and non-torch memory (the
    # CUDA graph estimate when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on, else 0)
    extra = prof.total_bytes * u - prof.weights_bytes - act - prof.non_torch_bytes \
        - prof.kv_cache_bytes
    extra = 0.0 if abs(extra) < 1.0 else extra
    graphs = 0.0 if extra or prof.enforce_eager else prof.cuda_graph_bytes
    coef = activation_coefficients(prof.model, tp=prof.tp, version="v1")
    f = lambda x: jnp.float32(x / unit)  # noqa: E731
    return EngineInputs(
        total=f(prof.total_bytes), fixed=f(prof.weights_bytes + prof.non_torch_bytes + extra),
        forward=f(coef.forward), held=f(coef.held), per_row=f(coef.per_row),
        workspace=f(coef.fixed), layers=jnp.float32(layers), graphs=f(graphs),
        max_model_len=jnp.float32(prof.max_model_len))


def _floor(x):
    """floor(x); slope 1 (straight-through), so relaxed gradients see the trend."""
    return x - jax.lax.stop_gradient(x - jnp.floor(x))


def kv_blocks(ex: EngineInputs, seqs, tokens, util, block_size):
    """vLLM V1's KV blocks at ``max_num_seqs`` / ``max_num_batched_tokens`` /
    ``gpu_memory_utilization`` / ``block_size`` (traced; <= 0 where vLLM refuses)."""
    rows = jnp.minimum(seqs, tokens)
    act = jnp.maximum(ex.forward * tokens, ex.held * tokens + ex.per_row * rows
                      + ex.workspace)
    avail = ex.total * util - ex.fixed - act
    return _floor(_floor(avail / block_size) / ex.layers)


def engine_cfg(cfg: ServerConfig, params, ex: EngineInputs) -> ServerConfig:
    """The server config of the engine arguments in ``params`` (traced)."""
    seqs = params["max_num_seqs"]
    tokens = params["max_num_batched_tokens"]
    bs = params["block_size"]
    blocks = kv_blocks(ex, seqs, tokens, params["gpu_memory_utilization"], bs)
    cap = blocks * bs
    util = params["gpu_memory_utilization"]
    starts = ((tokens >= seqs) & (blocks > 0) & (cap >= ex.max_model_len)
              & (ex.total * util + ex.graphs <= ex.total))
    # absent (a caller that did not validate its params): vLLM's defaults, 1 and off
    starts = starts & (params.get("max_num_partial_prefills", 1) == 1)  # V1 refuses others
    cap = jnp.where(starts, cap, 0.0)
    # a threshold at or above the budget never binds (vLLM's default 0: no cap)
    thr = params.get("long_prefill_token_threshold")
    return cfg.replace(capacity_tokens=cap, max_batch=seqs, max_prefill=tokens,
                       watermark_tokens=_floor(WATERMARK * cap),
                       prefill_cap=None if thr is None else jnp.asarray(thr, jnp.float32))


def refusal(deployment, params) -> tuple[str, str] | None:
    """vLLM's start-up refusal of the engine arguments in ``params`` on
    ``deployment`` as ``(field, message)``, or None when vLLM starts (host side: the
    memory profile itself, in float64)."""
    from hardware import VllmRefusal
    from hardware.memory_profile import vllm_memory_profile

    prof = deployment.profile
    partial = int(params.get("max_num_partial_prefills", 1))
    if partial != 1:  # vllm/engine/arg_utils.py, EngineArgs._check_feature_supported
        return "max_num_partial_prefills", (
            f"max_num_partial_prefills: {partial}: vLLM V1 refuses any value but 1 "
            "(\"Concurrent Partial Prefill\" is not supported by the V1 engine)")
    try:
        p = vllm_memory_profile(
            prof.device, prof.model, tp=prof.tp, pp=prof.pp,
            gpu_memory_utilization=float(params["gpu_memory_utilization"]),
            max_model_len=prof.max_model_len,
            max_num_batched_tokens=int(params["max_num_batched_tokens"]),
            max_num_seqs=int(params["max_num_seqs"]),
            block_size=int(params.get("block_size", prof.block_size)),
            kv_cache_dtype=prof.kv_cache_dtype, quantization=prof.quantization,
            enforce_eager=prof.enforce_eager, enable_chunked_prefill=True,
            version="v1", strict=True,
            estimate_cudagraphs=any("ESTIMATE_CUDAGRAPHS" in n for n in prof.notes))
    except VllmRefusal as e:
        return e.field, str(e)
    graphs = 0.0 if p.enforce_eager or any("ESTIMATE_CUDAGRAPHS" in n for n in p.notes) \
        else p.cuda_graph_bytes
    if p.total_bytes * p.gpu_memory_utilization + graphs > p.total_bytes:
        gib = 2.0 ** 30
        left = p.total_bytes * (1 - p.gpu_memory_utilization) / gib
        return "gpu_memory_utilization", (
            f"gpu_memory_utilization: {p.gpu_memory_utilization:g} of "
            f"{p.total_bytes / gib:.2f} GiB leaves {left:.2f} GiB, less than the CUDA "
            f"graphs (~{graphs / gib:.2f} GiB) vLLM captures after allocating the KV "
            "cache: out of memory at start-up (predicted; lower it or pass "
            "--enforce-eager)")
    return None
