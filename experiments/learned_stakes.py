"""Stakes of a learned per-request policy (issue 31, item 5): is there goodput to win by
an MLP that sets each request's inflation, before any method is compared on it?

``python -m experiments.learned_stakes --out DIR [--cases ...] [--system SYSTEM]
[--target inflation|priority] [--requests N] [--quick]``

The policy (``tuner.objective.learned``): the system's reservation of request ``i``
(ODMA's by default; ``--system s3``: S3's bucket of the prediction) scaled by
``m_i = exp(log 4 tanh(mlp(f_i)))`` of its prompt length, predicted output length and
uncertainty; two hidden layers of 12 (217 weights); zero weights are the system's
default. ``--target priority`` (a bucketed system, ``paged`` by default): the MLP sets
each request's scheduling priority instead (vLLM V1's ``--scheduling-policy priority``,
lower first; zero weights: one priority for all, first-come-first-served), and four
hand-made rules are measured beside the random MLPs (shortest / longest prompt first,
shortest / longest predicted output first, each an MLP with one path from its feature);
the order has no relaxed gradient, so the descent is not run (the gradient checks
still are: they show it).
Per case (the built-in workload, Azure conversation lengths and times on the MLU370-X4,
with the KV capacity cut so that memory binds) and on two workload realisations
(prediction-error seeds) as one CRN stack, every figure is the tuner's exact objective:
the expected goodput on the rate ladder planned from the system's default
(``tuner.objective.problem``), so the default, the random policies, the baselines and
the gradient descent are measured alike:

* the default and random policies (uniform in the random search's box, and closer to
  the start, normal with scale 1), judged by issue 31's criterion
  (``experiments.stakes.judge``: best / worst >= 1.5 and best / default >= 1.1);
* the baselines ``paged``, ``static`` and ``s3`` with their defaults on the same ladder;
* Kendall's tau of the relaxed objective at T = 0.3 and 0.1 against the exact one over
  those policies (can the surrogate rank them?);
* at the default, the relaxed derivative of each last-layer weight against the exact
  central difference (``tuner.search.gradcheck.classify``);
* ``tuner.search.descend`` (Adam on the relaxed objective, exact checks) from the
  default, with its cost in exact-evaluation equivalents (a gradient charged its
  measured time over an exact evaluation's).

Writes ``DIR/learned_stakes.json`` and ``DIR/learned_stakes.md`` (atomically, with their
provenance) and prints the markdown; progress on stderr. Exit 2 on bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    print("experiments.learned_stakes: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments.bench_tuners import _time  # noqa: E402
from experiments.results_io import pick_cases, write_result  # noqa: E402
from experiments.stakes import (BASELINES, BEST_OVER_DEFAULT, BEST_OVER_WORST,  # noqa: E402
                                BOX, judge)
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["CASES", "main", "render", "run_case"]

SYSTEM = {"inflation": "odma", "priority": "paged"}  # the default --system per target
# per --target: bucketed systems whose reservation reads the prediction; every bucketed
# system admits by priority
SYSTEMS = {"inflation": ("odma", "s3"), "priority": ("paged", "static", "s3", "odma")}
HEURISTICS = {  # name -> (feature index, sign of the priority in it): lower goes first
    "short-prompt-first": (0, 1.0), "long-prompt-first": (0, -1.0),
    "short-output-first": (1, 1.0), "long-output-first": (1, -1.0)}
OBJECTIVE = "goodput_expected_rps"
N = 300
CASES = {"kv-100k": 100_000, "kv-150k": 150_000, "kv-200k": 200_000}
AGREE_T = (0.3, 0.1)
DESCENT_STEPS = 16


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gradient_checks(prob, theta, temperatures=AGREE_T, h: float = 0.1) -> dict:
    """At ``theta``: the relaxed derivative of every last-layer weight (the only ones
    with a derivative where the last layer is zero) against the exact CRN central
    difference of the log objective, classified by ``tuner.search.gradcheck.classify``
    (agree / disagree / vanishing / flat), per temperature."""
    from tuner.search.gradcheck import CLASSES, classify

    last = prob.space.names[-2:]  # the last Dense layer's bias and kernel
    coords = [(n, i) for n, i in prob.space.coords() if n in last]
    fd = prob.fd(theta, coords, h)
    out = {"coords": len(coords), "h": h, "exact_fd": [fd[c] for c in coords], "by_t": {}}
    for t in temperatures:
        _, g, _ = prob.grad(theta, t)
        rel = [float(np.asarray(g[n]).reshape(-1)[i]) for n, i in coords]
        cls = [classify(r, fd[c]) for r, c in zip(rel, coords)]
        out["by_t"][f"{t:g}"] = {"relaxed": rel,
                                 "classes": {k: cls.count(k) for k in CLASSES}}
    return out


def heuristic(zero: dict, feature: int, sign: float) -> dict:
    """The MLP whose output is increasing (``sign`` > 0) or decreasing in one feature:
    one path of weight 2 through each hidden layer's first unit."""
    th = {k: np.zeros(np.shape(v), np.float32) for k, v in zero.items()}
    th["Dense_0/kernel"][feature, 0] = 2.0
    th["Dense_1/kernel"][0, 0] = 2.0
    th["Dense_2/kernel"][0] = sign
    return th


