"""The bucketed family's systems, registered by name: ``static``, ``paged``, ``s3``,
``odma`` (each with its policy in ``models.bucketed.policies``)."""

from __future__ import annotations

import numpy as np

from models.registry import ParamSpec, SystemSpec, register_system

__all__ = ["STATIC", "PAGED", "S3", "ODMA", "ODMA_PB", "VLLM_V1"]

ODMA_SRC = ("ODMA strategy paper (shared/seeds/odma-strategy.txt, III-B..D): gamma = 0.2, "
            "tau = 0.8, B = 4 buckets, window 10,000, refresh every 1,000 requests; the "
            "quantile levels and large-pool share are not published (our choice: "
            "p = 0.5/0.9/0.99, large share 0.1).")

STATIC = register_system(SystemSpec(
    name="static", family="bucketed",
    doc="Worst-case pre-allocation of max_len output tokens per request "
        "(the ODMA papers' Cambricon-vLLM baseline).",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("static",)))

PAGED = register_system(SystemSpec(
    name="paged", family="bucketed",
    doc="vLLM-style paged KV: blocks of block_size tokens allocated on demand; scattered "
        "block reads pay the device's random-access penalty; preemption by recompute.",
    params=(ParamSpec("block_size", "integer", "tokens",
                      "KV block size (vLLM default 16)", tunable=False),),
    defaults=lambda max_len, hw=None: {"block_size": 16.0}, baselines=("static",),
    sources=("vLLM default block_size=16 (PagedAttention, SOSP'23)",)))

S3 = register_system(SystemSpec(
    name="s3", family="bucketed",
    doc="S3-style static buckets: the smallest fixed bound >= the prediction; an "
        "under-predicted request is preempted and re-admitted with max_len.",
    params=(ParamSpec("bounds", "ordered_positive", "tokens",
                      "fixed bucket upper bounds (below max_len)"),),
    defaults=lambda max_len, hw=None: {
        "bounds": np.round(np.arange(1, 10) * max_len / 10.0)},
    baselines=("static",),
    sources=("S3 (Jin et al. 2023) splits the length range into equal-width buckets; "
             "10 buckets assumed here",)))

ODMA = register_system(SystemSpec(
    name="odma", family="bucketed",
    doc="ODMA: inflated predictions L(1+gamma*u), u > tau routed to a large-bucket pool, "
        "bucket bounds = sliding-window quantiles, mid-decode migration on overflow.",
    params=(
        ParamSpec("levels", "ordered_unit", "quantile level", "bucket bounds Q_p of the window"),
        ParamSpec("gamma", "interval", "1", "inflation factor for uncertainty", 0.0, 4.0),
        ParamSpec("tau", "interval", "1", "uncertainty routing threshold", 0.0, 1.0),
        ParamSpec("large_share", "interval", "share of KV capacity",
                  "large-bucket (safety) pool", 0.0, 0.9),
    ),
    defaults=lambda max_len, hw=None: {"levels": [0.5, 0.9, 0.99], "gamma": 0.2,
                                       "tau": 0.8, "large_share": 0.1},
    # SPEC.md: static worst-case pre-allocation, S3-style static buckets, paged KV
    baselines=("static", "s3", "paged"), sources=(ODMA_SRC,)))

PB_BUCKETS = 16
ODMA_PB = register_system(SystemSpec(
    name="odma-pb", family="bucketed",
    doc="ODMA with 16 buckets and per-bucket inflation: the raw prediction's bucket k "
        "picks gamma[k], the inflated prediction L(1+gamma[k]*u) picks the bucket; "
        "routing, large pool and migration as odma. A high-dimensional tuning problem "
        "(34 parameters); with equal gammas it is odma with 16 quantile levels.",
    params=(
        ParamSpec("levels", "ordered_unit", "quantile level", "bucket bounds Q_p of the window"),
        ParamSpec("gamma", "interval", "1", "inflation factor per bucket of the raw "
                  "prediction", 0.0, 4.0),
        ParamSpec("tau", "interval", "1", "uncertainty routing threshold", 0.0, 1.0),
        ParamSpec("large_share", "interval", "share of KV capacity",
                  "large-bucket (safety) pool", 0.0, 0.9),
    ),
    defaults=lambda max_len, hw=None: {
        "levels": np.round(np.linspace(0.1, 0.99, PB_BUCKETS), 4),
        "gamma": np.full(PB_BUCKETS, 0.2), "tau": 0.8, "large_share": 0.1},
    baselines=("odma", "static", "s3", "paged"),
    sources=(ODMA_SRC, "16 buckets at levels evenly spaced in [0.1, 0.99] and "
             "per-bucket inflation are our extension (the papers use B = 4 and one gamma)")))


