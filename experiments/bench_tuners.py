"""Benchmark: the gradient tuner against Optuna TPE, CMA-ES and random search.

Every method tunes the same system (ODMA by default) on the same problem: the training
scenarios that :func:`tuner.fitting.fit` builds for a ``(trace, seed)`` pair (``crn``
common-random-number workloads, ``n_steps`` iterations each) and the default objective.
Every method is scored on the exact-mode objective of that problem, and every method pays
for what it simulates in one unit: simulated request-iterations, as counted by
:class:`tuner.problem.Problem` (one exact evaluation = ``n_crn * n_steps * n_slots``; a
gradient step = 3 of them; the tuner's finite differences and exact checks count too).
Budgets are reported in exact evaluations of that problem.

* ``gradient``: :func:`tuner.fitting.fit` with ``budget`` steps, run once; its curve is
  the best exact objective the tuner itself has measured (the start and its exact checks)
  against the cost it had spent when it measured it.
* ``tpe``: Optuna's TPE sampler (multivariate), one trial at a time, the default policy
  enqueued as the first trial.
* ``cma``: CMA-ES (``cma``), started at the default policy, ``sigma0`` in theta space,
  one generation per vmapped batch.
* ``random``: uniform in the theta box, the default policy first, vmapped batches.

The black-box methods search the tuner's own unconstrained space (:class:`tuner.space.
Space`), restricted to the box ``[-box, box]`` per coordinate (the default policy lies
inside it). For each ``(trace, seed)`` the reference is the best exact objective any
method found; a method "reaches" it at the first cost where its best-so-far is within 1%.

Usage (from the repository root; needs ``pip install -e .[bench]``)::

    python -m experiments.bench_tuners --out results/bench     # the full run
    python -m experiments.bench_tuners --quick --out /tmp/b    # a smoke run (~1-2 min)

Writes ``bench_tuners.json`` (settings, every evaluation, curves, summary),
``bench_tuners.md`` (tables, also printed) and ``bench_tuners.png`` (curves) to ``--out``.
Set ``JAX_COMPILATION_CACHE_DIR`` to reuse compiled simulators between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from tuner.atomic import plain, write_bytes_atomic, write_json_atomic, write_text_atomic

__all__ = [
    "FULL",
    "METHODS",
    "QUICK",
    "BenchConfig",
    "best_so_far",
    "cost_to_reach",
    "main",
    "render_markdown",
    "run_task",
    "summarise",
]

SCHEMA_VERSION = 1
METHODS = ("gradient", "hybrid", "tpe", "cma", "random")
GRADIENT_METHODS = ("gradient", "hybrid")
TOLERANCE = 0.01      # "within 1% of the best objective any method finds"
TARGET_RATIO = 5.0    # the gradient tuner should need 5x less budget than TPE
LADDER = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024)


@dataclass(frozen=True)
class BenchConfig:
    traces: tuple = ("azure-conv", "sharegpt")
    seeds: int = 5
    first_seed: int = 0
    system: str = "odma"
    objective: str = "tps_mig"          # the ODMA papers' target (results below)
    margin: float = 0.0          # FitSettings.margin: 0 compares the tuners on the bounds
                                 # as given (the held-out margin is a fit choice, not theirs)
    n_requests: int = 200
    n_slots: int = 64
    tp: int = 1                  # tensor parallelism: 1 keeps the server memory-bound
    rate: float = 0.0            # offered load, req/s (0: the trace's own / default)
    crn: int = 2                 # CRN workloads per evaluation (as FitSettings.crn)
    grad_steps: int = 16         # FitSettings.budget of the gradient tuner
    check_every: int = 1         # the gradient tuner's exact-check cadence
    explore: int = 8             # hybrid: FitSettings.explore (random exact samples first)
    budget: int = 160            # exact evaluations for each black-box method
    tpe_batch: int = 1           # trials asked before telling (1: sequential TPE)
    box: float = 5.0             # theta box for TPE and random search (and CMA bounds)
    sigma0: float = 1.0          # CMA-ES initial step size in theta space

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FULL = BenchConfig()
QUICK = BenchConfig(traces=("azure-conv",), seeds=2, n_requests=100, n_slots=32, crn=1,
                    grad_steps=3, check_every=1, explore=4, budget=24)


# ---------------------------------------------------------------------------------------
# one (trace, seed) problem: all four methods


class _Flat:
    """theta dict <-> flat vector over the Space's coordinates."""

    def __init__(self, space):
        import jax.numpy as jnp

        self._jnp = jnp
        self.shapes = {n: tuple(np.shape(space.base[n])) for n in space.names}
        self.labels = [f"{n}[{i}]" for n, i in space.coords()]

    def vec(self, theta) -> np.ndarray:
        return np.concatenate([np.asarray(theta[n], np.float64).reshape(-1)
                               for n in self.shapes])

    def theta(self, x) -> dict:
        out, i = {}, 0
        for n, shape in self.shapes.items():
            k = int(np.prod(shape))
            out[n] = self._jnp.asarray(np.reshape(x[i:i + k], shape), self._jnp.float32)
            i += k
        return out


