"""Gradient quality per tunable parameter, at several temperatures.

For each coordinate of the unconstrained parameter vector theta, compares the relaxed
gradient of the log objective (what the tuner climbs; :meth:`Objective.log_value`) with (a) central finite differences of the relaxed simulator at the same
temperature (implementation check) and (b) central finite differences of the exact
simulator under common random numbers (bias check), and reports each check's class
(:func:`tuner.search.gradcheck.classify`: agree, disagree, vanishing, flat; the rule the fit
uses) and relative error, all of the log objective. ``python -m experiments.grad_check --out DIR`` writes grad_check.json and
grad_check.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax.numpy as jnp

from tuner.common.atomic import write_json_atomic, write_text_atomic
from tuner.search.gradcheck import FLAT_TOL, VANISHING_RATIO, classify
from tuner.common.provenance import provenance, stamp_text
from tuner.search.fitting import FitSettings, build_problem
from tuner.scenario import ScenarioSpec

__all__ = ["run", "main"]


def _cmp(g, fd):
    status = classify(g, fd)
    return {"fd": fd, "status": status, "usable": status in ("agree", "flat"),
            "rel_error": abs(g - fd) / max(abs(fd), FLAT_TOL)}


def run(spec: ScenarioSpec, system: str, objective: str, temps, crn: int,
        h_relaxed: float, h_exact: float) -> dict:
    prob, _ = build_problem(spec, FitSettings(system=system, objective=objective,
                                              crn=crn, margin=0.0))
    space = prob.space
    theta = space.to_theta(space.base)
    coords = space.coords()
    exact_fd = prob.fd(theta, coords, h_exact, t=0.0)
    rows = []
    for t in temps:
        v, g, _ = prob.grad(theta, t)
        relaxed_fd = prob.fd(theta, coords, h_relaxed, t=t)
        for name, i in coords:
            gi = float(jnp.ravel(g[name])[i])
            rows.append({"temperature": t, "param": f"{name}[{i}]", "grad": gi,
                         "relaxed_value": v,
                         "implementation": _cmp(gi, relaxed_fd[(name, i)]),
                         "bias": _cmp(gi, exact_fd[(name, i)])})
    return {"system": system, "objective": objective, "scenario": spec.to_dict(),
            "crn": crn, "h_relaxed": h_relaxed, "h_exact": h_exact,
            "exact_value": prob.value(theta)[0], "rows": rows}


def to_markdown(res: dict) -> str:
    out = [f"# Gradient check: {res['system']}, objective `{res['objective']}`", "",
           f"exact objective at the default policy: {res['exact_value']:.6g}; "
           f"theta steps: relaxed FD {res['h_relaxed']}, exact FD {res['h_exact']} "
           f"(CRN workloads: {res['crn']}). Gradients and finite differences are of the "
           "log objective (mean over the CRN workloads), the quantity the tuner climbs.",
           "", f"Check (`tuner.search.gradcheck.classify`, the fit's rule): flat when "
           f"|FD| <= {FLAT_TOL:g}, vanishing when |relaxed grad| < {VANISHING_RATIO:g} x "
           "|FD|, else agree or disagree by sign; the fit uses exact differences for "
           "vanishing and disagreeing coordinates.", "",
           "| T | param | relaxed grad | relaxed FD | check | rel.err | exact FD | check "
           "| rel.err |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        a, b = r["implementation"], r["bias"]
        out.append(f"| {r['temperature']:g} | {r['param']} | {r['grad']:+.4g} | "
                   f"{a['fd']:+.4g} | {_word(a)} | "
                   f"{a['rel_error']:.2f} | {b['fd']:+.4g} | "
                   f"{_word(b)} | {b['rel_error']:.2f} |")
    if res.get("provenance"):
        out += ["", stamp_text(res["provenance"])]
    return "\n".join(out) + "\n"


def _word(c: dict) -> str:
    return c["status"] if c["usable"] else f"**{c['status']}**"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.grad_check")
    ap.add_argument("--system", default="odma")
    ap.add_argument("--objective", default="tps_mig")
    ap.add_argument("--trace", default="default")
    ap.add_argument("--n-requests", type=int, default=600)
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--capacity-tokens", type=int, default=None,
                    help="KV capacity in tokens (default: the deployment's)")
    ap.add_argument("--temperatures", default="0.3,0.1,0.03,0.01")
    ap.add_argument("--crn", type=int, default=2)
    ap.add_argument("--h-relaxed", type=float, default=0.01)
    ap.add_argument("--h-exact", type=float, default=0.1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        spec = ScenarioSpec(trace=a.trace, n_requests=a.n_requests, n_slots=a.slots,
                            max_batch=a.slots, capacity_tokens=a.capacity_tokens)
        temps = [float(x) for x in a.temperatures.split(",")]
        res = run(spec, a.system, a.objective, temps, a.crn, a.h_relaxed, a.h_exact)
        res = {"provenance": provenance(), **res}
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    md = to_markdown(res)
    print(md)
    if a.out:
        out = Path(a.out)
        write_json_atomic(out / "grad_check.json", res)
        write_text_atomic(out / "grad_check.md", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
