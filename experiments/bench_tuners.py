"""Benchmark: the gradient tuner against Optuna TPE, CMA-ES and random search, on
high-dimensional tuning problems.

Each problem is one exact-mode objective (goodput by default, the mean over the
problem's scenarios) of one system's policy with many interacting parameters:

* ``odma-16``: ODMA with 16 quantile levels and an inflation factor per bucket, plus
  the routing threshold and the large-pool share (system ``odma-pb``, 34 parameters), on
  one workload.
* ``fleet``: one ``odma-pb`` policy for a fleet: two devices x two workloads in one
  vmapped objective (the mean goodput of the four), a problem black-box search pays for
  once per (device, workload) pair.
* ``tokenpd-tiers``: Token-PD's eta, lambda, mu_0 and delta per priority tier of streams
  (system ``token-pd-tiers``, 4 tiers, 16 parameters). The eviction simulator reads no
  length predictions and the trace's arrivals are replayed, so a seed alone would not
  change its workload: seed ``s`` takes the trace's ``s``-th window of ``n_requests``
  (``seed_windows``).
* ``engine-fleet``: vLLM V1's engine arguments for each replica of a heterogeneous
  fleet (an H100 and an A100 80GB, each serving ShareGPT and the Azure conversation
  trace: 4 replicas, d = 16; ``FitSettings.fleet``), each replica from its device's
  defaults; the objective the mean of the replicas' goodputs (the fleet's goodput / 4
  under routing by capacity). Not in the default run.
* ``odma``: the paper's 6 parameters (the low-dimensional reference; not in the default
  run: ``experiments/results/bench_tuners_odma6/`` holds its figures).

Every method tunes the same problem (``tuner.search.fitting.build_problem`` of the problem's
scenarios for the seed), is scored on its exact objective, and pays in one unit: exact
evaluations of the problem. A gradient step is charged the measured ratio of a relaxed
forward + backward pass to an exact evaluation (timed in each task); every exact
evaluation a tuner makes (gradient checks, exploration, exact checks) is charged in full.

* ``gradient``: :func:`tuner.search.fitting.fit`, gradient checks along random directions.
* ``gradient-coords``: the same with per-coordinate checks (2 evaluations per parameter,
  and exact finite differences for every coordinate whose relaxed gradient disagrees).
* ``hybrid``: ``gradient`` started from the best of the start and ``explore`` random
  exact samples.
* ``guided``: CMA-ES steered by the relaxed gradient (:func:`tuner.search.blackbox.search`),
  each gradient charged at the measured gradient / evaluation cost ratio.
* ``tpe``, ``cmaes``, ``random``: :func:`tuner.search.blackbox.search` in the theta box.

Usage (from the repository root)::

    python -m experiments.bench_tuners --out experiments/results/bench_tuners
    python -m experiments.bench_tuners --quick --out /tmp/b    # a smoke run (~2 min)

Writes ``bench_tuners.json`` (settings, every evaluation, curves, summary),
``bench_tuners.md`` (tables, also printed) and ``bench_tuners.png`` (curves) to ``--out``;
the JSON's ``provenance`` (``tuner.common.provenance``: command, commit, source fingerprint) is
stamped as the markdown's last line.
Set ``JAX_COMPILATION_CACHE_DIR`` to reuse compiled simulators between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from experiments.bench_tuners_report import (BLACKBOX_METHODS, GRADIENT_METHODS,
                                             best_so_far, cost_to_reach, render_markdown,
                                             render_plot, summarise)
from tuner.common.atomic import (plain, unwritable_reason, write_bytes_atomic,
                                 write_json_atomic, write_text_atomic)

__all__ = ["FULL", "METHODS", "PROBLEMS", "QUICK", "BenchConfig", "TuneProblem",
           "best_so_far", "cost_to_reach", "main", "run_provenance", "run_task"]

SCHEMA_VERSION = 4  # 3: provenance; gradient quality counts "vanishing"; 4: the
#   provenance covers the tuners the worker processes ran
METHODS = GRADIENT_METHODS + BLACKBOX_METHODS


@dataclass(frozen=True)
class TuneProblem:
    name: str
    system: str
    doc: str
    traces: tuple = ("azure-conv",)
    hardware: tuple = ("mlu370-x4",)
    spec: dict = field(default_factory=dict)  # other ScenarioSpec fields
    # seed s starts the slice at request s x n_requests (consecutive, disjoint windows):
    # for a system whose workload the seed does not otherwise change (no length
    # predictions read, the trace's own arrival times)
    seed_windows: bool = False
    # one policy per scenario (a fleet's replicas, FitSettings.fleet): d = the system's
    # parameters x the scenarios
    fleet: bool = False

    def specs(self, cfg: "BenchConfig", seed: int) -> list:
        from tuner.scenario import ScenarioSpec

        base = dict(n_requests=cfg.n_requests, n_slots=cfg.n_slots, seed=seed,
                    max_len=cfg.max_len, tp=cfg.tp)
        base.update(self.spec)
        base["max_batch"] = base["n_slots"]
        if self.seed_windows:
            base["offset"] = base.get("offset", 0) + seed * base["n_requests"]
        return [ScenarioSpec(trace=tr, hardware=hw, **base)
                for hw in self.hardware for tr in self.traces]


PROBLEMS = {p.name: p for p in (
    TuneProblem("odma-16", "odma-pb", "16 buckets, a gamma per bucket, one workload"),
    TuneProblem("fleet", "odma-pb", "one odma-pb policy for 2 devices x 2 workloads",
                traces=("azure-conv", "sharegpt"), hardware=("mlu370-x4", "a100-80gb"),
                spec={"n_requests": 60}),
    # 32 streams on 16,000 KV tokens: memory binds (the device's own capacity would
    # hold every stream's whole context, and eviction would never act)
    TuneProblem("tokenpd-tiers", "token-pd-tiers",
                "Token-PD per priority tier, seed s: the trace's s-th 100-request window",
                spec={"n_requests": 100, "n_slots": 32, "capacity_tokens": 16000},
                seed_windows=True),
    TuneProblem("odma", "odma", "the paper's 6 parameters, one workload"),
    # the main job's deployment (tuner.scenario.deployments, h100-interactive): vLLM V1's
    # engine arguments, where the token budget and sequence count decide goodput
    # (best / default 1.62 over 16 random settings, experiments/results/
    # deployment_stakes/); seed s: the trace's s-th window of 1,000 requests
    TuneProblem("engine", "vllm-v1",
                "vLLM V1's engine arguments, the main job's deployment; seed s: the "
                "trace's s-th 1,000-request window",
                traces=("sharegpt",), hardware=("h100-80gb",),
                spec={"model": "qwen3-8b", "tp": 1, "n_requests": 1000,
                      "scheduler": "chunked", "n_slots": 512, "max_len": None,
                      "ttft_slo_s": 1.0, "tpot_slo_s": 0.02},
                seed_windows=True),
    # a heterogeneous fleet: vLLM V1 on an H100 and an A100 80GB, each serving ShareGPT
    # and the Azure conversation trace (4 replicas), each replica its own engine
    # arguments (d = 4 x 4 = 16); the objective the mean of the replicas' goodputs (the
    # fleet's goodput / 4 where a router splits traffic by capacity); seed s: the
    # traces' s-th window
    TuneProblem("engine-fleet", "vllm-v1",
                "vLLM V1's engine arguments per replica of a 4-replica fleet (H100, "
                "A100 x ShareGPT, Azure conversation); seed s: the s-th window",
                traces=("sharegpt", "azure-conv"), hardware=("h100-80gb", "a100-80gb"),
                spec={"model": "qwen3-8b", "tp": 1, "n_requests": 300,
                      "scheduler": "chunked", "n_slots": 512, "max_len": None,
                      "ttft_slo_s": 1.0, "tpot_slo_s": 0.02},
                seed_windows=True, fleet=True),
)}


@dataclass(frozen=True)
class BenchConfig:
    problems: tuple = ("odma-16", "fleet", "tokenpd-tiers")
    methods: tuple = ("gradient", "hybrid", "guided") + BLACKBOX_METHODS  # gradient-coords: opt in
    seeds: int = 5
    first_seed: int = 0
    objective: str = "default"   # goodput (tuner.objective.capacity)
    margin: float = 0.0          # FitSettings.margin: the bounds as given
    n_requests: int = 120
    n_slots: int = 128           # enough slots that KV memory, the policy's, binds
    max_len: int = 2048          # equal for every scenario of a problem
    tp: int = 1                  # tensor parallelism: 1 keeps the servers memory-bound
    crn: int = 1                 # CRN workloads per scenario
    grad_steps: int = 16         # FitSettings.budget of the gradient tuners
    check_every: int = 2         # their exact-check cadence
    check_dirs: int = 4          # gradient / hybrid: random directions checked
    explore: int = 7             # hybrid: random exact samples (+ the start: a batch of 8)
    budget: int = 129            # exact evaluations for each black-box method (1 + 16 x 8)
    batch: int = 8               # CMA-ES popsize and random-search batch
    box: float = 5.0             # theta box of the black-box methods and exploration
    sigma0: float = 1.0          # CMA-ES initial step size in theta space
    fd_step: float = 0.1         # finite-difference step (checks and quality table)
    temperatures: tuple = (0.3, 0.1, 0.03)
    guide_t: float = 0.1         # guided: the temperature of its relaxed gradients
    timing_reps: int = 3         # timed gradient and exact evaluations per task

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FULL = BenchConfig()
QUICK = BenchConfig(problems=("odma-16",), seeds=2, n_requests=40, n_slots=16, crn=1,
                    grad_steps=2, check_every=1, check_dirs=2, explore=3, budget=9,
                    batch=4, timing_reps=1)


def _settings(cfg: BenchConfig, pb: TuneProblem, seed: int, **over):
    from tuner.search.fitting import FitSettings

    return FitSettings(system=pb.system, fleet=pb.fleet, objective=cfg.objective, margin=cfg.margin,
                       budget=cfg.grad_steps, crn=cfg.crn, check_every=cfg.check_every,
                       check_dirs=cfg.check_dirs, box=cfg.box, seed=seed,
                       fd_step=cfg.fd_step, temperatures=tuple(cfg.temperatures),
                       **over)


def _time(fn, reps: int) -> float:
    fn()  # compile (or reuse) first
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def grad_cost(prob, theta, t: float, reps: int) -> dict:
    """Median wall time of a relaxed gradient over that of an exact evaluation (both
    compiled; ``block_until_ready`` via the float conversions in ``Problem``)."""
    cost0 = prob.cost
    tv = _time(lambda: prob.value(theta), reps)
    tg = _time(lambda: prob.grad(theta, t), reps)
    start = prob.value(theta)[0]
    prob.cost = cost0  # timing runs are no method's spending
    return {"value_s": tv, "grad_s": tg, "ratio": tg / tv, "start_value": start}


def gradient_quality(prob, theta, cfg: BenchConfig) -> dict:
    """Per parameter and temperature: how many coordinates' checks against the exact
    CRN central difference fall in each class of :func:`tuner.search.gradcheck.classify` (agree,
    disagree, vanishing, flat: the fit's rule)."""
    from tuner.search.gradcheck import CLASSES, check

    coords = prob.space.coords()
    fd = prob.fd(theta, coords, cfg.fd_step)
    per = {n: {"coords": 0, "by_t": [dict.fromkeys(CLASSES, 0)
                                     for _ in cfg.temperatures]} for n in prob.space.names}
    for n, _ in coords:
        per[n]["coords"] += 1
    raw = []
    for k, t in enumerate(cfg.temperatures):
        res, _, _ = check(prob, theta, t, fd, cfg.fd_step)
        for c in res:
            per[c.name]["by_t"][k][c.status] += 1
        raw.append([c.__dict__ for c in res])
    return {"per_parameter": per, "checks": raw}


def run_task(problem: str, seed: int, cfg: BenchConfig) -> dict:
    """Every method on one ``(problem, seed)``; costs in exact evaluations."""
    from tuner.search.fitting import build_problem, fit
    from tuner.search.blackbox import search

    pb = PROBLEMS[problem]
    specs = pb.specs(cfg, seed)
    prob, _ = build_problem(specs, _settings(cfg, pb, seed))
    theta0 = prob.space.to_theta(prob.space.base)
    timing = grad_cost(prob, theta0, cfg.temperatures[1], cfg.timing_reps)
    quality = gradient_quality(prob, theta0, cfg) if seed == cfg.first_seed else None
    runs = {}
    variants = {"gradient": {"checks": "directions"}, "gradient-coords": {"checks": "coords"},
                "hybrid": {"checks": "directions", "explore": cfg.explore}}
    for name in cfg.methods:
        log = []  # (cost in request-iterations, exact objective) of every evaluation
        t0 = time.perf_counter()
        if name in variants:
            res = fit(specs, _settings(cfg, pb, seed, **variants[name]), log=lambda s: None,
                      listeners=[lambda c, th, v, log=log: log.append((c, v))],
                      grad_cost=timing["ratio"])
            spent, extra = res.cost, {"floor": res.floor, "steps": res.steps,
                                      "best_exact": res.best_exact,
                                      "fd_coords": sum(e == "fd-crn" for e in
                                                       res.estimators.values())}
        else:
            cost0 = prob.cost
            prob.grad_cost = timing["ratio"]  # guided's gradients, at the measured price
            prob.listeners.append(lambda c, th, v, log=log: log.append((c - cost0, v)))
            search(prob, name, cfg.budget, seed=seed, box=cfg.box, batch=cfg.batch,
                   sigma0=cfg.sigma0, guide_t=cfg.guide_t)
            prob.listeners.clear()
            spent, extra = prob.cost - cost0, {}
        unit = prob.unit
        runs[name] = {"cost": [c / unit for c, _ in log],
                      "value": [v if np.isfinite(v) else -np.inf for _, v in log],
                      "spent": spent / unit, "wall_s": time.perf_counter() - t0, **extra}
    best = max(max(r["value"], default=-np.inf) for r in runs.values())
    first = timing["start_value"]
    return {"problem": problem, "seed": seed, "dim": len(prob.space.coords()),
            "system": pb.system, "n_scenarios": len(specs), "n_steps": prob.n_steps,
            "unit_request_iterations": prob.unit, "grad_cost": timing["ratio"],
            "timing": timing, "default_objective": first, "best_objective": best,
            "gradient_quality": quality, "runs": runs}


# ---------------------------------------------------------------------------------------
# CLI


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m experiments.bench_tuners",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: odma-16, 2 seeds, tiny problem and budgets")
    ap.add_argument("--out", type=Path, default=Path("results/bench_tuners"))
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="only rewrite the markdown and plot of a finished run's JSON "
                    "into --out")
    ap.add_argument("--jobs", type=int, default=None,
                    help="worker processes, one (problem, seed) each (default: cores)")
    for f in dataclasses.fields(BenchConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, tuple):
            ap.add_argument(flag, nargs="+", default=None,
                            type=float if f.name == "temperatures" else str)
        else:
            ap.add_argument(flag, type=type(f.default), default=None)
    return ap.parse_args(argv)


