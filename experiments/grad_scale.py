"""Gradient checks at several finite-difference steps: is a coordinate's "disagree" the
relaxed gradient's error, or the exact objective's roughness at the check's step?

``experiments/bench_tuners`` classifies each coordinate's relaxed derivative against one
exact CRN central difference (step 0.1 in theta). A goodput whose exact value moves in
small, non-monotone steps can have a central difference at that step whose sign is not
the trend's. This script takes one problem of ``experiments.bench_tuners.PROBLEMS`` at
its start policy (one seed) and, for every coordinate, reports the relaxed derivative of
the log objective at each temperature beside the exact central differences at each step
``h`` (:meth:`tuner.objective.problem.Problem.fd`), each pair classified by
:func:`tuner.search.gradcheck.classify` (the fit's rule).

Usage (from the repository root)::

    python -m experiments.grad_scale --problem engine --out experiments/results/grad_scale_engine

Writes ``grad_scale.json`` and ``grad_scale.md`` to ``--out`` (atomically, with their
provenance). Cost: two exact evaluations per coordinate and step, one gradient per
temperature.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print("experiments.grad_scale: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments.results_io import positive_floats, write_result  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["STEPS", "TEMPERATURES", "main", "measure", "render"]

STEPS = (0.1, 0.3, 1.0)      # theta steps of the exact central differences
TEMPERATURES = (0.1, 0.03)   # of the relaxed derivatives


def measure(prob, theta, steps=STEPS, temperatures=TEMPERATURES, log=print) -> list[dict]:
    """One row per coordinate of ``prob`` at ``theta``: its label, the relaxed derivative
    of the log objective at each temperature, the exact central difference at each
    step, and ``classes[T][h]`` = ``classify(relaxed[T], exact[h])``."""
    from tuner.search.gradcheck import classify

    coords = prob.space.coords()
    relaxed = {}
    for t in temperatures:
        _, g, _ = prob.grad(theta, t)
        relaxed[t] = {c: float(np.asarray(g[c[0]]).reshape(-1)[c[1]]) for c in coords}
        log(f"  relaxed gradient at T = {t:g}")
    exact = {}
    for h in steps:
        exact[h] = prob.fd(theta, coords, h)
        log(f"  exact central differences at h = {h:g}")
    return [{"coordinate": f"{n}[{i}]",
             "relaxed": {f"{t:g}": relaxed[t][(n, i)] for t in temperatures},
             "exact": {f"{h:g}": exact[h][(n, i)] for h in steps},
             "classes": {f"{t:g}": {f"{h:g}": classify(relaxed[t][(n, i)],
                                                       exact[h][(n, i)])
                                    for h in steps} for t in temperatures}}
            for n, i in coords]


def render(res: dict) -> str:
    steps, temps = res["steps"], res["temperatures"]
    L = [f"# Gradient checks at several steps: problem `{res['problem']}`, seed "
         f"{res['seed']}", "",
         f"System `{res['system']}`, d = {len(res['rows'])}, start policy (the system's "
         f"default), exact objective {res['start_value']:.6g}. Relaxed derivative of the "
         "log objective at each temperature T against exact CRN central differences of "
         "it at each step h in theta, classified by `tuner.search.gradcheck.classify` "
         "(agree / disagree / vanishing / flat)" + (" (quick run: a small problem)"
                                                   if res["quick"] else "") + ".", "",
         "| coordinate | " + " | ".join(f"relaxed T={t:g}" for t in temps) + " | "
         + " | ".join(f"exact h={h:g}" for h in steps) + " | "
         + " | ".join(f"T={t:g}: class at h=" + "/".join(f"{h:g}" for h in steps)
                      for t in temps) + " |",
         "|---|" + "---:|" * (len(temps) + len(steps)) + "---|" * len(temps)]
    for r in res["rows"]:
        L.append(f"| {r['coordinate']} | "
                 + " | ".join(f"{r['relaxed'][f'{t:g}']:.3g}" for t in temps) + " | "
                 + " | ".join(f"{r['exact'][f'{h:g}']:.3g}" for h in steps) + " | "
                 + " | ".join("/".join(r["classes"][f"{t:g}"][f"{h:g}"] for h in steps)
                              for t in temps) + " |")
    L += ["", "Counts per step (all temperatures): "
          + "; ".join(f"h = {h:g}: " + ", ".join(
              f"{k} {v}" for k, v in res["counts"][f"{h:g}"].items() if v)
              for h in steps) + f". Wall {res['wall_s']:.0f} s."]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    from experiments.bench_tuners import FULL, PROBLEMS, QUICK

    ap = argparse.ArgumentParser(prog="python -m experiments.grad_scale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", required=True,
                    help=f"one of {', '.join(PROBLEMS)} (experiments.bench_tuners)")
    ap.add_argument("--seed", type=int, default=0, help="the problem's seed (default 0)")
    ap.add_argument("--steps", default=",".join(f"{h:g}" for h in STEPS),
                    help="theta steps of the exact differences (default %(default)s)")
    ap.add_argument("--temperatures", default=",".join(f"{t:g}" for t in TEMPERATURES),
                    help="of the relaxed derivatives (default %(default)s)")
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--quick", action="store_true",
                    help="bench_tuners' quick problem sizes (a test)")
    args = ap.parse_args(argv)
    try:
        if args.problem not in PROBLEMS:
            raise ValueError(f"--problem {args.problem!r}: one of {', '.join(PROBLEMS)}")
        if args.seed < 0:
            raise ValueError(f"--seed {args.seed}: must be >= 0")
        steps = positive_floats("--steps", args.steps)
        temps = positive_floats("--temperatures", args.temperatures)
        why = unwritable_reason(args.out)
        if why:
            raise ValueError(f"--out {args.out}: {why}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from tuner.common import compile_cache
    from tuner.search.fitting import build_problem
    from tuner.search.gradcheck import CLASSES

    from experiments.bench_tuners import _settings

    compile_cache.enable()
    t0 = time.perf_counter()
    cfg = QUICK if args.quick else FULL
    pb = PROBLEMS[args.problem]
    print(f"{args.problem}: building the problem (seed {args.seed})", file=sys.stderr,
          flush=True)
    prob, _ = build_problem(pb.specs(cfg, args.seed), _settings(cfg, pb, args.seed))
    theta = prob.space.to_theta(prob.space.base)
    start, _ = prob.value(theta)
    rows = measure(prob, theta, steps, temps,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    counts = {f"{h:g}": {k: sum(r["classes"][f"{t:g}"][f"{h:g}"] == k for r in rows
                                for t in temps) for k in CLASSES} for h in steps}
    res = {"problem": args.problem, "system": pb.system, "seed": args.seed,
           "quick": args.quick, "steps": list(steps), "temperatures": list(temps),
           "start_value": start, "rows": rows, "counts": counts,
           "wall_s": time.perf_counter() - t0}
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out, "grad_scale", res, render)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
