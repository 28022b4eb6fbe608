"""Screened search (``tuner.fit --method screen``): many candidates judged cheaply, the
best few exactly.

Successive halving with two fidelities (Jamieson and Talwalkar, "Non-stochastic best
arm identification and hyperparameter optimization", AISTATS 2016; Hyperband's inner
loop): every candidate first runs a *screen*, one run per training window at the start
policy's highest goodput, scored by its SLO attainment there (the share of requests
meeting both SLOs, mean over the windows), on a horizon shortened in proportion; the
``evals - 1`` candidates the screen ranks highest then get the full exact evaluation
(the rate ladder on every window, the full horizon), and the best full value wins. The
start point is evaluated in full first, as in every other search, so the result is
never worse than the start on the training problem. A screen costs about a tenth of a
full evaluation (one run instead of the ladder's six, on about half the horizon).

Attainment at the start's goodput is high for every policy that serves more than the
start, and it orders them without the ladder's cap (a one-rung ladder's goodput stops
at the rung). The screen reads the SLOs only: constraints of the training objective are
applied by the full evaluations. ``experiments/fit_methods`` and
``experiments/engine_tune`` compare it with the other tuners on held-out data.

Candidates: ``first`` (for ``vllm-v1``, vLLM's auto_tune grid) and uniform samples of
the theta box up to ``pool``. Costs: the screen problem has its own ``unit``; the
result's ``cost`` is both problems' simulated request-iterations, and ``history`` has
one record per evaluation of either kind (``fidelity`` ``screen`` or ``full``).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from tuner.objective.objectives import parse_objective
from tuner.objective.problem import AROUND, Problem
from tuner.search.blackbox import Flat
from tuner.search.fitting import (FitResult, FitSettings, _train_scenarios,
                                  build_problem)

__all__ = ["POOL", "SCREEN_EVALS", "SCREEN_OBJECTIVE", "screen", "screen_fit",
           "screen_problem"]

POOL = 32  # candidates screened (the grid's 8 and 24 uniform samples)
SCREEN_OBJECTIVE = "slo_attainment"  # what the screen reads (share meeting both SLOs)
SCREEN_EVALS = 5  # full evaluations: the start and the screen's best 4


def screen_problem(prob: Problem, scenarios) -> Problem:
    """The cheap fidelity of ``prob`` (a capacity objective's training problem): each
    training scenario run once at the start policy's highest goodput (the ladder's top
    rung / ``AROUND[1]``; with one row of rungs per scenario, a fleet, each at its own),
    scored by the SLO attainment there (mean over the scenarios). With one shared row
    the horizon shrinks by (lowest / highest start goodput): the slowest scenario's
    runs are the longest at its own goodput, and run faster here; a run cut short is
    judged on the requests already due (``models.outcomes``), as the ladder's rungs
    are."""
    if prob.rates is None:
        raise ValueError("screen: the objective has no rate ladder (a capacity "
                         "objective such as goodput_rps is needed)")
    rates = np.asarray(prob.rates, np.float64)
    if rates.ndim == 1:
        fast, slow = rates[-1] / AROUND[1], rates[0] / AROUND[0]
        at = [fast] * len(scenarios)
        n_steps = prob.n_steps * slow / fast
    else:  # a row per scenario: each at its own start goodput, the full horizon
        at = list(rates[:, -1] / AROUND[1])
        n_steps = prob.n_steps
    block = scenarios[0].spec.block
    n_steps = max(block, int(math.ceil(n_steps / block)) * block)
    return Problem([sc.at_rate(float(r)) for sc, r in zip(scenarios, at)], prob.system,
                   prob.space, parse_objective(SCREEN_OBJECTIVE), n_steps)


def _quietly(fn, *args) -> None:
    """``fn(*args)`` for its side effect (a compiled program); an error is dropped, as
    the call that needs the program meets it again and reports it."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass


def screen(prob: Problem, cheap: Problem, evals: int, *, pool: int = POOL, seed: int = 0,
           box: float = 5.0, batch: int | None = None, first=(), progress=None):
    """The best theta of a screened search and its full exact value: the start
    (``prob.space.base``) in full, ``pool`` candidates (``first``, then uniform samples
    of ``[-box, box]``) on ``cheap``, the best ``evals - 1`` of them in full. Returns
    ``(theta, value, screen_values, full_values)`` (``full_values`` in the order
    evaluated, the start first)."""
    if evals < 1:
        raise ValueError(f"screen: evals={evals}: at least 1 (the start point)")
    flat = Flat(prob.space)
    batch = 2 * len(flat) if batch is None else int(batch)
    if pool < len(first) or pool < 1 or batch < 1:
        raise ValueError(f"screen: pool {pool} must hold the {len(first)} first points "
                         f"and be >= 1; batch {batch} >= 1")
    x0 = flat.vec(prob.space.to_theta(dict(prob.space.base)))
    xs = [flat.vec(prob.space.to_theta({**prob.space.base, **p})) for p in first]
    rng = np.random.default_rng(seed)
    xs += list(rng.uniform(-box, box, size=(pool - len(xs), len(x0))))
    # the screen's batched program compiles in a thread while the start runs in full
    ahead, compile_batch = None, getattr(cheap, "compile_batch", None)
    if pool >= batch > 1 and compile_batch is not None:
        ahead = threading.Thread(target=_quietly, args=(compile_batch, batch))
        ahead.start()
    try:
        v0, _ = prob.value(flat.theta(x0))
    finally:
        if ahead is not None:
            ahead.join()
    if progress is not None:
        progress(1, v0)

    def values(p: Problem, pts) -> list[float]:
        out = []
        for k in range(0, len(pts), batch):
            chunk = pts[k:k + batch]
            if len(chunk) == batch and batch > 1:
                out += [float(v) for v in p.batch([flat.theta(x) for x in chunk])]
            else:  # a short last chunk: one by one (no second batch size compiled)
                out += [p.value(flat.theta(x))[0] for x in chunk]
        return out

    cheap_vals = values(cheap, xs)
    # the screen's best evals - 1, highest first; NaN last; ties keep the candidates'
    # order (the first points before the samples)
    order = sorted(range(len(xs)), key=lambda i: -cheap_vals[i]
                   if math.isfinite(cheap_vals[i]) else math.inf)[:evals - 1]
    fulls = [v0, *values(prob, [xs[i] for i in order])]
    cands = [x0, *[xs[i] for i in order]]
    j = 0  # the start unless a promoted candidate is strictly better
    for k, v in enumerate(fulls):
        if math.isfinite(v) and not (math.isfinite(fulls[j]) and v <= fulls[j]):
            j = k
    if progress is not None:
        progress(len(fulls), fulls[j])
    return flat.theta(cands[j]), fulls[j], cheap_vals, fulls


def screen_fit(spec, st: FitSettings, evals: int = SCREEN_EVALS, *, pool: int = POOL,
               log=print, progress=None, listeners=(), warn=lambda s: None,
               first: list[dict] | None = None,
               first_note: str = "given points") -> FitResult:
    """:func:`tuner.search.blackbox.search_fit` with :func:`screen` as the method: the
    problem built as the gradient tuner builds it, the result a
    :class:`tuner.search.fitting.FitResult` whose ``history`` has one record per
    evaluation (``fidelity`` ``screen`` or ``full``) and whose ``cost`` counts both
    fidelities; ``listeners`` see the full evaluations."""
    st.check()
    prob, default = build_problem(spec, st, log, warn)
    scs = _train_scenarios(spec if isinstance(spec, (list, tuple)) else [spec], st.crn)
    cheap = screen_problem(prob, scs)
    history = []

    def record(kind):
        def cb(cost, theta, v):
            history.append({"eval": len(history) + 1, "exact": v, "fidelity": kind,
                            "cost": cost})
        return cb
    prob.listeners.extend([*listeners, record("full")])
    cheap.listeners.append(record("screen"))
    first = list(first or ())
    log(f"screen: {pool} candidates (the start point in full first"
        + (f"; {len(first)} {first_note}" if first else "")
        + f", uniform samples of the theta box +-{st.box:g}) screened by their SLO "
        f"attainment at the start's highest goodput "
        f"({float(np.max(prob.rates)) / AROUND[1]:.3g}"
        f" req/s, one run per window, horizon {cheap.n_steps} of {prob.n_steps} "
        f"iterations), the best {evals - 1} in full")
    theta, best, _, fulls = screen(prob, cheap, evals, pool=pool, seed=st.seed,
                                   box=st.box, first=first, progress=progress)
    space = prob.space
    log(f"screen: best exact objective {best:.6g} (start {fulls[0]:.6g}; screen cost "
        f"{cheap.cost / max(prob.unit, 1):.3g} full evaluations)")
    return FitResult(params=space.human(space.to_params(theta)),
                     default_params=space.human(default), estimators={}, floor=0.0,
                     history=history, best_exact=best, cost=prob.cost + cheap.cost,
                     steps=evals, checks=[], unit=prob.unit,
                     train_objective=prob.objective.describe(),
                     rates=prob.rates.tolist(),
                     start_goodput_rps=prob.start_goodput,
                     start_runs=prob.start_runs, start_work=prob.start_work)