def _check(cfg: BenchConfig) -> None:
    bad = [p for p in cfg.problems if p not in PROBLEMS]
    if bad:
        raise ValueError(f"--problems: unknown {bad}; known: {', '.join(PROBLEMS)}")
    bad = [m for m in cfg.methods if m not in METHODS]
    if bad:
        raise ValueError(f"--methods: unknown {bad}; known: {', '.join(METHODS)}")
    for name in ("seeds", "budget", "grad_steps", "batch", "check_dirs", "timing_reps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if not (np.isfinite(cfg.guide_t) and cfg.guide_t > 0):
        raise ValueError(f"--guide-t must be a finite temperature > 0, got {cfg.guide_t}")


def _render(src: Path, out: Path) -> int:
    try:
        doc = json.loads(src.read_text())
        md = render_markdown(doc)
        png = render_plot(doc)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --render {src}: not a bench_tuners result ({e})", file=sys.stderr)
        return 2
    write_text_atomic(out / "bench_tuners.md", md)
    write_bytes_atomic(out / "bench_tuners.png", png)
    print(md)
    return 0


def main(argv=None) -> int:
    args = _args(argv)
    if args.render is not None:
        return _render(args.render, args.out)
    missing = []
    for mod in ("optuna", "cma"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print(f"error: {', '.join(missing)} not installed; install the package: "
              "pip install -e .", file=sys.stderr)
        return 2
    cfg = QUICK if args.quick else FULL
    over = {f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)
            if getattr(args, f.name) is not None}
    over = {k: tuple(v) if isinstance(v, list) else v for k, v in over.items()}
    cfg = dataclasses.replace(cfg, **over)
    try:
        _check(cfg)
        out = args.out
        why = unwritable_reason(out)
        if why:
            raise ValueError(f"--out {out}: {why}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs_list = [(p, cfg.first_seed + k) for p in cfg.problems for k in range(cfg.seeds)]
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(jobs_list)))
    print(f"bench_tuners: {len(jobs_list)} tasks ({', '.join(cfg.problems)} x "
          f"{cfg.seeds} seeds) on {jobs} worker(s)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    tasks = []
    try:
        if jobs == 1:
            for p, seed in jobs_list:
                tasks.append(_done(run_task(p, seed, cfg), t0))
        else:
            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as ex:
                futs = [ex.submit(run_task, p, seed, cfg) for p, seed in jobs_list]
                for f in futs:
                    tasks.append(_done(f.result(), t0))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    doc = {"schema_version": SCHEMA_VERSION, "provenance": run_provenance(),
           "settings": cfg.to_dict(),
           "methods": list(cfg.methods),
           "problems": [dict(dataclasses.asdict(PROBLEMS[p])) for p in cfg.problems],
           "seeds": [cfg.first_seed + k for k in range(cfg.seeds)],
           "budget_unit": "exact evaluations of the (problem, seed); "
                          "tasks[].unit_request_iterations converts to simulated "
                          "request-iterations",
           "jobs": jobs, "tasks": tasks,
           "gradient_quality": {t["problem"]: t["gradient_quality"] for t in tasks
                                if t["gradient_quality"] is not None},
           "summary": summarise(tasks, list(cfg.problems), list(cfg.methods),
                                cfg.budget)}
    doc["runtime_s"] = time.perf_counter() - t0
    md = render_markdown(doc)
    # plain(): -inf (a failed evaluation) and other non-finite values -> null
    write_json_atomic(out / "bench_tuners.json", plain(doc), sort_keys=False, indent=1)
    write_text_atomic(out / "bench_tuners.md", md)
    write_bytes_atomic(out / "bench_tuners.png", render_plot(doc))
    print(md)
    print(f"wrote {out}/bench_tuners.{{json,md,png}}", file=sys.stderr)
    return 0


def run_provenance() -> dict:
    """The result's provenance, whose fingerprint covers the tuners the worker
    processes ran (spawned workers import them; this process may not have)."""
    import tuner.search.blackbox  # noqa: F401
    import tuner.search.fitting  # noqa: F401
    from tuner.common.provenance import provenance

    return provenance()


def _done(task: dict, t0: float) -> dict:
    g = task["runs"].get("gradient") or next(iter(task["runs"].values()))
    print(f"[{time.perf_counter() - t0:6.0f} s] {task['problem']} seed {task['seed']}: "
          f"best {task['best_objective']:.5g}, default {task['default_objective']:.5g}, "
          f"gradient {max(g['value']):.5g} in {g['spent']:.0f} evals, grad/exact "
          f"{task['grad_cost']:.2f}", file=sys.stderr, flush=True)
    return task


if __name__ == "__main__":
    sys.exit(main())
