"""What the command-line entry points share: the scenario flags, ``--param`` parsing,
and the checks of output paths made before any work.

Library modules never import this (it is the layer above them); the entry points
(``tuner.fit``, ``tuner.evaluate``, ``tuner.sweep``, ``tuner.calibrate``, ...) do.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tuner.common.atomic import unwritable_reason
from tuner.scenario import SCHEDULERS, U_CALIBRATIONS, ScenarioSpec, check_spec, profile_model

__all__ = ["SCENARIO_KEYS", "add_scenario_args", "check_file", "check_flags", "check_out",
           "parse_param", "spec_from_args"]


def parse_param(text: str, flag: str = "--param") -> tuple[str, list[float] | float]:
    """``key=value`` or ``key=v1,v2,...``; errors name the argument."""
    if "=" not in text:
        raise ValueError(f"{flag} {text!r}: expected key=value")
    key, _, value = text.partition("=")
    try:
        vals = [float(v) for v in value.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: value is not a number (or comma list)") from None
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{flag} {text!r}: value must be finite")
    return key.strip(), vals if len(vals) > 1 else vals[0]


def add_scenario_args(ap: argparse.ArgumentParser, d: ScenarioSpec | None = None,
                      title: str = "scenario") -> None:
    """The scenario flags; ``d`` (default ``ScenarioSpec()``) gives the defaults their
    help texts name."""
    d = ScenarioSpec() if d is None else d
    g = ap.add_argument_group(title)
    g.add_argument("--trace", default=None, help="trace file or preset (default: "
                   + ("built-in" if d.trace == "default" else d.trace) + ")")
    g.add_argument("--hardware", default=None, help="device preset, a device file "
                   "(.json / .toml: one device's numbers, hardware.load_devices) or a "
                   f"tuner.calibrate profile file (default {d.hardware})")
    g.add_argument("--model", default=None, help="model preset, Hugging Face id of one, "
                   "or a path to a config.json or its folder (tuner/scenario/"
                   "model_config.py; its quantization_config is applied) (default: the "
                   f"model a profile was calibrated on, else {d.model})")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree"
                   + (f" (default {d.tp})" if d.tp else ""))
    g.add_argument("--capacity-tokens", type=int, default=None)
    g.add_argument("--rate", type=float, default=None, help="offered load, requests/s")
    g.add_argument("--n-requests", type=int, default=None,
                   help="requests of the slice (default: "
                   + ("all" if d.n_requests is None else f"{d.n_requests}") + ")")
    g.add_argument("--offset", type=int, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-len", type=int, default=None,
                   help="output tokens per request at most (default: the next power of "
                   "two >= the longest output, within the model's context); prompt + "
                   "output is clipped to the context per request")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="prompt + output tokens per request at most, both scaled down "
                   "proportionally (Vidur's --trace_request_length_generator_config_"
                   "max_tokens); default: no such clip")
    g.add_argument("--slots", type=int, default=None, dest="n_slots",
                   help=f"slot table size (default {d.n_slots}); also --max-batch unless "
                   "that is given")
    g.add_argument("--max-batch", "--max-num-seqs", type=int, default=None,
                   dest="max_batch",
                   help=f"running requests at most, vLLM --max-num-seqs (default: "
                   f"--slots, {d.max_batch})")
    g.add_argument("--max-prefill", "--max-num-batched-tokens", type=int, default=None,
                   dest="max_prefill",
                   help=f"tokens per iteration, vLLM --max-num-batched-tokens (default "
                   f"{d.max_prefill})")
    g.add_argument("--scheduler", default=None, metavar="{" + ",".join(SCHEDULERS) + "}",
                   help=f"v0: vLLM v0's default scheduler, chunked prefill off "
                   f"(prefill-only iterations); chunked: chunked prefill, as vLLM V1 "
                   f"(default {d.scheduler})")
    g.add_argument("--enable-chunked-prefill", action="store_const", const="chunked",
                   dest="scheduler", help="vLLM's flag: the same as --scheduler chunked")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help=f"vLLM's share of device memory (default "
                   f"{d.gpu_memory_utilization:g}); sizes the KV capacity with vLLM's "
                   "memory profile (python -m tuner.memory)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="vLLM's context limit: the memory profile's, and each request's "
                   "prompt + output is clipped to it (default: the model's context; "
                   "scheduler v0: at most --max-num-batched-tokens)")
    g.add_argument("--block-size", type=int, default=None,
                   help=f"vLLM's KV block size for the memory profile (default "
                   f"{d.block_size}; the paged system's block_size parameter is separate)")
    g.add_argument("--kv-cache-dtype", default=None,
                   help=f"vLLM's KV cache dtype (auto, fp8, fp8_e4m3, fp8_e5m2; default "
                   f"{d.kv_cache_dtype})")
    g.add_argument("--enforce-eager", action="store_const", const=True, default=None,
                   help="vLLM's flag: no CUDA graphs (memory profile)")
    g.add_argument("--watermark", type=float, default=None,
                   help=f"share of the KV capacity a paged admission leaves free, in "
                   f"[0, 0.5) (default {d.watermark:g}: vLLM v0's 1%% of the blocks)")
    g.add_argument("--pred-quantile", type=float, default=None,
                   help="traces with prompt text: the level of the predictor's length "
                   "distribution used as L_hat, in (0, 1) (default: the model's own, "
                   "0.5 for the shipped one); not for error-model traces")
    g.add_argument("--u-calibration", default=None,
                   metavar="{" + ",".join(U_CALIBRATIONS) + "}",
                   help=f"raw: u as predicted; rank: u's empirical CDF position over the "
                   f"history's predictions (the slice's if fewer than 200), so that "
                   f"u > tau routes a share 1 - tau (default {d.u_calibration})")
    g.add_argument("--ttft-slo", type=float, default=None, dest="ttft_slo_s",
                   help="TTFT SLO in s (default: " + (
                       "--slo-scale x the uncontended TTFT" if d.ttft_slo_s is None
                       else f"{d.ttft_slo_s:g}") + ")")
    g.add_argument("--tpot-slo", type=float, default=None, dest="tpot_slo_s",
                   help="TPOT SLO in s (default: " + (
                       "--slo-scale x the uncontended TPOT" if d.tpot_slo_s is None
                       else f"{d.tpot_slo_s:g}") + ")")
    g.add_argument("--slo-scale", type=float, default=None,
                   help=f"SLOs as a multiple of the uncontended latency (default "
                   f"{d.slo_scale:g}, eLLM section 5)")
    g.add_argument("--option", action="append", default=None, dest="options",
                   metavar="KEY=VALUE", help="a family option (e.g. window=10000 for "
                   "the bucketed family's ODMA window); repeatable")


SCENARIO_KEYS = ("trace", "hardware", "model", "tp", "capacity_tokens", "rate",
                 "n_requests", "offset", "seed", "max_len", "max_tokens", "n_slots",
                 "max_batch", "max_prefill", "scheduler", "watermark", "ttft_slo_s",
                 "tpot_slo_s", "slo_scale", "pred_quantile", "u_calibration",
                 "gpu_memory_utilization", "max_model_len", "block_size", "kv_cache_dtype",
                 "enforce_eager")


# flags whose value must be a positive integer (an integer >= the bound), checked with
# the flag named before anything is derived from them (0 is refused, not replaced)
_INT_FLAGS = {"tp": ("--tp", 1), "capacity_tokens": ("--capacity-tokens", 1),
              "n_requests": ("--n-requests", 1), "offset": ("--offset", 0),
              "seed": ("--seed", 0), "max_len": ("--max-len", 1),
              "n_slots": ("--slots", 16), "max_batch": ("--max-batch", 1),
              "max_model_len": ("--max-model-len", 1), "block_size": ("--block-size", 1)}


_POSITIVE_FLAGS = {"rate": "--rate", "ttft_slo_s": "--ttft-slo", "tpot_slo_s": "--tpot-slo",
                   "slo_scale": "--slo-scale"}


def check_flags(args) -> None:
    """One ``ValueError`` naming the first scenario flag with a value no scenario can
    have: integers below their bound, rates and SLOs that are not finite numbers > 0."""
    for key, (flag, low) in _INT_FLAGS.items():
        v = getattr(args, key, None)
        if v is not None and v < low:
            what = ("a positive integer" if low == 1 else
                    "an integer >= 0" if low == 0 else f"an integer >= {low}")
            raise ValueError(f"{flag} {v}: must be {what}")
    for key, flag in _POSITIVE_FLAGS.items():
        v = getattr(args, key, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{flag} {v}: must be a finite number > 0")


def spec_from_args(args, base: ScenarioSpec | None = None) -> ScenarioSpec:
    base = base or ScenarioSpec()
    check_flags(args)
    over = {k: getattr(args, k) for k in SCENARIO_KEYS if getattr(args, k, None) is not None}
    if "model" not in over and "hardware" in over:
        # a device profile names the model it was calibrated on: that is the default
        pm = profile_model(over["hardware"])
        if pm is not None:
            over["model"] = pm
    if "n_slots" in over and "max_batch" not in over:
        over["max_batch"] = over["n_slots"]
    if getattr(args, "options", None):
        opts = dict(base.options)
        for text in args.options:
            key, value = parse_param(text, flag="--option")
            if isinstance(value, list) or value != int(value):
                raise ValueError(f"--option {text!r}: expected an integer value")
            opts[key] = int(value)
        over["options"] = tuple(sorted(opts.items()))
    spec = base.replace(**over)
    check_spec(spec)  # bad settings fail before any work
    return spec


def check_file(path: Path, flag: str = "--out") -> None:
    """Raise ValueError unless ``path`` can be written as a file later: not a
    directory, and its folder exists and is writable or can be created. Creates
    nothing (the folder is made when the file is written)."""
    path = Path(path)
    if path.is_dir():
        name = "fit.log" if flag == "--log" else "policy.json"
        raise ValueError(f"{flag} {path}: is a directory; give a file path such as "
                         f"{path / name}")
    parent = path.parent if str(path.parent) else Path(".")
    for up in (parent, *parent.parents):
        if up.exists() and not up.is_dir():
            raise ValueError(f"{flag} {path}: {up} is not a directory")
    why = unwritable_reason(parent)
    if why:
        raise ValueError(f"{flag} {path}: directory {parent} {why}")


def check_out(out: Path) -> Path:
    """The checkpoint path of ``out``, after checking that both can be written (nothing
    is created: the folder of ``out`` is made when a file is first written there)."""
    check_file(out)
    ckpt = out.with_name(out.name + ".ckpt")
    if ckpt.is_dir():
        raise ValueError(f"checkpoint path {ckpt} is a directory")
    return ckpt