class _Meter:
    """Evaluations of one method on the shared problem, with the cost each one left."""

    def __init__(self, prob, flat):
        self.prob, self.flat = prob, flat
        self.cost0 = prob.cost
        self.costs, self.values = [], []

    def _log(self, vals):
        per = self.prob.n_crn * self.prob.n_steps * self.prob.n_slots
        start = self.prob.cost - per * len(vals)  # batch already paid; order within it
        for j, v in enumerate(vals):
            self.costs.append(start + per * (j + 1) - self.cost0)
            self.values.append(float(v) if math.isfinite(v) else -math.inf)

    def one(self, x) -> float:
        v, _ = self.prob.value(self.flat.theta(x))
        self._log([v])
        return self.values[-1]

    def batch(self, xs) -> list[float]:
        vals = self.prob.batch([self.flat.theta(x) for x in xs])
        self._log([float(v) for v in vals])
        return self.values[-len(xs):]


def _run_random(meter, x0, cfg, seed, batch):
    rng = np.random.default_rng(seed)
    meter.one(x0)
    while len(meter.values) < cfg.budget:
        xs = rng.uniform(-cfg.box, cfg.box, size=(batch, len(x0)))
        meter.batch(list(xs))


def _run_cma(meter, x0, cfg, seed, batch):
    import cma

    meter.one(x0)
    es = cma.CMAEvolutionStrategy(np.clip(x0, -cfg.box, cfg.box), cfg.sigma0, {
        "seed": seed + 1, "popsize": batch, "bounds": [-cfg.box, cfg.box],
        "verbose": -9})
    while len(meter.values) < cfg.budget:
        xs = es.ask()
        vals = meter.batch(xs)
        # CMA minimises; a failed (non-finite) evaluation is the worst value seen
        worst = min([v for v in meter.values if math.isfinite(v)], default=0.0)
        es.tell(xs, [-(v if math.isfinite(v) else worst) for v in vals])


def _run_tpe(meter, x0, cfg, seed, labels):
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    dists = {k: FloatDistribution(-cfg.box, cfg.box) for k in labels}
    study.enqueue_trial({k: float(np.clip(v, -cfg.box, cfg.box))
                         for k, v in zip(labels, x0)})
    while len(meter.values) < cfg.budget:
        trials = [study.ask(dists) for _ in range(min(cfg.tpe_batch,
                                                      cfg.budget - len(meter.values)))]
        xs = [np.array([t.params[k] for k in labels]) for t in trials]
        vals = [meter.one(xs[0])] if len(xs) == 1 else meter.batch(xs)
        for t, v in zip(trials, vals):
            if math.isfinite(v):
                study.tell(t, v)
            else:
                study.tell(t, state=TrialState.FAIL)


