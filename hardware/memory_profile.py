"""vLLM's start-up memory profile of a deployment: what it reserves and what is left
for the KV cache, as vLLM itself computes it.

Two version lines (``version=``):

* ``"v1"``: the V1 engine, 0.8 to 0.19 (rules and defaults of v0.19.0, checked
  against its logs). ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``
  runs ``gpu_model_runner.profile_run`` under ``memory_profiling`` and gives the KV
  cache ``requested_memory - non_kv_cache_memory``, where requested = driver total x
  ``gpu_memory_utilization`` and non-KV = weights + torch peak increase + non-torch
  increase. ``vllm/v1/core/kv_cache_utils.py``: ``num_blocks = available //
  page_size // num_layers``, tokens = ``num_blocks * block_size``, concurrency =
  ``num_blocks / cdiv(max_model_len, block_size)``; with sliding-window layers
  beside full ones the hybrid allocator (0.9.1+) shares the blocks among groups of
  layers (:func:`v1_kv_pool`; the V0 line allocates them as full attention). CUDA graphs are captured after the
  KV cache is allocated and are outside the budget unless
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` (``estimate_cudagraphs=True``; off by
  default, as the v0.19 logs say). What changed inside the line: early V1 (0.8.x
  ``gpu_worker.py``) counted all non-torch memory on the device (CUDA context
  included, total - free - torch allocated) rather than the increase during
  profiling, and took the torch peak from zero (weights included); later releases
  use ``memory_profiling`` as modelled here. Batch defaults depend on the device
  (``vllm_defaults``: >= 70 GiB and not an A100, 8192 tokens / 1024 sequences for
  the server; the A100 exclusion cites PR #17885); releases before those defaults
  used 2048 / 256 everywhere, which ``max_num_batched_tokens`` / ``max_num_seqs``
  reproduce.
* ``"v0"``: the V0 engine, 0.6.4 to 0.8 (``vllm/worker/worker.py``
  ``determine_num_available_blocks`` with ``memory_profiling``): the same budget
  rule; ``num_gpu_blocks = available // (block_size * layers * 2 * kv_heads *
  head_dim * dtype)`` (``CacheEngine.get_cache_block_size``); concurrency =
  ``blocks * block_size / max_model_len``. 0.6.4 counted the CUDA context in
  ``non_torch_memory`` (0.35 GiB on an RTX 3090); 0.6.5+ counts only the increase.
  Versions before 0.6.4 (0.2-0.6.3: peak memory from ``torch.cuda.max_memory_
  allocated`` and free memory) are not modelled.

Weights: parameters x dtype bytes / (tp * pp) (vocabulary padded to a multiple of
64, ``vocab_parallel_embedding.py``) plus the rotary cos/sin cache
(``max_position_embeddings x head_dim`` in the model dtype, one per device:
Llama-3.1-8B's 131072 x 128 x 2 B = 32 MiB is why vLLM logs 14.99 GiB for its
14.96 GiB of parameters). ``quantization="fp8"`` stores the linear layers' weights
in one byte and keeps embeddings, LM head, norms and biases in the model dtype
(Llama-3.1-8B: 6.98e9 linear params x 1 B + 1.05e9 x 2 B + 32 MiB = 8.49 GiB, the
reported 8.49 GiB). GPTQ and AWQ checkpoints (``quantization="gptq-4bit-g128"``,
``"gptq-8bit-g128-act"``, ``"awq-4bit-g128"``: method, bits, ``group_size``, ``-act``
for GPTQ's ``desc_act``; :func:`weight_quantization`) are counted as vLLM's Marlin
kernels hold them after loading (``quantization/kernels/mixed_precision/marlin.py``
``process_weights_after_loading``, the default on compute capability >= 8.0): per
linear matrix of ``k`` inputs and ``n`` outputs (q/k/v and gate/up merged as vLLM
merges them; every expert's) the packed weights ``k*n*bits/8``, one model-dtype
scale per group and output ``groups*n*2`` (``groups = k/group_size``, 1 for
``group_size`` -1), AWQ's zero points repacked ``groups*n*bits/8`` (GPTQ's symmetric
ones are dropped), and with ``desc_act`` two int32 index vectors of ``k`` (``g_idx``
and its sort order); embeddings, LM head and norms stay in the model dtype. The
Marlin workspace (a few MiB per device) and the older exllama kernels (GPUs before
compute capability 8.0) are not modelled.

Activation peak (torch peak increase of the profiling run, per device) =
``max(forward, sampler)``:

* forward, at the MLP of a decoder layer of ``_dummy_run(max_num_batched_tokens)``:
  ``T * (3*h + 3*I/tp) * dtype`` for a gated MLP (the layer input still held by the
  model's loop, the residual, the normed attention output; gate_up ``2*I/tp`` and
  the SiluAndMul output ``I/tp`` before gate_up is freed). MoE: ``3*h + k*(3*I/tp +
  h)`` per token (fused_moe's intermediate caches for k experts per token); OPT:
  ``3*h + 2*I/tp``. T = ``max_num_batched_tokens``. Checked on V0 records 10/11
  (Llama-3.1-8B, T = 20000 / 29000): 2.06 / 2.99 GiB vs 2.07 / 2.99 reported.
* sampler, ``_dummy_sampler_run`` on ``R = min(max_num_seqs, T)`` rows (V0:
  ``max_num_seqs``), with the forward's ``[T, h]`` output still held: ``T*h*dtype +
  R*V*dtype`` (the logits) ``+ c * R*V*4`` (fp32 copies). V1 (``v1/sample/
  sampler.py`` ``logits.to(float32)``; ``ops/topk_topp_sampler.py`` native path:
  ``softmax(dtype=float32)``, then ``random_sample``'s exponential noise ``q``): c = 3,
  plus a workspace of :data:`V1_SAMPLER_WORKSPACE` bytes. V0 (``model_executor/
  layers/sampler.py`` ``_apply_top_k_top_p``: fp32 logits, sorted values, int64
  indices, masks, softmax, cumsum, scatter; then probs and logprobs): at least 7.5
  by the code, :data:`V0_SAMPLER_FP32_COPIES` = 9.29 measured (the sort's
  temporaries).

Non-torch memory (NCCL and custom all-reduce buffers, kernels loaded during the
run): constants from logs, :data:`V1_NON_TORCH` and :data:`V0_NON_TORCH`, each with
the log it came from. CUDA graphs: :data:`CUDA_GRAPH_BYTES`, reported, not budgeted.

Every constant taken from a log names it; none comes from a record of
``../shared/reference/vllm-memory-profiles.csv`` except where said so (the
experiment ``experiments/memory_check.py`` marks those records).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from hardware.placement import Deployment, InfeasibleError, tp_splits_heads
from hardware.devices import Device, get_device
from hardware.llm import LLMSpec, get_model

__all__ = [
    "ActivationCoefficients",
    "CUDA_GRAPH_BYTES",
    "KV_CACHE_DTYPES",
    "KvPool",
    "MemoryProfile",
    "V0_NON_TORCH",
    "V0_SAMPLER_FP32_COPIES",
    "V1_NON_TORCH",
    "V1_SAMPLER_WORKSPACE",
    "VERSION_LINES",
    "VllmRefusal",
    "WeightQuantization",
    "activation_coefficients",
    "activation_peak_bytes",
    "deployment_from_profile",
    "vllm_defaults",
    "v1_kv_pool",
    "vllm_memory_profile",
    "weight_quantization",
]

GiB = 2**30
VERSION_LINES = {
    "v1": "vLLM V1 engine, 0.8-0.19 (v0.19.0 rules and defaults)",
    "v0": "vLLM V0 engine, 0.6.4-0.8 (worker.py determine_num_available_blocks)",
}
USAGE_CONTEXTS = ("openai_server", "llm_class")  # `vllm serve` / offline `LLM(...)`
KV_CACHE_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
QUANTIZATIONS = (None, "fp8")  # plus the GPTQ / AWQ forms of weight_quantization
# Marlin's group sizes (quantization/utils/marlin_utils.py MARLIN_SUPPORTED_GROUP_SIZES)
# and bits: GPTQ uint4b8 / uint8b128, AWQ uint4 (query_marlin_supported_quant_types)
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)
INT_WEIGHT_BITS = {"gptq": (4, 8), "awq": (4,)}
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vllm/config/cache.py BlockSize
VOCAB_PADDING = 64  # vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE

# Non-torch increase during profiling, V1 (v0.19.0 on H100), by (tp >= 2, pp >= 2).
# From github.com/llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/
# accuracy_report.md, runs that are not records of the reference CSV: TP=1 0.25 GiB
# (Qwen3-8B, phi-4, gemma-2-9b: the 0.15 GiB constant is -40.00% off), TP=2 2.07 and
# TP=4 2.13 GiB (Llama-3.1-8B-Instruct), PP=2/4 0.07 GiB (Llama-3.1-8B-Instruct).
V1_NON_TORCH = {"tp1": 0.25 * GiB, "tp2": 2.07 * GiB, "tp4+": 2.13 * GiB,
                "pp": 0.07 * GiB}
# V0 (0.6.5+): 0.16 GiB, github.com/vllm-project/vllm/pull/12126 (youkaichao's log,
# H100, TP=1, 'non_torch_memory takes 0.16GiB'). A V0 0.8 TP=2 A100-80GB log of
# Qwen2.5-Coder-7B shows 0.11 GiB: V0 creates its NCCL buffers before the baseline
# snapshot, so TP adds little here. 0.6.4 counted the CUDA context too (~0.35 GiB).
V0_NON_TORCH = 0.16 * GiB
# Sampler workspace beyond the fp32 copies, V1: 0.117 GiB, the mean residual of three
# v0.19.0 logs that are not CSV records (Qwen3-8B 2.21 GiB, granite-3.1-8b 0.85,
# phi-4 1.52 GiB activation, from the accuracy report's errors against its
# constants) after T*h*2 + 3.5 R*V*4; one Triton top-k/top-p buffer of
# SMs x vocab fp32 (ops/topk_topp_triton.py) is ~0.06 GiB of it.
V1_SAMPLER_WORKSPACE = 0.117 * GiB
# V0 fp32 copies of the [R, V] logits at the sampler's peak: 9.29, from the V0 log in
# github.com/vllm-project/vllm/pull/10511 (Meta-Llama-3-8B on H100, defaults,
# 'PyTorch activation peak memory 1.26GiB' = 8192*4096*2 + 256*128256*(2 + 4c)).
V0_SAMPLER_FP32_COPIES = 9.29
# CUDA graph pool, outside the KV budget (reported only). V1: 1.03 GiB, the mean of
# 50 v0.19.0 runs on H100 (0.51-1.85; llm-d-planner accuracy report). V0: 1.12 GiB,
# the vLLM 0.8.2 A100-80GB log of hardware/_device_presets.py (43 capture sizes).
CUDA_GRAPH_BYTES = {"v1": 1.03 * GiB, "v0": 1.12 * GiB}


class VllmRefusal(InfeasibleError):
    """vLLM would refuse to start this deployment; ``field`` names the setting."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class MemoryProfile:
    """One device's start-up memory under vLLM; bytes, with ``*_gib`` views."""

    version: str
    device: Device
    model: LLMSpec
    tp: int
    pp: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    kv_cache_dtype: str
    quantization: str | None
    enforce_eager: bool
    enable_chunked_prefill: bool
    total_bytes: float  # driver-reported device memory
    weights_bytes: float
    forward_peak_bytes: float
    sampler_peak_bytes: float
    non_torch_bytes: float
    cuda_graph_bytes: float  # captured after the KV cache (outside it by default)
    kv_cache_bytes: float  # what vLLM prints as available KV cache memory
    kv_bytes_per_token: float  # this device's K+V of one token (its layers)
    kv_cache_blocks: int
    kv_cache_tokens: int
    max_concurrency: float  # requests of max_model_len tokens that fit at once
    refusal: tuple[str, str] | None = None  # (field, vLLM's message) or None
    notes: tuple[str, ...] = ()

    @property
    def requested_bytes(self) -> float:
        return self.total_bytes * self.gpu_memory_utilization

    @property
    def activation_bytes(self) -> float:
        return max(self.forward_peak_bytes, self.sampler_peak_bytes)

    @property
    def non_kv_bytes(self) -> float:
        return self.weights_bytes + self.activation_bytes + self.non_torch_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / GiB

    @property
    def activation_gib(self) -> float:
        return self.activation_bytes / GiB

    @property
    def non_torch_gib(self) -> float:
        return self.non_torch_bytes / GiB

    @property
    def cuda_graph_gib(self) -> float:
        return self.cuda_graph_bytes / GiB

    @property
    def kv_cache_gib(self) -> float:
        return self.kv_cache_bytes / GiB

    def as_dict(self) -> dict:
        """Plain JSON values: settings, every component in GiB and bytes, notes."""
        parts = ("total", "requested", "weights", "activation", "forward_peak",
                 "sampler_peak", "non_torch", "non_kv", "cuda_graph", "kv_cache")
        d = {"vllm_version_line": self.version,
             "version_line": VERSION_LINES[self.version],
             "device": self.device.name, "model": self.model.name,
             "tp": self.tp, "pp": self.pp,
             "gpu_memory_utilization": self.gpu_memory_utilization,
             "max_model_len": self.max_model_len,
             "max_num_batched_tokens": self.max_num_batched_tokens,
             "max_num_seqs": self.max_num_seqs, "block_size": self.block_size,
             "kv_cache_dtype": self.kv_cache_dtype, "quantization": self.quantization,
             "enforce_eager": self.enforce_eager,
             "enable_chunked_prefill": self.enable_chunked_prefill}
        for p in parts:
            d[f"{p}_gib"] = round(getattr(self, p + "_bytes") / GiB, 4)
        for p in parts:
            d[f"{p}_bytes"] = int(getattr(self, p + "_bytes"))
        d.update(kv_bytes_per_token=int(self.kv_bytes_per_token),
                 kv_cache_blocks=self.kv_cache_blocks,
                 kv_cache_tokens=self.kv_cache_tokens,
                 max_concurrency=round(self.max_concurrency, 4),
                 refused=self.refusal is not None,
                 refusal=None if self.refusal is None else
                 {"field": self.refusal[0], "message": self.refusal[1]},
                 notes=list(self.notes))
        d["total_gpu_memory_gib"] = d["total_gib"]
        return d


