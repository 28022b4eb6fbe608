"""Evaluate a policy on a scenario: ``python -m tuner.evaluate``.

Library: :func:`evaluate` runs one system with given parameters to completion (exact mode
by default) and returns the metrics plus the objective. CLI: either name the system and
parameters, or pass an exported ``--policy`` file (its scenario settings are reused; the
trace and rate can be overridden).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import jax.numpy as jnp

from models import get_system, list_systems, metrics, simulate_until_done, validate_params
from tuner.atomic import plain
from tuner.capacity import exact_capacity, ladder_rates
from tuner.objectives import DEFAULT_OBJECTIVE, parse_objective
from tuner.scenario import (SCHEDULERS, U_CALIBRATIONS, Scenario, ScenarioSpec,
                            build_scenario, check_spec)

__all__ = ["evaluate", "run", "parse_param", "add_scenario_args", "spec_from_args", "main"]


def run(sc: Scenario, system: str, params: dict | None = None, *,
        temperature: float = 0.0) -> dict:
    """Run ``system`` on the scenario until every request is accounted for; its
    metrics as floats."""
    p = validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw)
    p = {k: jnp.asarray(v) for k, v in p.items()}
    opts = sc.options(system, record=True)
    inputs = sc.inputs(system)
    st = simulate_until_done(inputs, sc.hw, p, opts, t=temperature)
    return {k: float(v) for k, v in metrics(st, inputs, opts).items()}


def evaluate(sc: Scenario, system: str, params: dict | None = None, *,
             temperature: float = 0.0, objective: str = DEFAULT_OBJECTIVE,
             rates=None) -> dict:
    """The objective and metrics of ``system`` on the scenario, exactly (or relaxed at
    ``temperature``). A capacity objective (goodput) runs the rate ladder ``rates``
    (default: :func:`tuner.capacity.ladder_rates` of this policy's saturation rate) and
    bisects its first crossing (:func:`tuner.capacity.exact_capacity`); the other
    metrics are then those at the highest rate found within the SLO target."""
    obj = parse_objective(objective)
    obj.check_metrics(system)
    validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw)
    if not obj.capacity:
        m = run(sc, system, params, temperature=temperature)
    else:
        if temperature:
            raise ValueError("capacity objectives are evaluated in exact mode here; "
                             "the relaxed ladder is tuner.problem's")
        cache = {}

        def run_at(rate):
            if rate not in cache:
                cache[rate] = run(sc.at_rate(rate), system, params)
            return cache[rate]

        if rates is None:
            rates = ladder_rates(run_at(math.inf)["requests_per_s"])
        m = exact_capacity(run_at, rates, sc.nominal_rps)
    m["objective"] = float(obj(m))
    return m


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


def add_scenario_args(ap: argparse.ArgumentParser) -> None:
    d = ScenarioSpec()
    g = ap.add_argument_group("scenario")
    g.add_argument("--trace", default=None, help="trace file or preset (default: built-in)")
    g.add_argument("--hardware", default=None, help=f"device preset (default {d.hardware})")
    g.add_argument("--model", default=None, help=f"model preset (default {d.model})")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    g.add_argument("--capacity-tokens", type=int, default=None)
    g.add_argument("--rate", type=float, default=None, help="offered load, requests/s")
    g.add_argument("--n-requests", type=int, default=None)
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
                   help="TTFT SLO in s (default: --slo-scale x the uncontended TTFT)")
    g.add_argument("--tpot-slo", type=float, default=None, dest="tpot_slo_s",
                   help="TPOT SLO in s (default: --slo-scale x the uncontended TPOT)")
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.evaluate", description=__doc__)
    ap.add_argument("--system", help=" | ".join(list_systems()))
    ap.add_argument("--policy", help="exported policy JSON (from python -m tuner.fit)")
    ap.add_argument("--param", action="append", default=[], help="key=value[,v2,...]")
    ap.add_argument("--mode", choices=("exact", "relaxed"), default="exact")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--objective", default=None)
    ap.add_argument("--json", action="store_true")
    add_scenario_args(ap)
    args = ap.parse_args(argv)
    try:
        from tuner.policy import load_policy

        params, base, objective = {}, ScenarioSpec(), DEFAULT_OBJECTIVE
        system = args.system
        if args.policy:
            pol = load_policy(args.policy)
            if system and system != pol["system"]:
                raise ValueError(f"{args.policy}: policy is for system {pol['system']!r}, "
                                 f"not {system!r}")
            system, params, objective = pol["system"], pol["params"], pol["objective"]
            base = ScenarioSpec.from_dict(pol["scenario"])
        if not system:
            raise ValueError("give --system or --policy")
        if not args.policy:  # the family's own default objective, if it declares one
            from models import family_of
            objective = getattr(family_of(system), "default_objective", objective)
        params.update(dict(parse_param(p) for p in args.param))
        temp = 0.0
        if args.mode == "relaxed":
            temp = 0.05 if args.temperature is None else args.temperature
            if not temp > 0:
                raise ValueError("--temperature must be > 0 in relaxed mode")
        sc = build_scenario(spec_from_args(args, base))
        m = evaluate(sc, system, params, temperature=temp,
                     objective=args.objective or objective)
    except (ValueError, OSError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr)
        return 2
    m.update(system=system, mode=args.mode, temperature=temp,
             predictions=sc.prediction_source, workload=sc.summary,
             fingerprint=sc.fingerprint, warnings=list(sc.warnings))
    if args.json:
        print(json.dumps(plain(m), indent=2, sort_keys=True))
    else:
        for w in sc.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for k in ("objective", "goodput_rps", "saturation_tps", "slo_attainment", "tps",
                  "kv_utilization", "token_s_utilization", "kv_occupancy", "ttft_p50_s",
                  "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "migrations",
                  "preemptions", "unserved", "accuracy"):
            if k in m:
                print(f"{k:>16}: {m[k]:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