def run_case(name: str, capacity: int, n: int, seeds: int, uniform: int, normal: int,
             steps: int, slots: dict, system: str = "odma",
             target: str = "inflation") -> dict:
    from scipy import stats

    from models import get_system
    from tuner.objective.learned import LearnedProblem, MLPSpace
    from tuner.objective.objectives import parse_objective
    from tuner.objective.problem import Problem, plan_ladder
    from tuner.objective.space import Space
    from tuner.scenario import ScenarioSpec, build_scenario
    from tuner.search.blackbox import Flat
    from tuner.search.descend import descend

    t0 = time.perf_counter()
    scs = [build_scenario(ScenarioSpec(n_requests=n, capacity_tokens=capacity, seed=s,
                                       **slots)) for s in range(seeds)]
    params = get_system(system).default_params(scs[0].cfg.max_len)
    obj = parse_objective(OBJECTIVE)
    rates, n_steps, _ = plan_ladder(scs, system, params)
    prob = LearnedProblem(scs, system, params, obj, n_steps, rates,
                          space=MLPSpace(target=target))
    flat = Flat(prob.space)
    zero = prob.space.to_theta(prob.space.base)
    default = prob.value(zero)[0]
    _log(f"{name}: {len(flat)} weights, default {default:.4g} req/s")
    rng = np.random.default_rng(0)
    xs = ([rng.uniform(-BOX, BOX, len(flat)) for _ in range(uniform)]
          + [rng.normal(0.0, 1.0, len(flat)) for _ in range(normal)])
    thetas = [flat.theta(x) for x in xs]
    exact = [float(v) for v in prob.batch(thetas)]
    _log(f"{name}: random policies {min(exact):.4g}..{max(exact):.4g} req/s")
    hand = {}
    if target == "priority":
        hv = prob.batch([heuristic(zero, f, sg) for f, sg in HEURISTICS.values()])
        hand = {k: float(v) for k, v in zip(HEURISTICS, hv)}
        _log(f"{name}: hand-made rules " + ", ".join(f"{k} {v:.4g}"
                                                    for k, v in hand.items()))
    j = judge(default, exact)
    j["meets"] = bool(j["best_over_worst"] >= BEST_OVER_WORST
                      and j["best_over_default"] >= BEST_OVER_DEFAULT)
    tau = {}
    for t in AGREE_T:
        rel = prob.batch(thetas, t=t)
        k = float(stats.kendalltau(rel, exact).statistic)
        tau[f"{t:g}"] = None if np.isnan(k) else k  # NaN: every exact value equal
    base = {}
    for b in BASELINES:
        bp = get_system(b).default_params(scs[0].cfg.max_len)
        pb = Problem(scs, b, Space(get_system(b), bp, names=()), obj, n_steps, rates)
        base[b] = pb.value({})[0]
    checks = gradient_checks(prob, zero)
    _log(f"{name}: gradient checks at the default " + "; ".join(
        f"T={t}: {v['classes']}" for t, v in checks["by_t"].items()))
    unit = prob.unit
    ratio = (_time(lambda: prob.grad(zero, AGREE_T[1]), 3)
             / _time(lambda: prob.value(zero), 3))
    prob.grad_cost = ratio
    c0 = prob.cost
    if target == "priority":  # a hard order: the relaxed gradient is zero (checks above)
        descent = {"steps": 0, "best": None, "start": default, "cost_evals": 0.0,
                   "grad_over_exact": ratio, "history": [],
                   "not_run": "the priority order is a hard decision in both modes: the "
                   "relaxed gradient of every weight is zero"}
    else:
        d = descend(prob, steps)
        descent = {"steps": steps, "best": d.best_value, "start": d.start_value,
                   "cost_evals": (prob.cost - c0) / unit, "grad_over_exact": ratio,
                   "history": d.history}
    return {"capacity_tokens": capacity, "requests": n, "realisations": seeds,
            "target": target, "heuristics": hand,
            "weights": len(flat), "horizon_steps": n_steps,
            "rungs_rps": np.asarray(rates).tolist(), "default": default,
            "random": {"uniform_box": uniform, "normal_1": normal, "values": exact},
            "judge": j, "tau": tau, "baselines": base, "gradient_checks": checks,
            "descent": descent,
            "wall_s": time.perf_counter() - t0}


def _tau(x) -> str:
    return "— (ties)" if x is None else f"{x:.2f}"