def vllm_defaults(device: Device, version: str = "v1",
                  usage_context: str = "openai_server") -> dict:
    """vLLM's default ``max_num_batched_tokens`` / ``max_num_seqs`` (chunked prefill
    on) for ``device``: V1 ``vllm/engine/arg_utils.py`` (since PR #17885): >= 70 GiB
    and not an A100: 8192 / 1024 for the server, 16384 / 1024 offline; otherwise
    2048 / 256 (server), 8192 / 256 (offline). V0: 256 sequences; with chunked
    prefill 2048 tokens (SchedulerConfig's default in 0.6.x-0.8; 0.5.x used 512)."""
    if version == "v0":
        return {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    big = device.driver_memory_bytes >= 70 * GiB and "a100" not in device.name.lower()
    tokens = {("openai_server", True): 8192, ("llm_class", True): 16384,
              ("openai_server", False): 2048, ("llm_class", False): 8192}
    return {"max_num_batched_tokens": tokens[usage_context, big],
            "max_num_seqs": 1024 if big else 256}


def _check_int(field, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"field {field!r} must be an integer >= {lo}, got {v!r}")


def _linear_params(m: LLMSpec) -> int:
    """Weights of the matmuls fp8 quantizes (attention and MLP projections)."""
    return m.n_layers * sum(k * n * c for k, n, c in _linear_shapes(m))


class WeightQuantization(NamedTuple):
    """A GPTQ or AWQ checkpoint's integer weights: ``group`` -1 is one group per
    column (per-channel scales); ``act_order`` is GPTQ's ``desc_act``."""

    method: str
    bits: int
    group: int
    act_order: bool

    def __str__(self) -> str:
        return (f"{self.method}-{self.bits}bit-g{self.group}"
                + ("-act" if self.act_order else ""))


_INT_QUANT = re.compile(r"(gptq|awq)-(\d+)bit-g(-1|\d+)(-act)?")


def weight_quantization(quantization) -> WeightQuantization | None:
    """The integer scheme a ``quantization`` value names (None for ``None`` and
    ``"fp8"``); ValueError naming the field for anything else."""
    if quantization is None or quantization == "fp8":
        return None
    m = _INT_QUANT.fullmatch(quantization) if isinstance(quantization, str) else None
    if m is None:
        raise ValueError("field 'quantization' must be None, 'fp8' or "
                         "'<gptq|awq>-<bits>bit-g<group_size>[-act]' (e.g. "
                         f"'awq-4bit-g128'), got {quantization!r}")
    method, bits, group, act = m[1], int(m[2]), int(m[3]), bool(m[4])
    if bits not in INT_WEIGHT_BITS[method]:
        raise ValueError(f"field 'quantization' {quantization!r}: {method} weights of "
                         f"{bits} bits are not run by vLLM's Marlin kernels (bits: "
                         f"{INT_WEIGHT_BITS[method]})")
    if group not in MARLIN_GROUP_SIZES:
        raise ValueError(f"field 'quantization' {quantization!r}: group_size {group} "
                         f"is not one of Marlin's {MARLIN_GROUP_SIZES}")
    if act and method != "gptq":
        raise ValueError(f"field 'quantization' {quantization!r}: act order (desc_act) "
                         "is a GPTQ option")
    return WeightQuantization(method, bits, group, act)


def _linear_shapes(m: LLMSpec) -> list[tuple[int, int, int]]:
    """``(inputs, outputs, count)`` of one layer's matmuls as vLLM holds them: merged
    q/k/v, the output projection, merged gate/up (fc1 for OPT) and down, per expert."""
    h, q, kv = m.hidden_size, m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    e = max(m.n_experts, 1)
    up = 2 * m.intermediate_size if m.gated_mlp else m.intermediate_size
    return [(h, q + 2 * kv, 1), (q, h, 1), (h, up, e), (m.intermediate_size, h, e)]


def _int_weight_bytes(m: LLMSpec, q: WeightQuantization) -> float:
    """Bytes of the linear layers' integer weights, scales, zero points and act-order
    indices (module docstring), all layers."""
    total = 0.0
    for k, n, count in _linear_shapes(m):
        groups = 1 if q.group == -1 else math.ceil(k / q.group)
        b = k * n * q.bits / 8 + groups * n * m.dtype_bytes
        if q.method == "awq":
            b += groups * n * q.bits / 8
        if q.act_order:
            b += 2 * 4 * k
        total += count * b
    return m.n_layers * total


def _weights(m: LLMSpec, tp: int, pp: int, quantization) -> float:
    padded = math.ceil(m.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    pad = (padded - m.vocab_size) * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    q = weight_quantization(quantization)
    if quantization == "fp8":
        lin = _linear_params(m)
        params_bytes = lin * 1 + (m.n_params - lin + pad) * m.dtype_bytes
    elif q is not None:
        lin = _linear_params(m)
        params_bytes = _int_weight_bytes(m, q) + (m.n_params - lin + pad) * m.dtype_bytes
    else:
        params_bytes = (m.n_params + pad) * m.dtype_bytes
    rope_cache = m.max_position * m.head_dim * m.dtype_bytes
    return params_bytes / (tp * pp) + rope_cache


def _forward_peak(m: LLMSpec, tp: int, tokens: int) -> float:
    h, inter = m.hidden_size, m.intermediate_size / tp
    if m.n_experts:
        k = m.n_experts_per_token
        per_token = 3 * h + k * (3 * inter + h)
    else:
        per_token = 3 * h + (3 if m.gated_mlp else 2) * inter
    return tokens * per_token * m.dtype_bytes


def _sampler_peak(m: LLMSpec, version: str, tokens: int, rows: int) -> float:
    padded = math.ceil(m.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    held = tokens * m.hidden_size * m.dtype_bytes + rows * padded * m.dtype_bytes
    fp32 = rows * m.vocab_size * 4.0
    if version == "v1":
        return held + 3 * fp32 + V1_SAMPLER_WORKSPACE
    return held + V0_SAMPLER_FP32_COPIES * fp32


def activation_peak_bytes(model: LLMSpec, *, tp: int = 1,
                          max_num_batched_tokens: int, max_num_seqs: int,
                          version: str = "v1") -> dict:
    """The profiling run's torch peak per device (module docstring): ``forward`` at
    ``max_num_batched_tokens`` tokens, ``sampler`` on its rows, and their max,
    ``peak``, in bytes. For other models of memory (e.g. an elastic pool) that need
    vLLM's activation reserve without the rest of the profile."""
    rows = min(max_num_seqs, max_num_batched_tokens) if version == "v1" \
        else max_num_seqs
    forward = _forward_peak(model, tp, max_num_batched_tokens)
    sampler = _sampler_peak(model, version, max_num_batched_tokens, rows)
    return {"forward": forward, "sampler": sampler, "peak": max(forward, sampler)}


class ActivationCoefficients(NamedTuple):
    """vLLM's live activation bytes per device of a forward over ``T`` tokens sampling
    ``R`` rows: ``max(forward * T, held * T + per_row * R + fixed)`` (the two terms of
    :func:`activation_peak_bytes`, linear in ``T`` and ``R``)."""

    forward: float   # bytes per token: the MLP's live tensors (3 h + 3 I / tp) * dtype
    held: float      # bytes per token: hidden states held through the sampler
    per_row: float   # bytes per sampled row: logits and vLLM's fp32 copies of them
    fixed: float     # bytes: the sampler's fixed workspace (V1), 0 for V0


def activation_coefficients(model: LLMSpec, *, tp: int = 1,
                            version: str = "v0") -> ActivationCoefficients:
    """The coefficients of :func:`activation_peak_bytes` (same sources), so that an
    iteration's activation demand can be evaluated for any token and row count: the
    elastic family's per-iteration demand (eLLM section 3) and vLLM's reservation at
    ``(max_num_batched_tokens, max_num_seqs)`` are the same formula."""
    if version not in ("v0", "v1"):
        raise ValueError(f"field 'version' must be 'v0' or 'v1', got {version!r}")
    forward = _forward_peak(model, tp, 1)
    padded = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    held = model.hidden_size * model.dtype_bytes
    fp32 = model.vocab_size * 4.0
    if version == "v1":
        return ActivationCoefficients(forward, held, padded * model.dtype_bytes
                                      + 3 * fp32, V1_SAMPLER_WORKSPACE)
    return ActivationCoefficients(forward, held, padded * model.dtype_bytes
                                  + V0_SAMPLER_FP32_COPIES * fp32, 0.0)


def _non_torch(version: str, tp: int, pp: int) -> float:
    if version == "v0":
        return V0_NON_TORCH
    if tp >= 4:
        return V1_NON_TORCH["tp4+"]
    if tp >= 2:
        return V1_NON_TORCH["tp2"]
    return V1_NON_TORCH["pp"] if pp >= 2 else V1_NON_TORCH["tp1"]


def vllm_memory_profile(
    device,
    model,
    *,
    tp: int = 1,
    pp: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    quantization: str | None = None,
    enforce_eager: bool = False,
    enable_chunked_prefill: bool | None = None,
    version: str = "v1",
    usage_context: str = "openai_server",
    estimate_cudagraphs: bool = False,
    strict: bool = True,
) -> MemoryProfile:
    """The memory profile vLLM computes at start-up for ``model`` on ``device``.

    Arguments carry vLLM's names; ``None`` takes vLLM's default for the version line
    (``max_model_len``: the model's ``max_position_embeddings``; chunked prefill: on
    in V1, off in V0 except the server with ``max_model_len`` > 32768; batch limits:
    :func:`vllm_defaults`, and without chunked prefill ``max_num_batched_tokens =
    max(max_model_len, default)``). A bad argument raises ValueError naming the
    field; a deployment vLLM would refuse raises :class:`VllmRefusal` (its ``field``
    and vLLM's message), or with ``strict=False`` comes back with ``refusal`` set.
    """
    dev = device if isinstance(device, Device) else get_device(device)
    m = model if isinstance(model, LLMSpec) else get_model(model)
    if version not in VERSION_LINES:
        raise ValueError(f"field 'version' must be one of {sorted(VERSION_LINES)}, "
                         f"got {version!r}")
    if usage_context not in USAGE_CONTEXTS:
        raise ValueError(f"field 'usage_context' must be one of {USAGE_CONTEXTS}, "
                         f"got {usage_context!r}")
    _check_int("tp", tp)
    _check_int("pp", pp)
    u = gpu_memory_utilization
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
        raise ValueError("field 'gpu_memory_utilization' must be in (0, 1], got "
                         f"{u!r}")
    if block_size not in BLOCK_SIZES or isinstance(block_size, bool):
        raise ValueError(f"field 'block_size' must be one of {BLOCK_SIZES}, got "
                         f"{block_size!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"field 'kv_cache_dtype' must be one of "
                         f"{sorted(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    weight_quantization(quantization)  # None, fp8 or a GPTQ / AWQ form; else ValueError
    for name, flag in (("enforce_eager", enforce_eager),
                       ("estimate_cudagraphs", estimate_cudagraphs)):
        if not isinstance(flag, bool):
            raise ValueError(f"field {name!r} must be a bool, got {flag!r}")
    if enable_chunked_prefill is not None and not isinstance(enable_chunked_prefill,
                                                             bool):
        raise ValueError("field 'enable_chunked_prefill' must be a bool or None, got "
                         f"{enable_chunked_prefill!r}")
    if max_model_len is None:
        max_model_len = m.max_position
    _check_int("max_model_len", max_model_len)
    for name, v in (("max_num_batched_tokens", max_num_batched_tokens),
                    ("max_num_seqs", max_num_seqs)):
        if v is not None:
            _check_int(name, v)
    # vLLM refuses these while building its config (vllm/config/model.py,
    # parallel.py, scheduler.py), before any memory is touched.
    if max_model_len > m.max_position:
        raise VllmRefusal("max_model_len", (
            f"User-specified max_model_len ({max_model_len}) is greater than the "
            f"derived max_model_len (max_position_embeddings={m.max_position} in "
            f"{m.name}'s config.json)"))
    if not tp_splits_heads(m, tp):
        raise VllmRefusal("tp", (
            f"Total number of attention heads ({m.n_heads}) must be divisible by "
            f"tensor parallel size ({tp}) (and KV heads {m.n_kv_heads} divisible by "
            "it, or it by them)"))
    if pp > m.n_layers:
        raise VllmRefusal("pp", f"pipeline parallel size {pp} exceeds the model's "
                                f"{m.n_layers} layers")

    notes = []
    chunked = enable_chunked_prefill
    if chunked is None:
        chunked = version == "v1" or (usage_context == "openai_server"
                                      and max_model_len > 32768)
    defaults = vllm_defaults(dev, version, usage_context)
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = defaults["max_num_batched_tokens"]
        if not chunked:
            tokens = max(max_model_len, tokens if version == "v1" else 2048)
    seqs = max_num_seqs
    if seqs is None:
        seqs = min(defaults["max_num_seqs"], tokens)
    elif tokens < seqs:
        raise VllmRefusal("max_num_batched_tokens", (
            f"max_num_batched_tokens ({tokens}) must be greater than or equal to "
            f"max_num_seqs ({seqs})"))
    if not chunked and tokens < max_model_len:
        raise VllmRefusal("max_num_batched_tokens", (
            f"max_num_batched_tokens ({tokens}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length "
            "to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
            "increase max_num_batched_tokens or decrease max_model_len (or enable "
            "chunked prefill)"))

    weights = _weights(m, tp, pp, quantization)
    act = activation_peak_bytes(m, tp=tp, max_num_batched_tokens=tokens,
                                max_num_seqs=seqs, version=version)
    forward, sampler = act["forward"], act["sampler"]
    non_torch = _non_torch(version, tp, pp)
    graphs = 0.0 if enforce_eager else CUDA_GRAPH_BYTES[version]
    total = float(dev.driver_memory_bytes)
    available = total * u - (weights + max(forward, sampler) + non_torch)
    if estimate_cudagraphs:
        if version != "v1":
            raise ValueError("field 'estimate_cudagraphs' exists in the V1 line only")
        available -= graphs
        notes.append("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1: the CUDA graph "
                     "estimate is taken out of the KV budget")
    kv_dtype = KV_CACHE_DTYPES[kv_cache_dtype] or m.dtype_bytes
    kv_heads = max(m.n_kv_heads // tp, 1)
    layers = math.ceil(m.n_layers / pp)
    page = block_size * 2 * kv_heads * m.head_dim * kv_dtype  # one layer's block
    if m.sliding_layers and pp > 1:
        raise ValueError("field 'pp': pipeline stages of a model with sliding-window "
                         "layers are not modelled")
    if version == "v1":
        pool = v1_kv_pool(max(available, 0.0), page, m.n_layers - m.sliding_layers
                          if pp == 1 else layers, m.sliding_layers, m.sliding_window,
                          block_size, max_model_len, tokens)
        blocks, kv_tokens, concurrency = pool.blocks, pool.tokens, pool.concurrency
        short = blocks < pool.request_blocks
        if m.sliding_layers:
            notes.append(
                f"sliding window {m.sliding_window} on {m.sliding_layers} of "
                f"{m.n_layers} layers: {pool.groups} KV cache group(s) of {pool.group} "
                f"layers share {blocks:,} blocks; a request of max_model_len holds "
                f"{pool.request_blocks:,} of them (vLLM >= 0.9.1's hybrid allocator). "
                "The simulators charge each token as in full attention: exact up to "
                "the window, more than vLLM holds beyond it")
    else:
        blocks = 0 if available <= 0 else int(available // (page * layers))
        kv_tokens = blocks * block_size
        concurrency = kv_tokens / max_model_len
        short = kv_tokens < max_model_len
        if m.sliding_layers:
            notes.append("V0 allocates sliding-window layers as full attention")

    refusal = None
    if blocks <= 0:
        refusal = ("gpu_memory_utilization", (
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine. (weights "
            f"{weights / GiB:.2f} GiB + activations {max(forward, sampler) / GiB:.2f}"
            f" GiB + non-torch {non_torch / GiB:.2f} GiB exceed {total / GiB:.2f} GiB "
            f"x {u})"))
    elif short:
        if version == "v0":
            msg = (f"The model's max seq len ({max_model_len}) is larger than the "
                   "maximum number of tokens that can be stored in KV cache "
                   f"({kv_tokens}). Try increasing `gpu_memory_utilization` or "
                   "decreasing `max_model_len` when initializing the engine.")
        else:
            need = pool.request_blocks * page * pool.group
            msg = (f"To serve at least one request with the models's max seq len "
                   f"({max_model_len}), ({need / GiB:.2f} GiB KV cache is needed, "
                   "which is larger than the available KV cache memory "
                   f"({available / GiB:.2f} GiB). Based on the available memory, the "
                   f"estimated maximum model length is {kv_tokens}. Try increasing "
                   "`gpu_memory_utilization` or decreasing `max_model_len` when "
                   "initializing the engine.")
        refusal = ("max_model_len", msg)
    if m.n_experts:
        notes.append("MoE: every expert's weights are resident; the forward peak "
                     "uses fused_moe's caches for the experts of each token (an "
                     "estimate, not checked against a log)")
    if pp > 1:
        notes.append(f"pp={pp}: weights split evenly, KV for ceil(layers/pp)="
                     f"{layers} layers; every stage charged the sampler peak")
    if not enforce_eager and not estimate_cudagraphs:
        notes.append(f"CUDA graphs (~{graphs / GiB:.2f} GiB) are captured after the "
                     "KV cache is allocated: the process uses that much beyond "
                     "gpu_memory_utilization")
    profile = MemoryProfile(
        version=version, device=dev, model=m, tp=tp, pp=pp,
        gpu_memory_utilization=float(u), max_model_len=max_model_len,
        max_num_batched_tokens=tokens, max_num_seqs=seqs, block_size=block_size,
        kv_cache_dtype=kv_cache_dtype, quantization=quantization,
        enforce_eager=enforce_eager, enable_chunked_prefill=chunked,
        total_bytes=total, weights_bytes=weights, forward_peak_bytes=forward,
        sampler_peak_bytes=sampler, non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs, kv_cache_bytes=available,
        kv_bytes_per_token=page / block_size * layers, kv_cache_blocks=blocks,
        kv_cache_tokens=kv_tokens, max_concurrency=concurrency, refusal=refusal,
        notes=tuple(notes))
    if strict and refusal is not None:
        raise VllmRefusal(*refusal)
    return profile


class KvPool(NamedTuple):
    """vLLM V1's KV cache pool: ``blocks`` shared by ``groups`` KV cache groups of
    ``group`` layers each; ``tokens`` is what it logs as the GPU KV cache size;
    ``request_blocks`` the blocks one request of ``max_model_len`` holds."""

    blocks: int
    tokens: int
    concurrency: float
    request_blocks: int
    group: int
    groups: int


def v1_kv_pool(available: float, page: float, full_layers: int, sliding_layers: int,
               window: int | None, block_size: int, max_model_len: int,
               max_num_batched_tokens: int) -> KvPool:
    """The V1 block arithmetic of v0.19.0 (``vllm/v1/core/kv_cache_utils.py``
    ``get_kv_cache_config_from_groups``, ``_get_kv_cache_groups_uniform_page_size``,
    ``_report_kv_cache_config``, ``get_max_concurrency_for_kv_cache_config``;
    ``v1/kv_cache_interface.py`` ``max_memory_usage_bytes``), ``page`` one layer's
    block in bytes. One kind of layer: one group of all of them. Full and sliding
    layers (the hybrid allocator, vLLM >= 0.9.1, PR #17996): groups of ``g = min(L_f,
    L_s)`` layers (``max`` when it is under 1.5x the min, 0.18+), the last of each kind
    padded; ``blocks = available // page // g``, logged tokens ``blocks // groups *
    block_size``. A request holds ``cdiv(max_model_len, bs)`` blocks per full group and
    ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), bs) + 1`` per
    sliding group; concurrency = blocks / that."""
    full = math.ceil(max_model_len / block_size)
    swa = 0 if not sliding_layers else math.ceil(
        min(window - 1 + max_num_batched_tokens, max_model_len) / block_size) + 1
    if sliding_layers and full_layers:
        lo, hi = sorted((full_layers, sliding_layers))
        g = hi if hi < 1.5 * lo else lo
        n_full, n_swa = math.ceil(full_layers / g), math.ceil(sliding_layers / g)
    else:
        g = full_layers + sliding_layers
        n_full, n_swa = (0, 1) if sliding_layers else (1, 0)
    groups = n_full + n_swa
    blocks = int(available // page // g) if available > 0 else 0
    need = n_full * full + n_swa * swa
    return KvPool(blocks, blocks // groups * block_size, blocks / need, need, g, groups)


def deployment_from_profile(profile: MemoryProfile,
                            n_devices: int | None = None) -> Deployment:
    """A :class:`~hardware.placement.Deployment` whose KV capacity is the profile's
    ``kv_cache_tokens`` (and whose weights and KV bytes per token are the profile's,
    so fp8 weights or KV read less per step). Raises :class:`VllmRefusal` for a
    profile vLLM refuses."""
    if profile.refusal is not None:
        raise VllmRefusal(*profile.refusal)
    return Deployment(
        device=profile.device, model=profile.model,
        n_devices=n_devices or profile.tp * profile.pp, tp=profile.tp, pp=profile.pp,
        mem_util=profile.gpu_memory_utilization,
        activation_bytes_per_device=float(profile.activation_bytes
                                          + profile.non_torch_bytes),
        profile=profile)