_BUDGET_TOP = 16384.0  # max_num_batched_tokens' upper bound (see the sources below)


def _vllm_v1_defaults(max_len, hw, deployment):
    """vLLM V1's own defaults for the deployment's device (``vllm serve``) and
    ``gpu_memory_utilization`` 0.9 (hardware.memory_profile.vllm_defaults)."""
    from hardware.memory_profile import vllm_defaults

    d = vllm_defaults(deployment.device, "v1", "openai_server")
    return {"max_num_seqs": float(d["max_num_seqs"]),
            "max_num_batched_tokens": float(d["max_num_batched_tokens"]),
            "gpu_memory_utilization": 0.9,
            # vLLM's 0 (off) is any threshold >= the budget: shown as the largest
            # budget the search may try, so a raised budget stays uncapped
            "long_prefill_token_threshold": _BUDGET_TOP,
            "max_num_partial_prefills": 1.0,
            "block_size": float(getattr(deployment.profile, "block_size", 16))}


def _vllm_v1_refusal(deployment, params):
    from models.bucketed.engine import refusal

    return refusal(deployment, params)


VLLM_V1 = register_system(SystemSpec(
    name="vllm-v1", family="bucketed",
    doc="vLLM V1 as operators run it, its engine arguments the policy: paged KV and "
        "chunked prefill (paged's rules, scheduler 'chunked'); max_num_seqs bounds the "
        "running requests, max_num_batched_tokens each step's token budget, and with "
        "gpu_memory_utilization they set the KV capacity through vLLM's memory profile "
        "(models.bucketed.engine). A setting vLLM refuses at start-up serves nothing.",
    params=(
        ParamSpec("max_num_seqs", "int_log", "sequences",
                  "--max-num-seqs: running requests at most (the slot table bounds it)",
                  8.0, 2048.0),
        ParamSpec("max_num_batched_tokens", "int_log", "tokens",
                  "--max-num-batched-tokens: tokens per step (decodes + prefill chunks)",
                  64.0, _BUDGET_TOP),
        ParamSpec("gpu_memory_utilization", "interval", "share of device memory",
                  "--gpu-memory-utilization: what vLLM may use (weights, activations, "
                  "KV)", 0.5, 0.98),
        ParamSpec("long_prefill_token_threshold", "int_log", "tokens",
                  "--long-prefill-token-threshold: prefill tokens one request may "
                  "compute per step (at or above the budget: off, vLLM's default 0)",
                  16.0, 2.0 * _BUDGET_TOP),
        ParamSpec("max_num_partial_prefills", "integer", "sequences",
                  "--max-num-partial-prefills: vLLM V1 starts only with 1 (not tuned)",
                  tunable=False),
        ParamSpec("block_size", "integer", "tokens", "--block-size: KV block size (the "
                  "deployment's; not tuned)", tunable=False),
    ),
    defaults=_vllm_v1_defaults, device_defaults=True, refusal=_vllm_v1_refusal,
    baselines=("paged",),
    sources=("vLLM V1 engine defaults: vllm/engine/arg_utils.py (PR #17885), see "
             "hardware.memory_profile.vllm_defaults; ranges: max_num_seqs 8-2048 "
             "(vLLM's H100 default 1024 inside, not on the bound, where a search "
             "in the logistic theta space could not move it) and "
             "max_num_batched_tokens 64-16384 span vLLM's defaults and auto_tune's grids "
             "(benchmarks/auto_tune); gpu_memory_utilization 0.5-0.98 (auto_tune starts "
             "at 0.98)", "long_prefill_token_threshold: vllm/v1/core/sched/scheduler.py "
             "(each request's new tokens capped before the token budget); its range "
             "16-32768 holds the default (16,384, the top budget: never binds, vLLM's 0) "
             "inside, not on the bound; "
             "max_num_partial_prefills: vllm/engine/arg_utils.py "
             "_check_feature_supported (V1 refuses values other than 1)",)))