def run_task(trace: str, seed: int, cfg: BenchConfig) -> dict:
    """All methods on one ``(trace, seed)`` problem; costs in exact evaluations."""
    from tuner.fitting import FitSettings, build_problem, fit
    from tuner.scenario import ScenarioSpec

    spec = ScenarioSpec(trace=trace, n_requests=cfg.n_requests, n_slots=cfg.n_slots,
                        max_batch=cfg.n_slots, seed=seed, tp=cfg.tp,
                        rate=cfg.rate if cfg.rate > 0 else None)
    runs, wall, fits = {}, {}, {}
    for name, explore in (("gradient", 0), ("hybrid", cfg.explore)):
        st = FitSettings(system=cfg.system, objective=cfg.objective, margin=cfg.margin,
                         budget=cfg.grad_steps, crn=cfg.crn, check_every=cfg.check_every,
                         explore=explore, box=cfg.box, seed=seed)
        log = []  # (cost in request-iterations, exact objective) of every exact evaluation
        t0 = time.perf_counter()
        res = fit(spec, st, log=lambda s: None,
                  listeners=[lambda cost, theta, v, log=log: log.append((cost, v))])
        wall[name] = time.perf_counter() - t0
        unit = res.unit
        runs[name] = {"cost": [c / unit for c, _ in log], "value": [v for _, v in log],
                      "spent": res.cost / unit}
        fits[name] = {"floor": res.floor, "estimators": res.estimators,
                      "steps": res.steps, "params": res.params,
                      "best_exact": res.best_exact}
    # the black-box methods share one problem, built as fit builds it (compiled code is
    # reused: equal shapes and static settings)
    prob, _ = build_problem(spec, st)
    flat = _Flat(prob.space)
    x0 = flat.vec(prob.space.to_theta(prob.space.base))
    batch = 2 * len(flat.labels)  # the size fit's finite differences already compiled
    for name in METHODS[2:]:
        meter = _Meter(prob, flat)
        t0 = time.perf_counter()
        if name == "tpe":
            _run_tpe(meter, x0, cfg, seed, flat.labels)
        elif name == "cma":
            _run_cma(meter, x0, cfg, seed, batch)
        else:
            _run_random(meter, x0, cfg, seed, batch)
        wall[name] = time.perf_counter() - t0
        runs[name] = {"cost": [c / unit for c in meter.costs], "value": meter.values,
                      "spent": (prob.cost - meter.cost0) / unit}
    for name, r in runs.items():
        r["wall_s"] = wall[name]
    best = max(max(r["value"], default=-math.inf) for r in runs.values())
    return {"trace": trace, "seed": seed, "n_steps": prob.n_steps, "n_crn": prob.n_crn,
            "n_slots": prob.n_slots, "unit_request_iterations": unit,
            "default_objective": runs["random"]["value"][0], "best_objective": best,
            "gradient_fits": fits, "runs": runs}


# ---------------------------------------------------------------------------------------
# scoring (pure; the tests call these directly)


def best_so_far(costs, values, budgets) -> list:
    """Best value among evaluations whose cost is <= each budget (None: none yet)."""
    out = []
    for b in budgets:
        seen = [v for c, v in zip(costs, values) if c <= b + 1e-9]
        out.append(max(seen) if seen else None)
    return out


def within(value: float, best: float, tol: float = TOLERANCE) -> bool:
    return value >= best - tol * abs(best)


def cost_to_reach(costs, values, best: float, tol: float = TOLERANCE):
    """First cost at which the best-so-far is within ``tol`` of ``best`` (None: never)."""
    for c, v in zip(costs, values):
        if within(v, best, tol):
            return float(c)
    return None


def _median(xs):
    """Median with None as 'never' (infinite): None when at least half never reach."""
    vals = sorted(math.inf if x is None else x for x in xs)
    if not vals:
        return None
    n = len(vals)
    m = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    return None if math.isinf(m) else float(m)


def _stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": float(np.median(xs)), "min": float(min(xs)),
            "max": float(max(xs)), "n": len(xs)}


def budgets_for(tasks, cfg: BenchConfig) -> list:
    """The ladder up to the most any method spent, with the black-box budget on it."""
    top = math.ceil(max(r["spent"] for t in tasks for r in t["runs"].values()))
    return sorted({b for b in LADDER if b < top} | {min(cfg.budget, top), top})


