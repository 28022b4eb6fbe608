"""Screened search (``tuner.fit --method screen``): many candidates judged cheaply, the
best few exactly.

Successive halving with two fidelities (Jamieson and Talwalkar, "Non-stochastic best
arm identification and hyperparameter optimization", AISTATS 2016; Hyperband's inner
loop): every candidate first runs a *screen*, the training problem cut down to the top
rung of its rate ladder, judged on a horizon as much shorter as that rung is faster
than the start policy's goodput; the ``evals - 1`` candidates the screen ranks highest
then get the full exact evaluation (every rung, the full horizon), and the best full
value wins. The start point is evaluated in full first, as in every other search, so
the result is never worse than the start on the training problem.

The screen reads a policy's SLO attainment at the one rate where better policies than
the start differ most (1.4 x the start's goodput, the ladder's top rung): its goodput
on that one-rung ladder grows with the attainment there and is capped at the rung, so
policies that all meet the SLOs there tie, and the full evaluation orders them. On the
main job's training windows (scratch measurement, 32 candidates: the start, vLLM's
auto_tune grid and 23 random settings) the screen's ranking agreed with the full
objective's with Spearman's rho 0.91, and its top 4 held the best candidate.

Candidates: ``first`` (for ``vllm-v1``, vLLM's auto_tune grid) and uniform samples of
the theta box up to ``pool``. Costs: the screen problem has its own ``unit``; the
result's ``cost`` is both problems' simulated request-iterations, and ``history`` has
one record per evaluation of either kind (``fidelity`` ``screen`` or ``full``).
"""

from __future__ import annotations

import math

import numpy as np

from tuner.objective.problem import Problem
from tuner.search.blackbox import Flat
from tuner.search.fitting import (FitResult, FitSettings, _train_scenarios,
                                  build_problem)

__all__ = ["POOL", "SCREEN_EVALS", "screen", "screen_fit", "screen_problem"]

POOL = 32  # candidates screened (the grid's 8 and 24 uniform samples)
SCREEN_EVALS = 5  # full evaluations: the start and the screen's best 4


def screen_problem(prob: Problem, scenarios, block: int) -> Problem:
    """The cheap fidelity of ``prob`` (a capacity objective's training problem): its
    ladder cut to the top rung, the horizon scaled by (start goodput / top rung), the
    rungs being 0.6 x the lowest and 1.4 x the highest start goodput."""
    if prob.rates is None:
        raise ValueError("screen: the objective has no rate ladder (a capacity "
                         "objective such as goodput_rps is needed)")
    from tuner.objective.problem import AROUND

    rates = np.atleast_2d(prob.rates)
    slow = float(rates[:, 0].min()) / AROUND[0]  # the lowest start goodput
    top = float(rates[:, -1].max())
    n_steps = max(block, int(math.ceil(prob.n_steps * slow / top / block)) * block)
    cut = prob.rates[..., -1:]
    return Problem(scenarios, prob.system, prob.space, prob.objective, n_steps, cut)


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
    v0, _ = prob.value(flat.theta(x0))
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
    cheap = screen_problem(prob, scs, scs[0].spec.block)
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
        + f", uniform samples of the theta box +-{st.box:g}) on the ladder's top rung "
        f"({float(np.max(cheap.rates)):.3g} req/s, horizon {cheap.n_steps} of "
        f"{prob.n_steps} iterations), the best {evals - 1} in full")
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
                     rates=prob.rates.tolist())
