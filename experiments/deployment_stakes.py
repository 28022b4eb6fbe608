"""Stakes of the fit's named deployments: issue 31's criterion on what ``tuner.fit``
actually runs.

``python -m experiments.deployment_stakes --out DIR [--deployments a,b] [--policies 64]
[--realisations 2] [--quick]``

For each deployment of ``tuner.scenario.deployments`` (default: the fit's built-in one,
the README's main job) this runs :func:`experiments.stakes.run_case` on the deployment's
own system and scenario: the system's default, ``--policies`` random policies (uniform in
the random search's box) and the bucketed baselines, each on ``--realisations``
workload realisations, exact, both goodputs; then the relaxed-vs-exact rank agreement.
Criterion: best / worst >= 1.5 and best / default >= 1.1. A random setting that vLLM
would refuse at start-up (the system's ``refusal``, ``models.bucketed.engine.refusal``)
serves nothing, so best / worst is also reported over the settings vLLM would start.

Nothing is tuned here: the deployment is chosen as the fit's default by this
measurement, never by a tuner's result. Writes ``deployment_stakes.json`` and ``.md``
(atomically, again after every deployment); progress on stderr. Exit 0: every
deployment ran; 2: bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("experiments.deployment_stakes: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

from experiments import stakes  # noqa: E402
from experiments.results_io import pick_cases, write_result  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402
from tuner.scenario.deployments import DEFAULT, DEPLOYMENTS  # noqa: E402

__all__ = ["main", "refused", "render", "started"]


def refused(name: str, n: int, quick: bool) -> list[str | None]:
    """For each of the ``n`` random policies :func:`experiments.stakes.run_case` draws on
    the deployment (the same draw: seed 0, the first realisation), the field vLLM would
    refuse it for at start-up, or None (all None for a system without such a rule)."""
    import numpy as np

    from models import get_system
    from tuner.scenario import ScenarioSpec, build_scenario

    dep = DEPLOYMENTS[name]
    rule = get_system(dep.system).refusal
    sc = build_scenario(ScenarioSpec(**{**dep.spec_fields(),
                                        **(stakes.QUICK if quick else {})}))
    space, thetas = stakes.random_thetas(dep.system, sc, n)
    out = []
    for th in thetas:
        params = {k: float(np.asarray(v).reshape(-1)[0])
                  for k, v in space.to_params(th).items()}
        why = rule(sc.deployment, params) if rule is not None else None
        out.append(None if why is None else why[0])
    return out


def started(res_case: dict, metric: str, why: list) -> dict:
    """Best / worst over the random settings vLLM would start (``why`` None), with how
    many it would refuse, by field."""
    r = res_case[metric]
    below = r.get("random_below_floor") or [False] * len(r["random"])
    live = [(x, b) for x, b, w in zip(r["random"], below, why) if w is None]
    out = {"refused": len(r["random"]) - len(live),
           "refused_by_field": {f: why.count(f) for f in sorted({w for w in why if w})}}
    if live:
        worst = stakes.floor_worst(*zip(*live), r.get("floor"))
        out["worst"] = worst
        out["best_over_worst"] = r["best"] / worst if worst > 0 else float("inf")
        out["below_floor"] = int(sum(b for _, b in live))
    return out


def render(res: dict) -> str:
    L = ["# Stakes of the fit's deployments (issue 31's criterion, before any tuning)", "",
         f"{res['policies']} random policies of each deployment's system (uniform in "
         f"[-{stakes.BOX:g}, {stakes.BOX:g}] of every unconstrained coordinate) beside its "
         f"default and the bucketed baselines, {res['realisations']} workload "
         "realisation(s), exact runs" + (" (quick run: small slices)" if res["quick"]
                                          else "") + ". Criterion: best / worst >= "
         f"{stakes.BEST_OVER_WORST} and best / default >= {stakes.BEST_OVER_DEFAULT}.", "",
         "| deployment | system | goodput | default | worst | median | best | best / "
         "worst | best / default | meets | refused | best / worst started | "
         "static / s3 / paged |",
         "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for name, c in res["deployments"].items():
        for metric in ("goodput_rps", "goodput_expected_rps"):
            r, s = c[metric], c["started"][metric]
            base = " / ".join(f"{v:.3f}" for v in r["baselines"].values())
            ge = ">= " if r.get("best_over_worst_bound") else ""
            bws = (f"{ge}{s['best_over_worst']:.2f}" if "best_over_worst" in s
                   else "-")
            lt = "< " if r.get("best_over_worst_bound") else ""
            L.append(f"| {name} | {c['system']} | {metric} | {r['default']:.3f} | "
                     f"{lt}{r['worst']:.3f} | {r['median_random']:.3f} | {r['best']:.3f} | "
                     f"{ge}{r['best_over_worst']:.2f} | {r['best_over_default']:.2f} | "
                     f"{'yes' if r['meets'] else 'no'} | {s['refused']} | {bws} | "
                     f"{base} |")
    L += ["", "Goodputs in req/s; `refused`: random settings vLLM would refuse at "
          "start-up (they serve nothing); `best / worst started`: over the others. "
          + (f"No policy's search ran below {res['floor_share']:g} x the default's "
             "goodput: a worst marked < is that floor (the policies below it: "
             + "; ".join(f"{n}: {c['goodput_rps']['below_floor']}"
                         for n, c in res["deployments"].items())
             + "), and best / worst at least best / floor; the rank agreement is over "
             "the policies above it." if res.get("floor_share") else ""), ""]
    for name, c in res["deployments"].items():
        a = c.get("agreement")
        tau = ", ".join(f"T = {t}: " + ("-" if v is None else f"{v:.2f}")
                        for t, v in a["tau"].items()) if a else "not run"
        L.append(f"- **{name}**: {c['description']}; {c['requests']} requests, KV "
                 f"{c['capacity_tokens']:.0f} tokens at the default; {c['wall_s']:.0f} s, "
                 f"{c['runs']} runs. Rank agreement of the fit's surrogate with the "
                 f"exact expected goodput (Kendall's tau; T = 0: exact ladder): {tau}.")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.deployment_stakes",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--deployments", default=DEFAULT,
                    help="comma-separated names of tuner.scenario.deployments "
                    f"(default {DEFAULT})")
    ap.add_argument("--policies", type=int, default=64)
    ap.add_argument("--realisations", type=int, default=2)
    ap.add_argument("--floor-share", type=float, default=0.25,
                    help="no policy's goodput search runs below this share of the "
                    "default's goodput; one that misses the SLOs there is reported as "
                    "below it (0: no floor; default 0.25)")
    ap.add_argument("--no-agreement", dest="agreement", action="store_false")
    ap.add_argument("--quick", action="store_true", help="small slices (a test)")
    args = ap.parse_args(argv)
    try:
        names = pick_cases(args.deployments, DEPLOYMENTS)
        for flag, v in (("--policies", args.policies),
                        ("--realisations", args.realisations)):
            if v < 1:
                raise ValueError(f"{flag} {v}: must be >= 1")
        if not (0.0 <= args.floor_share < 1.0):
            raise ValueError(f"--floor-share {args.floor_share}: must be in [0, 1)")
        floor_share = args.floor_share or None  # 0: no floor
        why = unwritable_reason(args.out)
        if why:
            raise ValueError(f"--out {args.out}: {why}")
    except ValueError as e:
        print(f"error: {str(e).replace('--cases', '--deployments')}", file=sys.stderr)
        return 2
    compile_cache.enable()
    import jax

    res = {"policies": args.policies, "realisations": args.realisations,
           "floor_share": floor_share,
           "quick": args.quick, "cpus": os.cpu_count(), "jax": jax.__version__,
           "criterion": {"best_over_worst": stakes.BEST_OVER_WORST,
                         "best_over_default": stakes.BEST_OVER_DEFAULT},
           "deployments": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        dep = DEPLOYMENTS[name]
        c = stakes.run_case(name, dep.spec_fields(), args.policies, args.realisations,
                            args.quick, dep.system, args.agreement, floor_share)
        why = refused(name, args.policies, args.quick)
        c.update(system=dep.system, description=dep.description,
                 started={m: started(c, m, why) for m in ("goodput_rps",
                                                          "goodput_expected_rps")})
        res["deployments"][name] = c
        write_result(args.out, "deployment_stakes", res, render)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