def summarise(tasks: list, cfg: BenchConfig) -> dict:
    budgets = budgets_for(tasks, cfg)
    curves, reach, ratio = {}, {}, {}
    for trace in cfg.traces:
        ts = sorted((t for t in tasks if t["trace"] == trace), key=lambda t: t["seed"])
        curves[trace], reach[trace] = {}, {}
        for m in METHODS:
            per_seed, norm = [], []
            for t in ts:
                r = t["runs"][m]
                # a run that ended below a budget fits in it: its final best carries on
                b = best_so_far(r["cost"], r["value"], budgets)
                per_seed.append(b)
                best = t["best_objective"]
                norm.append([x / best if x is not None and best > 0 else None for x in b])
            curves[trace][m] = {
                "best": per_seed,
                "stats": [_stats([s[i] for s in per_seed]) for i in range(len(budgets))],
                "normalised": [_stats([s[i] for s in norm]) for i in range(len(budgets))]}
            costs = [cost_to_reach(t["runs"][m]["cost"], t["runs"][m]["value"],
                                   t["best_objective"]) for t in ts]
            reach[trace][m] = {"per_seed": costs, "median": _median(costs),
                               "reached": sum(c is not None for c in costs),
                               "seeds": len(costs),
                               "spent_max": max(t["runs"][m]["spent"] for t in ts)}
        for g in GRADIENT_METHODS:
            ratio.setdefault(g, {})[trace] = _ratio(reach[trace], g)
    pooled = {}
    for m in METHODS:
        costs = [c for tr in cfg.traces for c in reach[tr][m]["per_seed"]]
        pooled[m] = {"per_seed": costs, "median": _median(costs),
                     "reached": sum(c is not None for c in costs), "seeds": len(costs),
                     "spent_max": max(reach[tr][m]["spent_max"] for tr in cfg.traces)}
    met = {}
    for g in GRADIENT_METHODS:
        ratio[g]["all"] = _ratio(pooled, g)
        met[g] = all(q["value"] is not None and q["value"] >= TARGET_RATIO
                     for q in ratio[g].values())
    return {"budgets": budgets, "curves": curves, "to_within_1pct": reach,
            "pooled_to_within_1pct": pooled, "ratio_tpe_over": ratio,
            "target_ratio": TARGET_RATIO, "target_met": met}


def _ratio(reach: dict, method: str = "gradient") -> dict:
    """TPE's median budget to the 1% band over ``method``'s (a bound if TPE did not get
    there in half the seeds; none if ``method`` did not)."""
    g, p = reach[method]["median"], reach["tpe"]["median"]
    if g is None:
        return {"value": None, "bound": None, "note": f"{method} did not reach the "
                "1% band in at least half the seeds"}
    if p is None:
        return {"value": None, "bound": reach["tpe"]["spent_max"] / g,
                "note": "TPE did not reach the 1% band in at least half the seeds within "
                        "its budget: the ratio is at least the bound"}
    return {"value": p / g, "bound": None, "note": ""}


# ---------------------------------------------------------------------------------------
# report


def _fmt(x, digits=4):
    if x is None:
        return "-"
    return f"{x:.{digits}g}"


