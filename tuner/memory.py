"""vLLM's start-up memory profile of a deployment:
``python -m tuner.memory --hardware H --model M --tp N [...] [--json]``.

Prints the driver-reported memory, the budget, weights, the profiling run's
activation peak, non-torch memory, CUDA graphs, the KV cache in GiB, blocks and
tokens, and the concurrency at ``--max-model-len``, as vLLM computes them for the
version line ``--vllm-version`` (``v1``: V1 engine 0.8-0.19; ``v0``: V0 0.6.4-0.8;
rules and sources in ``hardware/memory_profile.py``). Flags carry vLLM's names; an
omitted one takes vLLM's default. ``--model`` takes a preset name, a Hugging Face
id (``Qwen/Qwen3-8B``) or a path to a model's ``config.json`` or the folder holding it
(:mod:`tuner.scenario.model_config`: the fields it reads; its ``quantization_config``
sets ``--quantization`` unless the flag is given). ``--hardware`` takes a device preset,
a device file (one device's numbers, :func:`hardware.load_devices`) or a profile. ``--engine sglang`` prints
SGLang's token pool instead (:mod:`tuner.scenario.sglang_memory`).
A deployment vLLM would refuse to start (weights and
non-KV memory over the budget, KV cache smaller than one ``--max-model-len``
request, a length above the model's context, ``--tp`` not dividing the heads,
``--max-num-batched-tokens`` below ``--max-model-len`` without chunked prefill,
unknown names) prints one ``error: FIELD: ...`` line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from hardware import list_devices, list_models, vllm_memory_profile
from tuner.scenario.build import resolve_hardware
from tuner.scenario.model_config import is_config_path, model_from_config

__all__ = ["main", "render"]


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one ``error: ...`` line and exit status 2."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _bool(text: str) -> bool:
    t = text.lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def render(profile) -> str:
    """A person's table of a :class:`hardware.memory_profile.MemoryProfile`."""
    p = profile
    d = p.as_dict()
    head = (f"{p.model.name} on {p.device.name}, tp={p.tp} pp={p.pp} "
            f"({d['version_line']})")
    settings = (f"gpu_memory_utilization {p.gpu_memory_utilization:g}, max_model_len "
                f"{p.max_model_len:,}, max_num_batched_tokens "
                f"{p.max_num_batched_tokens:,}, max_num_seqs {p.max_num_seqs:,}, "
                f"block_size {p.block_size}, kv_cache_dtype {p.kv_cache_dtype}, "
                f"quantization {p.quantization or 'none'}, chunked prefill "
                f"{'on' if p.enable_chunked_prefill else 'off'}, "
                f"{'eager' if p.enforce_eager else 'CUDA graphs'}")
    rows = [
        ("total device memory (driver)", d["total_gib"]),
        (f"  x gpu_memory_utilization {p.gpu_memory_utilization:g}",
         d["requested_gib"]),
        ("weights", d["weights_gib"]),
        ("activation peak (profiling run)", d["activation_gib"]),
        ("  forward at max_num_batched_tokens", d["forward_peak_gib"]),
        ("  sampler at max_num_seqs rows", d["sampler_peak_gib"]),
        ("non-torch memory", d["non_torch_gib"]),
        ("KV cache", d["kv_cache_gib"]),
        ("CUDA graphs (outside the budget)", d["cuda_graph_gib"]),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [head, "  " + settings, ""]
    lines += [f"  {name:<{width}}  {gib:9.2f} GiB" for name, gib in rows]
    lines += ["", f"  KV cache: {p.kv_cache_blocks:,} blocks of {p.block_size} = "
              f"{p.kv_cache_tokens:,} tokens ({d['kv_bytes_per_token']:,} bytes per "
              f"token per device); maximum concurrency at {p.max_model_len:,} tokens "
              f"per request: {p.max_concurrency:.2f}x"]
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines) + "\n"


# the flags only one engine's profile reads (``_sglang`` reads tp, kv_cache_dtype,
# quantization and these three; vLLM's profile the others)
SGLANG_ONLY = ("mem_fraction_static", "page_size", "context_gib")
VLLM_ONLY = ("pp", "gpu_memory_utilization", "max_model_len", "max_num_batched_tokens",
             "max_num_seqs", "block_size", "enforce_eager", "enable_chunked_prefill",
             "vllm_version", "usage_context")


def _unread_flags(ap, argv, engine: str) -> list[str]:
    """The flags given on the command line that ``engine``'s profile would ignore (an
    error, not a silent default)."""
    from tuner.common.argv import given_dests

    other = VLLM_ONLY if engine == "sglang" else SGLANG_ONLY
    return [opt for dest, opt in given_dests(ap, argv).items() if dest in other]


