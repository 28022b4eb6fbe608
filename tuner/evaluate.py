"""Evaluate a policy on a scenario: ``python -m tuner.evaluate``.

Either name the system and parameters, or pass an exported ``--policy`` file (its
scenario settings are reused; the trace and rate can be overridden). The evaluation
itself is :func:`tuner.objective.evaluate.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import sys


from models import list_systems
from tuner.cli import add_scenario_args, parse_param, spec_from_args
from tuner.common import compile_cache
from tuner.common.argv import relaxed_temperature
from tuner.common.atomic import plain
from tuner.objective.evaluate import evaluate
from tuner.objective.objectives import DEFAULT_OBJECTIVE
from tuner.scenario import (ScenarioSpec,
                            build_scenario)

__all__ = ["main"]


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
    compile_cache.enable()
    try:
        from tuner.export.policy import load_policy

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
        temp = relaxed_temperature(args.mode, args.temperature)
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