def render_markdown(doc: dict) -> str:
    cfg, s = doc["settings"], doc["summary"]
    setup = (
        f"System `{cfg['system']}`, objective `{cfg['objective']}`; traces "
        f"{', '.join(cfg['traces'])}; {cfg['seeds']} seeds each (scenario seed = method "
        f"seed); {cfg['n_requests']} requests, {cfg['n_slots']} slots, tp "
        f"{cfg['tp']}, {cfg['crn']} CRN workloads per evaluation. Gradient tuner: "
        f"{cfg['grad_steps']} steps, exact check every {cfg['check_every']}. Black-box "
        f"methods: {cfg['budget']} exact evaluations each (TPE batch {cfg['tpe_batch']}, "
        f"theta box +-{cfg['box']}, CMA sigma0 {cfg['sigma0']}). Budget unit: one exact "
        "evaluation of the training problem (n_crn x n_steps x n_slots simulated "
        "request-iterations; a gradient step costs 3). Runtime "
        f"{doc['runtime_s']:.0f} s with {doc['jobs']} worker(s).")
    reach_doc = (
        "Median over seeds of the first cost (exact evaluations) at which a method's "
        "best exact objective is within 1% of the best found by any method on that "
        "(trace, seed); '-' when at least half the seeds never get there.")
    lines = ["# Tuner benchmark: gradient vs Optuna TPE, CMA-ES, random search", "",
             setup, "",
             "## Budget to reach within 1% of the best objective any method found", "",
             reach_doc, "",
             "| trace | " + " | ".join(METHODS) + " | TPE / gradient | TPE / hybrid |",
             "|---|" + "---|" * (len(METHODS) + 2)]
    reach = dict(s["to_within_1pct"], all=s["pooled_to_within_1pct"])
    for tr, rows in reach.items():
        cells = []
        for m in METHODS:
            r = rows[m]
            per = [c for c in r["per_seed"] if c is not None]
            spread = f" [{min(per):.0f}-{max(per):.0f}]" if per else ""
            cells.append(f"{_fmt(r['median'])}{spread} ({r['reached']}/{r['seeds']})")
        for g in GRADIENT_METHODS:
            q = s["ratio_tpe_over"][g][tr]
            cells.append(f"{q['value']:.2f}x" if q["value"] is not None else
                         f">= {q['bound']:.2f}x" if q["bound"] is not None else "n/a")
        name = tr if tr != "all" else "all (pooled)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    verdict = (
        "Cells: median [min-max over the seeds that reached] (seeds reached / seeds). "
        "`hybrid` is the gradient tuner started from the best of "
        f"{cfg['explore']} random exact samples in the theta box (`FitSettings.explore`). "
        "Target: the gradient tuner reaches the 1% band with "
        f">= {s['target_ratio']:.0f}x less budget than TPE on every trace and pooled: "
        + "; ".join(f"{g} **{'met' if s['target_met'][g] else 'not met'}**"
                    + (f" ({s['ratio_tpe_over'][g]['all']['note']})"
                       if s["ratio_tpe_over"][g]["all"]["note"] else "")
                    for g in GRADIENT_METHODS) + ".")
    lines += ["", verdict, ""]
    curve_doc = (
        "Median [min, max] over seeds of the best exact objective reached within the "
        "budget; in parentheses the median share of the best any method found on the "
        "same seed; '-' before a method's first exact value. A run that ended below a "
        "budget (black-box methods at their budget, the gradient tuner after its steps) "
        "keeps its final best at larger budgets.")
    for tr in cfg["traces"]:
        lines += [f"## Best exact objective vs budget: {tr}", "", curve_doc, "",
                  "| budget | " + " | ".join(METHODS) + " |",
                  "|---:|" + "---|" * len(METHODS)]
        for i, b in enumerate(s["budgets"]):
            cells = []
            for m in METHODS:
                st = s["curves"][tr][m]["stats"][i]
                nm = s["curves"][tr][m]["normalised"][i]
                cells.append("-" if st["median"] is None else
                             f"{_fmt(st['median'])} [{_fmt(st['min'], 3)}, "
                             f"{_fmt(st['max'], 3)}] ({_fmt(100 * nm['median'], 3)}%)")
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Per (trace, seed)", "",
              ("| trace | seed | default | best | " + " | ".join(METHODS)
               + " | wall s (" + "/".join(m[0] for m in METHODS) + ") |"),
              "|---|---:|---:|---:|" + "---:|" * len(METHODS) + "---|"]
    for t in doc["tasks"]:
        finals = [max(t["runs"][m]["value"], default=None) for m in METHODS]
        walls = "/".join(f"{t['runs'][m]['wall_s']:.0f}" for m in METHODS)
        lines.append(f"| {t['trace']} | {t['seed']} | {_fmt(t['default_objective'])} | "
                     f"{_fmt(t['best_objective'])} | "
                     + " | ".join(_fmt(v) for v in finals) + f" | {walls} |")
    lines += ["", ("Final columns: best exact objective each method reached with its "
                   "whole budget (gradient, hybrid: every exact evaluation the tuner made; the "
                   "gradient's wall time includes compiling the problem).")]
    return "\n".join(lines) + "\n"


