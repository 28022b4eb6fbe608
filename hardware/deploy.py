"""A model placed on devices: per-device weights, activation reserve, KV capacity.

Memory budget per device (vLLM's rule, ``gpu_memory_utilization`` default 0.9)::

    memory_bytes * mem_util = weights / (tp*pp) + activation reserve + KV pool

The activation reserve follows vLLM's profiling run: one forward pass with
``max_batched_tokens`` tokens in flight, whose peak is at the MLP (residual, normed
input, attention output, QKV ~ 4 * hidden values per token plus the gate and up
projections, 2 * intermediate / tp) plus fp32 logits for ``max_num_seqs`` sampled
rows. Pass ``activation_bytes_per_device`` to override it (e.g. a baseline that
reserves activations for the maximum length, as eLLM §2 describes).

``make_deployment(..., engine="vllm-v1")`` (or ``"vllm-v0"``) instead sizes the KV
pool as vLLM does (:mod:`hardware.memory_profile`: the driver-reported memory, the
profiling run's activation peak, non-torch memory, block rounding), and the
deployment's ``kv_capacity_tokens`` is that profile's ``kv_cache_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping

from hardware.devices import Device, get_device
from hardware.llm import LLMSpec, get_model
from hardware.memory_profile import deployment_from_profile, vllm_memory_profile
from hardware.placement import (DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS,
                                DEFAULT_MEM_UTIL, Deployment, InfeasibleError,
                                activation_reserve_bytes, tp_splits_heads)

__all__ = [
    "Deployment",
    "InfeasibleError",
    "activation_reserve_bytes",
    "make_deployment",
]


# (device, model) -> (tp, source); model "*" matches any model on that device.
TP_PRESETS = {
    ("mlu370-x4", "*"): (
        4,
        (
            "ODMA papers §4: one node of four MLU370-X4 cards serving "
            "DeepSeek-R1-Distill-Qwen-7B"
        ),
    ),
    ("a100-80gb", "llama-2-70b"): (2, "DGX A100 node; 138 GB of fp16 weights need 2"),
    ("h800-80gb", "qwen-2.5-72b"): (4, "KunServe Table 1: Qwen-2.5-72B on 4 GPUs"),
    ("h800-80gb", "qwen-2.5-14b"): (1, "KunServe Table 1: Qwen-2.5-14B on 1 GPU"),
}
_MAX_TP = 64


def make_deployment(
    device,
    model,
    *,
    tp: int | None = None,
    pp: int = 1,
    mem_util: float = DEFAULT_MEM_UTIL,
    n_devices: int | None = None,
    max_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    activation_bytes_per_device: float | None = None,
    engine: str | None = None,
    engine_args: Mapping | None = None,
) -> Deployment:
    """Place ``model`` (name or LLMSpec) on ``device`` (name or Device).

    ``tp=None`` starts from :data:`TP_PRESETS` (or 1) and takes the smallest power of
    two from there that fits. ``n_devices`` defaults to one replica (``tp * pp``).
    ``engine="vllm-v1"`` / ``"vllm-v0"`` sizes the KV pool with
    :func:`hardware.memory_profile.vllm_memory_profile` (``mem_util`` is its
    ``gpu_memory_utilization``; ``max_batched_tokens`` / ``max_num_seqs`` default to
    vLLM's; ``engine_args`` passes its other arguments, e.g. ``max_model_len``);
    otherwise the budget rule of the module docstring (2048 tokens, 256 sequences).
    Raises :class:`InfeasibleError` when nothing fits, ValueError on bad arguments.
    """
    dev = device if isinstance(device, Device) else get_device(device)
    spec = model if isinstance(model, LLMSpec) else get_model(model)
    if engine is not None:
        if engine not in ("vllm-v1", "vllm-v0"):
            raise ValueError(f"field 'engine' must be 'vllm-v1', 'vllm-v0' or None, "
                             f"got {engine!r}")
        if activation_bytes_per_device is not None:
            raise ValueError("field 'activation_bytes_per_device' cannot be combined "
                             "with engine=...: the profile measures activations")
    elif engine_args:
        raise ValueError("field 'engine_args' needs engine='vllm-v1' or 'vllm-v0'")

    def build(t: int) -> Deployment:
        if engine is not None:
            prof = vllm_memory_profile(
                dev, spec, tp=t, pp=pp, gpu_memory_utilization=mem_util,
                max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs,
                version=engine.removeprefix("vllm-"), **dict(engine_args or {}))
            return deployment_from_profile(prof, n_devices=n_devices)
        act = activation_bytes_per_device
        if act is None:
            act = activation_reserve_bytes(
                spec,
                t,
                max_batched_tokens=max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS,
                max_num_seqs=max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            )
        return Deployment(
            device=dev,
            model=spec,
            n_devices=n_devices or t * pp,
            tp=t,
            pp=pp,
            mem_util=mem_util,
            activation_bytes_per_device=float(act),
        )

    if tp is not None:
        return build(tp)
    key = dev.name.lower(), spec.name.lower()
    start = TP_PRESETS.get(key, TP_PRESETS.get((key[0], "*"), (1, "")))[0]
    last_err = None
    t = start
    while t <= _MAX_TP:
        if tp_splits_heads(spec, t):
            try:
                return build(t)
            except InfeasibleError as err:
                last_err = err
        t *= 2
    raise InfeasibleError(
        f"{spec.name!r} fits on no power-of-two tp in [{start}, {_MAX_TP}] of "
        f"{dev.name!r} with pp={pp}; last attempt: {last_err}"
    )
