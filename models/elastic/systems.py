"""The elastic family's systems, registered by name: ``ellm``, ``vllm``, ``vllm-cp``."""

from __future__ import annotations

from models.registry import ParamSpec, SystemSpec, register_system

__all__ = ["ELLM", "VLLM", "VLLM_CP"]

ELLM_SRC = (
    "eLLM (shared/seeds/ellm.txt): Algorithm 2 buffer factor a = 2 and a violation "
    "event = 3 SLO misses within 5 iterations (section 4.4.2); theta and the CPU buffer "
    "size are not published (our choices: theta = 0.01 of the pool, vLLM's 1% "
    "watermark; 64 GiB of the testbed's 1 TB host memory).")

VLLM = register_system(SystemSpec(
    name="vllm", family="elastic",
    doc="vLLM v0 (the eLLM paper's baseline, v0.5.5): paged KV in the memory left after "
        "a static activation reservation for max_num_batched_tokens; prefill-first "
        "scheduling; recompute preemption.",
    params=(), defaults=lambda max_len, hw=None: {}, baselines=("vllm",),
    sources=("eLLM section 6.1 baselines; vLLM v0 worker.determine_num_available_blocks",)))

VLLM_CP = register_system(SystemSpec(
    name="vllm-cp", family="elastic",
    doc="vLLM v0 with chunked prefill (the eLLM paper's vLLM-CP): decodes first, prompts "
        "in chunks filling a token budget of `chunk`, which is also the activation "
        "reservation.",
    params=(ParamSpec("chunk", "integer", "tokens",
                      "chunked-prefill token budget per iteration (max_num_batched_tokens)",
                      tunable=False),),
    defaults=lambda max_len, hw=None: {"chunk": 512.0}, baselines=("vllm",),
    sources=("eLLM section 6.1: vLLM-CP segments prefills into 512-token chunks",)))

ELLM = register_system(SystemSpec(
    name="ellm", family="elastic",
    doc="eLLM: one pool of 2 MiB chunks shared by KV and activations (inflation/"
        "deflation), KV offload to a CPU buffer at prefill under pressure and fetch "
        "before decode (Algorithm 1), an SLO-aware logical buffer (Algorithm 2).",
    params=(
        ParamSpec("a", "interval", "1", "logical-buffer scaling factor (Algorithm 2)",
                  1.05, 8.0),
        ParamSpec("theta", "interval", "share of the pool",
                  "free memory Algorithm 1 keeps when admitting or fetching", 0.0, 0.2),
        ParamSpec("cpu_buffer_gib", "log_positive", "GiB",
                  "host memory the logical buffer may grow to (B_max)"),
        ParamSpec("k", "interval", "misses", "SLO misses within the window that make a "
                  "violation event (count >= k)", 1.0, 16.0),
        ParamSpec("w", "interval", "iterations", "violation window (lags 0 <= j < w)",
                  1.0, 16.0),
    ),
    defaults=lambda max_len, hw=None: {"a": 2.0, "theta": 0.01, "cpu_buffer_gib": 64.0,
                                       "k": 3.0, "w": 5.0},
    baselines=("vllm", "vllm-cp"), sources=(ELLM_SRC,)))
