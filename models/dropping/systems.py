"""The parameter-dropping family's systems, registered by name: ``kunserve``, ``vllm-dp``,
``vllm-pp``, ``infercept``, ``llumnix``."""

from __future__ import annotations

from models.registry import ParamSpec, SystemSpec, register_system

__all__ = ["INFERCEPT", "KUNSERVE", "LLUMNIX", "VLLM_DP", "VLLM_PP", "ridge_tokens"]

KUNSERVE_SRC = (
    "KunServe (shared/seeds/kunserve.txt): restore when KV usage falls below 50% of the "
    "undropped capacity (section 4.4); drop when memory throttles, counting running and "
    "head-of-line queued requests (section 2.2, after Llumnix) -- trigger margin 0 is our "
    "reading; MIN (Fig. 11) is 'profiled offline': our default is the device's ridge "
    "point, the microbatch size where a stage stops being weight-bound; the exchange "
    "chunk (section 4.2: a chunk's transfer close to a stage's execution) is our 32 MiB.")


def ridge_tokens(hw) -> float:
    """Tokens at which a microbatch's dense compute equals reading the weights:
    ``weight_bytes * peak * mfu / (stream_bw * bw_eff * dense_flops_per_token)`` (the
    ratio is the same on every pipeline stage)."""
    return float(hw.weight_bytes * hw.peak_flops * hw.mfu
                 / (hw.stream_bw * hw.bw_eff * hw.dense_flops_per_token))


def _kunserve_defaults(max_len, hw=None):
    return {"theta": 0.5, "margin": 0.0,
            "min_tokens": round(ridge_tokens(hw)) if hw is not None else 160.0,
            "chunk_mib": 32.0}


KUNSERVE = register_system(SystemSpec(
    name="kunserve", family="dropping",
    doc="KunServe: under memory throttling, merge the two smallest pipeline groups "
        "(throttled ones first among equals) until the dropped weight copies cover the "
        "demand (Fig. 6), exchange the ongoing "
        "requests' KV in chunks behind activations, run groups as pipelines with "
        "lookahead microbatches (Fig. 11), restore the weights when load falls.",
    params=(
        ParamSpec("theta", "interval", "share of the undropped KV capacity",
                  "restore when the group's held + queued KV falls below this", 0.05, 0.95),
        ParamSpec("margin", "interval", "share of the KV capacity",
                  "drop when held + head-of-line need exceeds (1 - margin) of capacity",
                  0.0, 0.5),
        ParamSpec("min_tokens", "log_positive", "tokens",
                  "lookahead stops splitting when the first microbatch has at most this"),
        ParamSpec("chunk_mib", "log_positive", "MiB", "KV-exchange chunk size"),
    ),
    defaults=_kunserve_defaults,
    baselines=("vllm-dp", "vllm-pp", "infercept", "llumnix"), sources=(KUNSERVE_SRC,)))

VLLM_DP = register_system(SystemSpec(
    name="vllm-dp", family="dropping",
    doc="vLLM (v0.6.3, the paper's default): one replica per instance, least-loaded "
        "dispatch, recompute on preemption.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("vllm-dp",),
    sources=("KunServe section 5.1 baselines",)))

VLLM_PP = register_system(SystemSpec(
    name="vllm-pp", family="dropping",
    doc="vLLM with static pipeline parallelism over pairs of instances (half the "
        "weights each), token-count microbatches, recompute on preemption.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("vllm-dp",),
    sources=("KunServe section 5.1: vLLM (PP) frees half of the parameters on each "
             "instance and pipelines across two instances",)))

INFERCEPT = register_system(SystemSpec(
    name="infercept", family="dropping",
    doc="InferCept-style swapping: preempted requests' KV goes to host memory over the "
        "host link (overlapped with compute) and comes back before new admissions.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("vllm-dp",),
    sources=("KunServe section 5.1 (InferCept with the paper's scheduler)",)))

LLUMNIX = register_system(SystemSpec(
    name="llumnix", family="dropping",
    doc="Llumnix-style live migration: a throttled instance moves its newest running "
        "request to the instance with the most free memory.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("vllm-dp",),
    sources=("KunServe section 5.1 (Llumnix v0.1.0)",)))