def render(res: dict) -> str:
    sysname = {"odma": "ODMA", "s3": "S3"}.get(res["system"], res["system"])
    prio = res.get("target") == "priority"
    what = ("each request's scheduling priority as an MLP" if prio
            else f"{sysname}'s inflation as an MLP")
    policy = ("setting each request's priority (vLLM V1's `--scheduling-policy priority`, "
              "lower first, ties by arrival; the order is taken over the first 256 "
              "waiting requests); zero weights = one priority for all, first-come-first-"
              "served, the default" if prio else
              "scaling each request's predicted length by a factor in [1/4, 4]; zero "
              f"weights = {sysname}'s default")
    L = [f"# Stakes of a learned per-request policy ({what})", "",
         f"System {res['system']}, objective `{res['objective']}` on the rate ladder "
         f"planned from {sysname}'s default (every figure on the same ladder and "
         "realisations, req/s). Policy: an MLP of (log prompt, log predicted output, u) "
         f"{policy}. Criterion (issue 31): best / worst >= "
         f"{BEST_OVER_WORST} and best / default >= {BEST_OVER_DEFAULT}.", "",
         "| case | KV tokens | weights | default | random worst | median | best | "
         "best / worst | best / default | meets | paged | static | s3 | descent best "
         "(evals) | tau T=0.3 | tau T=0.1 |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|"]
    for name, c in res["cases"].items():
        j, b, d = c["judge"], c["baselines"], c["descent"]
        L.append(f"| {name} | {c['capacity_tokens']:,} | {c['weights']} | "
                 f"{c['default']:.4g} | {j['worst']:.4g} | {j['median_random']:.4g} | "
                 f"{j['best']:.4g} | {j['best_over_worst']:.3f} | "
                 f"{j['best_over_default']:.3f} | {'yes' if j['meets'] else 'no'} | "
                 f"{b['paged']:.4g} | {b['static']:.4g} | {b['s3']:.4g} | "
                 + (f"{d['best']:.4g} ({d['cost_evals']:.0f})" if d["best"] is not None
                    else "not run")
                 + f" | {_tau(c['tau']['0.3'])} | "
                 f"{_tau(c['tau']['0.1'])} |")
    L += ["", "Random policies: uniform in the random search's box [-5, 5] per weight, "
          "and normal with scale 1; `descent`: Adam on the relaxed objective, "
          f"{DESCENT_STEPS} steps from the default with exact checks every 2, cost in "
          "exact-evaluation equivalents (each gradient at its measured time over an "
          "exact evaluation's). tau: Kendall's tau of the relaxed objective against "
          "the exact one over the random policies.", ""]
    for name, c in res["cases"].items():
        j = c["judge"]
        gap = max(c["baselines"].values()) / c["default"]
        gc = c["gradient_checks"]
        classes = "; ".join(f"T = {t}: " + ", ".join(f"{k} {n}" for k, n in
                                                      v["classes"].items() if n)
                            for t, v in gc["by_t"].items())
        L.append(f"- **{name}**: the best random MLP is {j['best_over_default']:.3f}x the "
                 f"default; the best baseline {gap:.3f}x. Relaxed derivatives of the "
                 f"{gc['coords']} last-layer weights at the default against exact "
                 f"central differences (h = {gc['h']:g}, tuner.search.gradcheck.classify): "
                 f"{classes} ({c['wall_s']:.0f} s)."
                 + (" Hand-made rules (x the default): " + ", ".join(
                     f"{k} {v:.4g} ({v / c['default']:.3f}x)"
                     for k, v in c["heuristics"].items()) + "." if c.get("heuristics")
                    else "")
                 + (f" Descent not run: {c['descent']['not_run']}."
                    if c["descent"].get("not_run") else ""))
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.learned_stakes",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated cases (default: all of {', '.join(CASES)})")
    ap.add_argument("--target", default="inflation", choices=list(SYSTEMS),
                    help="what the MLP sets: each request's inflation (default) or its "
                    "scheduling priority")
    ap.add_argument("--system", default=None,
                    help="inflation: whose reservation the MLP scales, one of "
                    f"{', '.join(SYSTEMS['inflation'])} (default odma); priority: one of "
                    f"{', '.join(SYSTEMS['priority'])} (default paged)")
    ap.add_argument("--requests", type=int, default=N,
                    help=f"requests per workload realisation (default {N})")
    ap.add_argument("--quick", action="store_true", help="a small run (a test)")
    args = ap.parse_args(argv)
    try:
        names = pick_cases(args.cases, CASES)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.system = args.system or SYSTEM[args.target]
    if args.system not in SYSTEMS[args.target]:
        print(f"error: --system {args.system!r}: with --target {args.target}, one of "
              f"{', '.join(SYSTEMS[args.target])}", file=sys.stderr)
        return 2
    if args.requests < 2:
        print(f"error: --requests {args.requests}: must be >= 2", file=sys.stderr)
        return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    compile_cache.enable()
    import jax

    size = (dict(n=60, seeds=1, uniform=4, normal=4, steps=2,
                 slots=dict(n_slots=32, max_batch=32)) if args.quick else
            dict(n=args.requests, seeds=2, uniform=32, normal=16, steps=DESCENT_STEPS,
                 slots={}))
    res = {"system": args.system, "target": args.target, "objective": OBJECTIVE,
           "quick": args.quick,
           "jax": jax.__version__, "settings": size, "cases": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        res["cases"][name] = run_case(name, CASES[name], **size, system=args.system,
                                      target=args.target)
        write_result(args.out, "learned_stakes", res, render)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
