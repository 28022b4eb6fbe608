"""SGLang's start-up KV pool arithmetic, beside vLLM's (``hardware/memory_profile.py``).

SGLang (``ModelRunner.profile_max_num_token``; in later versions
``model_runner_kv_cache_mixin.py``) measures the device's free memory before it loads the
weights (``total_gpu_memory``, the minimum over the tensor-parallel ranks) and again after
(``available_gpu_memory``), then sizes the token pool as::

    rest = available - total * (1 - mem_fraction_static)       # GiB
    max_total_num_tokens = floor(rest * 2**30 / cell_size)
    cell_size = kv_heads_per_rank * head_dim * layers * 2 * kv_element_bytes

so the KV pool is ``mem_fraction_static`` of the free memory at start less the memory the
weights took. Its start-up log prints both measurements (``Load weight end. ... avail
mem=A GB, mem usage=W GB``: A is ``available``, A + W is ``total``; SGLang's "GB" is
GiB) and the result (``KV Cache is allocated. #tokens: N``).

:func:`sglang_kv_tokens` is that arithmetic on the two measurements (exact where a log
prints them); :func:`sglang_memory_profile` predicts them: the free memory at start is
the device's driver-reported memory less ``context_gib`` (the CUDA context and
allocator's reserve before the weights; default :data:`CONTEXT_GIB`), and the weights are
those vLLM's profile loads (:func:`hardware.vllm_memory_profile`'s ``weights_bytes``:
the same checkpoint tensors, vocabulary padded to 64). ``mem_fraction_static`` defaults
to SGLang 0.4's rule (:func:`default_mem_fraction_static`); later versions derive it from
the device's memory, so give it there. Paged pools (``--page-size`` > 1) round the
tokens down to whole pages. MLA, sliding-window and hybrid pools are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hardware import Device, LLMSpec, get_device, get_model, vllm_memory_profile

__all__ = ["CONTEXT_GIB", "SglangProfile", "default_mem_fraction_static",
           "sglang_kv_tokens", "sglang_memory_profile"]

GiB = 2 ** 30
# Free memory at start below the driver's total on an H100 80GB: 79.19 GiB (its
# torch-reported total, hardware/_device_presets.py) less the 78.59 GiB free before the
# weights in sgl-project/sglang PR #4760's log (avail 63.48 + usage 15.11 GiB). One
# reading, of one device: give --context-gib where you have your own.
CONTEXT_GIB = 0.60
# SGLang 0.4's default mem_fraction_static by tensor-parallel size (server_args.py,
# ServerArgs.__post_init__: >= 16: 0.79, >= 8: 0.81, >= 4: 0.85, >= 2: 0.87, else 0.88)
_FRACTION_BY_TP = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))
_KV_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2,
             "bfloat16": 2}


def default_mem_fraction_static(tp: int) -> float:
    """SGLang 0.4's default ``--mem-fraction-static`` for ``tp`` GPUs."""
    return next(f for n, f in _FRACTION_BY_TP if tp >= n)


def _cell_bytes(m: LLMSpec, tp: int, kv_cache_dtype: str) -> float:
    if kv_cache_dtype not in _KV_BYTES:
        raise ValueError(f"field 'kv_cache_dtype' {kv_cache_dtype!r}: one of "
                         f"{', '.join(_KV_BYTES)}")
    el = _KV_BYTES[kv_cache_dtype] or m.dtype_bytes
    heads = max(m.n_kv_heads // tp, 1)  # SGLang replicates KV heads when tp > heads
    return heads * m.head_dim * m.n_layers * 2 * el


def sglang_kv_tokens(m: LLMSpec, *, tp: int, mem_fraction_static: float,
                     total_gib: float, available_gib: float, page_size: int = 1,
                     kv_cache_dtype: str = "auto") -> int:
    """``max_total_num_tokens`` from the two free-memory readings (GiB) SGLang takes."""
    return _tokens(_pool_gib(mem_fraction_static, total_gib, available_gib),
                   _cell_bytes(m, tp, kv_cache_dtype), page_size)


def _tokens(pool_gib: float, cell_bytes: float, page_size: int) -> int:
    """Whole cells of the pool, rounded down to whole pages."""
    return math.floor(pool_gib * GiB / cell_bytes) // page_size * page_size


def _pool_gib(f: float, total_gib: float, available_gib: float) -> float:
    """The KV pool SGLang sizes (GiB): what is free after the weights less the share of
    the starting free memory that ``mem_fraction_static`` keeps out; ValueError when
    nothing is left (SGLang refuses to start)."""
    _check_fraction(f)
    rest = available_gib - total_gib * (1.0 - f)
    if rest <= 0:
        raise ValueError(f"field 'mem_fraction_static' {f:g}: leaves no KV pool (the "
                         f"weights take {total_gib - available_gib:.2f} of "
                         f"{total_gib:.2f} GiB; SGLang refuses: raise it)")
    return rest


def _check_fraction(f) -> None:
    if not isinstance(f, (int, float)) or not 0.0 < f < 1.0 or math.isnan(f):
        raise ValueError(f"field 'mem_fraction_static' must be in (0, 1), got {f!r}")


@dataclass(frozen=True)
class SglangProfile:
    model: str
    device: str
    tp: int
    mem_fraction_static: float
    total_gib: float        # free memory before the weights (predicted)
    weights_gib: float      # what the weights take per device
    available_gib: float    # free memory after them
    kv_pool_gib: float
    cell_bytes: float       # one token's K and V on one device
    max_total_num_tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def sglang_memory_profile(device, model, *, tp: int = 1,
                          mem_fraction_static: float | None = None,
                          kv_cache_dtype: str = "auto", quantization: str | None = None,
                          page_size: int = 1, context_gib: float = CONTEXT_GIB
                          ) -> SglangProfile:
    """SGLang's token pool for ``model`` on ``device`` at ``tp``, predicted (see the
    module doc). One ``ValueError`` naming the field for a bad argument."""
    dev = device if isinstance(device, Device) else get_device(device)
    m = model if isinstance(model, LLMSpec) else get_model(model)
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"field 'tp' must be a positive integer, got {tp!r}")
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"field 'page_size' must be a positive integer, got {page_size!r}")
    if not 0.0 <= context_gib < dev.driver_memory_bytes / GiB:
        raise ValueError(f"field 'context_gib' {context_gib!r}: must be >= 0 and below "
                         "the device's memory")
    f = default_mem_fraction_static(tp) if mem_fraction_static is None \
        else mem_fraction_static
    weights = vllm_memory_profile(dev, m, tp=tp, quantization=quantization,
                                  max_model_len=min(m.max_position, 4096),
                                  strict=False).weights_bytes / GiB
    total = dev.driver_memory_bytes / GiB - context_gib
    avail = total - weights
    if avail <= 0:
        raise ValueError(f"field 'model': its weights ({weights:.2f} GiB per device) do "
                         f"not fit the {total:.2f} GiB free on {dev.name} at tp={tp}")
    pool = _pool_gib(f, total, avail)
    cell = _cell_bytes(m, tp, kv_cache_dtype)
    n = _tokens(pool, cell, page_size)
    return SglangProfile(model=m.name, device=dev.name, tp=tp, mem_fraction_static=f,
                         total_gib=total, weights_gib=weights, available_gib=avail,
                         kv_pool_gib=pool, cell_bytes=cell, max_total_num_tokens=n)