def render_plot(doc: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, traces = doc["summary"], doc["settings"]["traces"]
    fig, axes = plt.subplots(1, len(traces), figsize=(5.5 * len(traces), 4.2),
                             squeeze=False)
    budgets = np.asarray(s["budgets"], float)
    for ax, tr in zip(axes[0], traces):
        for m in METHODS:
            st = s["curves"][tr][m]["normalised"]
            ok = np.array([x["median"] is not None for x in st])
            if not ok.any():
                continue
            med = np.array([x["median"] for x in st], dtype=float)[ok]
            lo = np.array([x["min"] for x in st], dtype=float)[ok]
            hi = np.array([x["max"] for x in st], dtype=float)[ok]
            (line,) = ax.plot(budgets[ok], med, marker="o", ms=3, label=m,
                            drawstyle="steps-post")
            ax.fill_between(budgets[ok], lo, hi, color=line.get_color(), alpha=0.18,
                            step="post")
        ax.axhline(1 - TOLERANCE, color="k", lw=0.8, ls="--", label="within 1%")
        ax.set_xscale("log")
        ax.set_title(tr)
        ax.set_xlabel("budget (exact evaluations of the training problem)")
        ax.set_ylabel("best exact objective / best found by any method")
        ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]), top=1.02)
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower right")
    fig.suptitle("Best exact objective vs budget: median over seeds, band = min-max")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------
# CLI


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m experiments.bench_tuners",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 trace, 2 seeds, tiny problem and budgets")
    ap.add_argument("--out", type=Path, default=Path("results/bench_tuners"))
    ap.add_argument("--jobs", type=int, default=None,
                    help="worker processes, one (trace, seed) each (default: cores)")
    for f in dataclasses.fields(BenchConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "traces":
            ap.add_argument(flag, nargs="+", default=None)
        else:
            ap.add_argument(flag, type=type(f.default), default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    missing = []
    for mod in ("optuna", "cma"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print(f"error: {', '.join(missing)} not installed; install the benchmark extra: "
              "pip install -e .[bench]", file=sys.stderr)
        return 2
    cfg = QUICK if args.quick else FULL
    over = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)
            if getattr(args, f.name) is not None}
    if "traces" in over:
        over["traces"] = tuple(over["traces"])
    cfg = dataclasses.replace(cfg, **over)
    if cfg.seeds < 1 or cfg.budget < 1 or cfg.grad_steps < 1 or cfg.tpe_batch < 1:
        print("error: --seeds, --budget, --grad-steps and --tpe-batch must be >= 1",
              file=sys.stderr)
        return 2
    jobs_list = [(tr, cfg.first_seed + k) for tr in cfg.traces for k in range(cfg.seeds)]
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(jobs_list)))
    t0 = time.perf_counter()
    tasks = []
    try:
        if jobs == 1:
            for tr, seed in jobs_list:
                tasks.append(_done(run_task(tr, seed, cfg), t0))
        else:
            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as ex:
                futs = [ex.submit(run_task, tr, seed, cfg) for tr, seed in jobs_list]
                for f in futs:
                    tasks.append(_done(f.result(), t0))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc = {"schema_version": SCHEMA_VERSION, "settings": cfg.to_dict(),
           "methods": list(METHODS), "seeds": [cfg.first_seed + k for k in
                                                range(cfg.seeds)],
           "budget_unit": "exact evaluations of the (trace, seed) training problem; "
                          "tasks[].unit_request_iterations converts to simulated "
                          "request-iterations",
           "jobs": jobs, "tasks": tasks, "summary": summarise(tasks, cfg)}
    doc["runtime_s"] = time.perf_counter() - t0
    md = render_markdown(doc)
    out = args.out
    # plain(): -inf (a failed evaluation) and other non-finite values -> null
    write_json_atomic(out / "bench_tuners.json", plain(doc), sort_keys=False, indent=1)
    write_text_atomic(out / "bench_tuners.md", md)
    write_bytes_atomic(out / "bench_tuners.png", render_plot(doc))
    print(md)
    print(f"wrote {out}/bench_tuners.{{json,md,png}}", file=sys.stderr)
    return 0


def _done(task: dict, t0: float) -> dict:
    g = task["runs"]["gradient"]
    print(f"[{time.perf_counter() - t0:6.0f} s] {task['trace']} seed {task['seed']}: "
          f"best {task['best_objective']:.5g}, default {task['default_objective']:.5g}, "
          f"gradient {max(g['value']):.5g} in {g['spent']:.0f} evals", file=sys.stderr)
    return task


if __name__ == "__main__":
    sys.exit(main())
