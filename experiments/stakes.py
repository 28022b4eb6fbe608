"""Stakes: does the memory policy decide goodput on a deployment, before any tuning?

``python -m experiments.stakes --out DIR [--system odma] [--cases a,b] [--policies 64]
[--realisations 2] [--quick]``

Issue 31's criterion for a tuning problem worth having: over ``--policies`` random
policies of the system (uniform in the same box of the unconstrained parameters as the
random search, ``tuner.search.blackbox``), best / worst goodput >= 1.5 and best /
default >= 1.1. For each case (:data:`CASES`) the script evaluates the system's default,
the random policies and the baselines exactly (``tuner.objective.evaluate.evaluate_many``,
batched), each on the same ``--realisations`` workload realisations (seeds: the length
predictions' error draws, and the arrivals when the trace has no times), and reports
both goodputs (every search after the default's starts from rungs at 0.6-1.4 x the
default's goodput, :data:`RUNGS_AROUND_DEFAULT`, and halves or doubles from there):

* ``goodput_rps``: the highest rate at which >= 90% of the requests (pooled over the
  realisations) meet both SLOs: a count, so it moves in steps of one request;
* ``goodput_expected_rps``: the same with each request's probability of meeting its
  SLOs under lognormal latency noise (``models.outcomes.SLO_NOISE``), the smooth exact
  objective.

Nothing is tuned here; the criterion is measured, so that a case is chosen as a default
or a benchmark by it and never by a tuner's result.

Writes ``stakes.json`` and ``stakes.md`` (atomically, again after every case) to
``--out``; progress goes to stderr. Exit 0: every case ran; 2: bad arguments.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # progress from the first second: the imports take ~2 s
    print("experiments.stakes: starting", file=sys.stderr, flush=True)

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from experiments.results_io import pick_cases, write_result  # noqa: E402
from tuner.common import compile_cache  # noqa: E402
from tuner.common.atomic import unwritable_reason  # noqa: E402

__all__ = ["CASES", "BEST_OVER_WORST", "BEST_OVER_DEFAULT", "floor_worst", "judge", "main",
           "random_thetas", "rank_agreement", "run_case", "render"]

SYSTEM = "odma"
BASELINES = ("static", "paged", "s3")
BEST_OVER_WORST = 1.5     # issue 31, item 1
BEST_OVER_DEFAULT = 1.1
BOX = 5.0                 # the random search's box (tuner.search.blackbox.search)
N = 1000
# the rungs every policy's goodput search starts from, x the default's goodput
RUNGS_AROUND_DEFAULT = np.geomspace(0.6, 1.4, 4)
AGREE_T = (0.3, 0.1)      # the relaxed surrogate's temperatures in rank_agreement
# (name, ScenarioSpec fields, one-line description)
CASES = (
    ("builtin", dict(n_requests=N),
     "the built-in workload (Azure conversation lengths and times), "
     "DeepSeek-R1-Distill-Qwen-7B on MLU370-X4 (TP4): the main job's default"),
    ("builtin-tight", dict(n_requests=N, capacity_tokens=200_000),
     "the built-in workload with the KV capacity cut to 200k tokens"),
    ("azure-3090", dict(trace="azure-conv", n_requests=N, hardware="rtx-3090-24gb",
                        model="llama-3.1-8b", tp=1),
     "Azure conversation trace (real arrivals, first 1,000 requests), Llama-3.1-8B on "
     "one 24 GB RTX 3090: what is left of 24 GB after the weights holds the KV"),
)
QUICK = dict(n_requests=200, n_slots=32, max_batch=32)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def random_thetas(system: str, sc, n: int, seed: int = 0):
    """(space, ``n`` unconstrained points uniform in ``[-BOX, BOX]`` of every coordinate:
    the random search's distribution) around the system's default."""
    from models import get_system, validate_params
    from tuner.objective.space import Space
    from tuner.search.blackbox import Flat

    spec = get_system(system)
    space = Space(spec, validate_params(spec, {}, sc.cfg.max_len, sc.hw, sc.deployment))
    flat = Flat(space)
    rng = np.random.default_rng(seed)
    return space, [flat.theta(rng.uniform(-BOX, BOX, len(flat))) for _ in range(n)]


def rank_agreement(scs, system: str, space, thetas: list, exact: list[float],
                   temperatures=AGREE_T) -> dict:
    """Kendall's tau between the exact expected goodput of the policies (default first,
    then ``thetas``) and the tuner's surrogate of it: the fit's objective on its rate
    ladder (``tuner.objective.problem``: fixed horizon, rungs around the default's
    goodput, the same realisations as CRN stack) in relaxed mode at each temperature
    and in exact mode (T = 0). Tells a user whether the relaxed objective orders
    policies as the exact one does."""
    import jax
    from scipy import stats

    from tuner.objective.objectives import parse_objective
    from tuner.objective.problem import Problem, plan_ladder

    zero = jax.tree.map(np.zeros_like, thetas[0])
    every = [zero] + list(thetas)
    rates, n_steps, _ = plan_ladder(list(scs), system, space.to_params(zero))
    prob = Problem(list(scs), system, space, parse_objective("goodput_expected_rps"),
                   n_steps, rates)
    out = {"n": len(every), "horizon_steps": n_steps,
           "rungs_rps": np.asarray(rates).tolist(), "tau": {}}
    for t in (*temperatures, 0.0):
        v = prob.batch(every, t=t)
        tau = stats.kendalltau(v, exact).statistic
        out["tau"][f"{t:g}"] = None if np.isnan(tau) else float(tau)
        _log(f"  surrogate at T={t:g}: Kendall tau {tau:.2f} against the exact goodput")
    return out


def floor_worst(values, below, floor: float | None) -> float:
    """The worst of ``values`` where ``below[i]`` means value ``i`` is only known to lie
    below ``floor`` (its goodput search stopped there): such a value counts as the floor,
    an upper bound on the worst."""
    return min(floor if b else x for x, b in zip(values, below))


def judge(default: float, others: list[float], below=None,
          floor: float | None = None) -> dict:
    """Issue 31's stakes criterion on the default's goodput and a sample of the other
    policies' (best over all, worst over the sample): the ratios, whether it ``meets``
    both thresholds, and how many distinct values the sample holds. ``below[i]``: policy
    ``i``'s goodput is only known to lie below ``floor`` (its search stopped there);
    the worst is then below the floor and best / worst at least best / floor
    (``best_over_worst_bound`` True)."""
    below = [False] * len(others) if below is None else list(below)
    best, worst = max(others + [default]), floor_worst(others, below, floor)
    bound = any(below)
    r = {"default": default, "best": best, "worst": worst,
         "median_random": float(np.median(others)),
         "best_over_worst": best / worst if worst > 0 else float("inf"),
         "best_over_worst_bound": bound, "below_floor": int(sum(below)),
         "floor": floor,
         "best_over_default": best / default if default > 0 else float("inf"),
         "distinct_values": len({round(x, 9) for x in others + [default]})}
    r["meets"] = bool(r["best_over_worst"] >= BEST_OVER_WORST
                      and r["best_over_default"] >= BEST_OVER_DEFAULT)
    return r


def summary_line(name: str, wall: float, r: dict) -> str:
    """The progress line a case ends with (expected goodput: default, best, worst)."""
    return (f"{name}: {wall:.0f} s; expected goodput default {r['default']:.3f}, best "
            f"{r['best']:.3f}, worst {r['worst']:.3f} req/s")


def run_case(name: str, fields: dict, n_policies: int, realisations: int,
             quick: bool, system: str = SYSTEM, agreement: bool = True,
             floor_share: float | None = None) -> dict:
    """One case: the default, ``n_policies`` random policies and the baselines, exact.
    ``floor_share``: the policies' goodput searches run no rate below that share of the
    default's goodput (``capacity_search``'s floor); a policy that misses the SLOs there
    is reported as below it (the criterion then holds a bound on best / worst, and the
    rank agreement is over the other policies)."""
    from tuner.objective.evaluate import evaluate_many
    from tuner.scenario import ScenarioSpec, build_scenario

    spec = ScenarioSpec(**{**fields, **(QUICK if quick else {})})
    scs = tuple(build_scenario(spec.replace(seed=s)) for s in range(realisations))
    distinct = len({np.asarray(sc.workload.pred_tokens).tobytes()
                    + np.asarray(sc.workload.arrival_s).tobytes() for sc in scs})
    space, thetas = random_thetas(system, scs[0], n_policies)
    pols = [{k: np.asarray(v) for k, v in space.to_params(th).items()} for th in thetas]
    jobs = ([(scs, system, {})] + [(scs, system, p) for p in pols]
            + [(scs, b, {}) for b in BASELINES])
    _log(f"{name}: {len(jobs)} policies x {realisations} realisation(s) "
         f"({distinct} distinct), {int(np.sum(scs[0].workload.valid))} requests each")
    t = time.perf_counter()
    # the default first (its own ladder from its saturation rate); every policy's search
    # then starts from rungs around the default's goodput (a policy far below them
    # halves down to its own crossing): the ladder's low rungs at 0.3 x saturation are
    # the longest runs, and most of them would bracket nothing
    first = evaluate_many(jobs[:1], objective="goodput_expected_rps", log=_log)[0]
    rungs = RUNGS_AROUND_DEFAULT * first["goodput_rps"]
    floor = None if floor_share is None else floor_share * first["goodput_rps"]
    res = [first] + evaluate_many(jobs[1:], objective="goodput_expected_rps",
                                  rates=[rungs] * (len(jobs) - 1), log=_log,
                                  floors=[floor] * (len(jobs) - 1))
    below = [bool(m["capacity"].get("below_floor")) for m in res]
    wall = time.perf_counter() - t
    out = {"spec": spec.to_dict(), "realisations": realisations,
           "distinct_realisations": distinct, "policies": n_policies,
           "requests": int(np.sum(scs[0].workload.valid)),
           "capacity_tokens": float(scs[0].cfg.capacity_tokens),
           "slo_s": [float(scs[0].cfg.ttft_slo_s), float(scs[0].cfg.tpot_slo_s)],
           "wall_s": wall, "runs": sum(int(m["capacity"]["runs"]) for m in res) *
           realisations, "floor_share": floor_share, "floor_rps": floor}
    for metric in ("goodput_rps", "goodput_expected_rps"):
        vals = [float(m[metric]) for m in res]
        r = judge(vals[0], vals[1:1 + n_policies], below[1:1 + n_policies], floor)
        r["baselines"] = dict(zip(BASELINES, vals[1 + n_policies:]))
        r["random"] = vals[1:1 + n_policies]
        r["random_below_floor"] = below[1:1 + n_policies]
        out[metric] = r
    if agreement:
        t = time.perf_counter()
        keep = [i for i in range(1, 1 + n_policies) if not below[i]]
        out["agreement"] = rank_agreement(
            scs, system, space, [thetas[i - 1] for i in keep],
            [float(m["goodput_expected_rps"]) for m in [res[0]] + [res[i] for i in keep]])
        out["agreement"]["wall_s"] = time.perf_counter() - t
    _log(summary_line(name, wall, out["goodput_expected_rps"]))
    return out


def render(res: dict) -> str:
    L = ["# Stakes: does the memory policy decide goodput before any tuning?", "",
         f"System {res['system']}; {res['policies']} random policies (uniform in "
         f"[-{BOX:g}, {BOX:g}] of every unconstrained coordinate, the random search's "
         f"box) beside the default and the baselines, each on {res['realisations']} "
         "workload realisation(s) (seeds), exact runs to completion"
         + (" (quick run: small slices)" if res["quick"] else "") + ". Criterion "
         f"(issue 31): best / worst >= {BEST_OVER_WORST} and best / default >= "
         f"{BEST_OVER_DEFAULT}.", "",
         "| case | requests | KV capacity (tokens) | goodput | default | worst | median "
         "| best | best / worst | best / default | distinct values | meets | "
         "static / paged / s3 |",
         "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, c in res["cases"].items():
        for metric in ("goodput_rps", "goodput_expected_rps"):
            r = c[metric]
            base = " / ".join(f"{v:.3f}" for v in r["baselines"].values())
            L.append(f"| {name} | {c['requests']} | {c['capacity_tokens']:.0f} | "
                     f"{metric} | {r['default']:.3f} | {r['worst']:.3f} | "
                     f"{r['median_random']:.3f} | {r['best']:.3f} | "
                     f"{r['best_over_worst']:.2f} | {r['best_over_default']:.2f} | "
                     f"{r['distinct_values']} | {'yes' if r['meets'] else 'no'} | "
                     f"{base} |")
    L += ["", "Goodputs in req/s. `goodput_expected_rps` counts each request's "
          "probability of meeting its SLOs under lognormal latency noise "
          "(models.outcomes.SLO_NOISE); `distinct values` counts different goodputs "
          "among the default and the random policies (a count-based goodput moves in "
          "steps).", ""]
    for name, c in res["cases"].items():
        L.append(f"- **{name}**: {c['description']}; {c['wall_s']:.0f} s, "
                 f"{c['runs']} runs to completion.")
    agree = {n: c["agreement"] for n, c in res["cases"].items() if "agreement" in c}
    if agree:
        ts = list(next(iter(agree.values()))["tau"])
        L += ["", "Rank agreement (Kendall's tau) of the tuner's surrogate with the exact "
              "expected goodput over the default and the random policies: the fit's "
              "objective on its rate ladder (rungs around the default's goodput, fixed "
              "horizon, the same realisations), relaxed at each temperature T and exact "
              "at T = 0. 1: the same order; 0: unrelated.", "",
              "| case | policies | " + " | ".join(f"T = {t}" for t in ts) + " |",
              "|---|---:|" + "---:|" * len(ts)]
        for n, a in agree.items():
            L.append(f"| {n} | {a['n']} | " + " | ".join(
                "-" if a["tau"][t] is None else f"{a['tau'][t]:.2f}" for t in ts) + " |")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.stakes",
                                 description=__doc__.split("\n\n")[1])
    ap.add_argument("--out", type=Path, required=True, help="result folder")
    ap.add_argument("--cases", default=",".join(c[0] for c in CASES),
                    help="comma-separated case names (default: all)")
    ap.add_argument("--system", default=SYSTEM,
                    help=f"the system whose policies vary (default {SYSTEM})")
    ap.add_argument("--policies", type=int, default=64)
    ap.add_argument("--realisations", type=int, default=2)
    ap.add_argument("--no-agreement", dest="agreement", action="store_false",
                    help="leave out the relaxed-vs-exact rank agreement")
    ap.add_argument("--quick", action="store_true", help="small slices (a test)")
    args = ap.parse_args(argv)
    known = {c[0]: c for c in CASES}
    try:
        names = pick_cases(args.cases, known)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for flag, v in (("--policies", args.policies), ("--realisations", args.realisations)):
        if v < 1:
            print(f"error: {flag} {v}: must be >= 1", file=sys.stderr)
            return 2
    from models import get_system, list_systems

    if args.system not in list_systems() or not get_system(args.system).tunable():
        print(f"error: --system {args.system!r}: not a system with tunable parameters "
              f"({', '.join(x for x in list_systems() if get_system(x).tunable())})",
              file=sys.stderr)
        return 2
    why = unwritable_reason(args.out)
    if why:
        print(f"error: --out {args.out}: {why}", file=sys.stderr)
        return 2
    compile_cache.enable()
    import jax

    res = {"system": args.system, "policies": args.policies, "realisations": args.realisations,
           "quick": args.quick, "cpus": os.cpu_count(), "jax": jax.__version__,
           "criterion": {"best_over_worst": BEST_OVER_WORST,
                         "best_over_default": BEST_OVER_DEFAULT}, "cases": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        _, fields, desc = known[name]
        c = run_case(name, fields, args.policies, args.realisations, args.quick,
                     args.system, args.agreement)
        c["description"] = desc
        res["cases"][name] = c
        write_result(args.out, "stakes", res, render)
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