def main(argv=None) -> int:
    ap = _Parser(prog="python -m tuner.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--hardware", required=True,
                    help=f"device preset ({', '.join(list_devices())}), a device "
                         "file (.json / .toml, hardware.load_devices) or a device "
                         "profile from tuner.calibrate")
    ap.add_argument("--model", required=True,
                    help="model preset, Hugging Face id "
                         f"({', '.join(list_models())}), or a path to a "
                         "config.json or its folder")
    ap.add_argument("--tp", "--tensor-parallel-size", type=int, default=1, dest="tp")
    ap.add_argument("--pp", "--pipeline-parallel-size", type=int, default=1, dest="pp")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="default: the model's max_position_embeddings")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-cache-dtype", default="auto",
                    help="auto (the model dtype), fp8, fp8_e4m3 or fp8_e5m2")
    ap.add_argument("--quantization", default=None,
                    help="weights: fp8, a GPTQ / AWQ form such as awq-4bit-g128 or "
                         "gptq-4bit-g128-act (hardware.memory_profile."
                         "weight_quantization), or none")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--enable-chunked-prefill", type=_bool, default=None,
                    metavar="{true,false}")
    ap.add_argument("--vllm-version", choices=("v1", "v0"), default="v1")
    ap.add_argument("--usage-context", choices=("openai_server", "llm_class"),
                    default="openai_server",
                    help="vllm serve (default) or the offline LLM class: the V1 "
                         "batch defaults differ")
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                    help="vllm (default) or sglang: SGLang's token pool "
                         "(tuner/scenario/sglang_memory.py; reads --tp, --kv-cache-dtype, "
                         "--quantization and the three flags below)")
    ap.add_argument("--mem-fraction-static", type=float, default=None,
                    help="sglang: default SGLang 0.4's rule by --tp")
    ap.add_argument("--page-size", type=int, default=1, help="sglang: pool page size")
    ap.add_argument("--context-gib", type=float, default=None,
                    help="sglang: device memory not free before the weights load "
                         "(default tuner.scenario.sglang_memory.CONTEXT_GIB)")
    ap.add_argument("--json", action="store_true", help="print the profile as JSON")
    args = ap.parse_args(argv)
    quant = None if args.quantization in (None, "none", "None") else args.quantization
    unread = _unread_flags(ap, argv, args.engine)
    if unread:
        sglang = ", ".join(a.option_strings[0] for a in ap._actions
                           if a.dest in SGLANG_ONLY)
        reads = (f"--tp, --kv-cache-dtype, --quantization, {sglang}"
                 if args.engine == "sglang" else f"every flag but {sglang}")
        print(f"error: {', '.join(unread)}: not read by --engine {args.engine} (it "
              f"reads {reads})", file=sys.stderr)
        return 2
    try:
        args.hardware = resolve_hardware(args.hardware)[0]
        model = args.model
        if is_config_path(model):
            read = model_from_config(model)
            model = read.spec
            for n in read.notes:
                print(f"note: {n}", file=sys.stderr)
            if args.quantization is None:
                quant = read.quantization
            elif quant != read.quantization:
                raise ValueError(f"--quantization {args.quantization}: {read.path} says "
                                 f"quantization_config {read.quantization or 'none'}")
        if args.engine == "sglang":
            return _sglang(args, model, quant)
        profile = vllm_memory_profile(
            args.hardware, model, tp=args.tp, pp=args.pp,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs, block_size=args.block_size,
            kv_cache_dtype=args.kv_cache_dtype, quantization=quant,
            enforce_eager=args.enforce_eager,
            enable_chunked_prefill=args.enable_chunked_prefill,
            version=args.vllm_version, usage_context=args.usage_context)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(profile.as_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(render(profile))
    return 0


def _sglang(args, model, quant) -> int:
    from tuner.scenario.sglang_memory import CONTEXT_GIB, sglang_memory_profile

    p = sglang_memory_profile(
        args.hardware, model, tp=args.tp, mem_fraction_static=args.mem_fraction_static,
        kv_cache_dtype=args.kv_cache_dtype, quantization=quant, page_size=args.page_size,
        context_gib=CONTEXT_GIB if args.context_gib is None else args.context_gib)
    if args.json:
        sys.stdout.write(json.dumps(p.as_dict(), indent=2) + "\n")
        return 0
    sys.stdout.write(
        f"{p.model} on {p.device}, tp={p.tp} (SGLang)\n"
        f"  mem_fraction_static {p.mem_fraction_static:g}\n\n"
        f"  free before the weights  {p.total_gib:9.2f} GiB\n"
        f"  weights                  {p.weights_gib:9.2f} GiB\n"
        f"  free after them          {p.available_gib:9.2f} GiB\n"
        f"  KV pool                  {p.kv_pool_gib:9.2f} GiB\n\n"
        f"  max_total_num_tokens {p.max_total_num_tokens:,} ({p.cell_bytes:,.0f} bytes "
        "per token per device)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
