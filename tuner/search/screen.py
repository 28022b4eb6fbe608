"""Screened search (``tuner.fit --method screen``): many candidates judged cheaply, the
best few exactly.

Successive halving with two fidelities (Jamieson and Talwalkar, "Non-stochastic best
arm identification and hyperparameter optimization", AISTATS 2016; Hyperband's inner
loop): every candidate first runs a *screen*, one exact run to completion per training
window at the start policy's highest goodput, scored by its SLO attainment there (the
share of requests meeting both SLOs, mean over the windows); the start and the
``evals - 1`` candidates the screen ranks highest then get the *full* evaluation, the
training objective exactly (goodput by a search of runs to completion on every window,
started from the candidate's own screen run there, a run already made and not paid
again, and the start's goodput there: ``known`` and ``hint`` of
:func:`tuner.objective.capacity.capacity_search`; the mean over the windows), all in one
lockstep (:func:`tuner.objective.evaluate.evaluate_many`), and the best full value
wins; the start wins ties, so the result is never worse than the start on the training
problem. Where the training objective is the count-based goodput itself (no
constraint), the start is not run again: its full value is the goodput the training
problem's own exact searches measured to plan the ladder (:func:`start_value`; the
same search to the same resolution, reached through other rates), and only the
finalists go into the lockstep. Every run goes through the one batched run-to-completion program per system
that measured the start's goodput (and that validation runs): the search compiles no
program of its own. A screen costs one run per window where a full evaluation costs
its goodput search's (about six, fewer from the screen's run).

Attainment at the start's goodput is high for every policy that serves more than the
start, and it orders them without a ladder's cap. The screen reads the SLOs only:
constraints of the training objective are applied by the full evaluations.
``experiments/fit_methods`` and ``experiments/engine_tune`` compare it with the other
tuners on held-out data.

Candidates: ``first`` (for ``vllm-v1``, vLLM's auto_tune grid) and uniform samples of
the theta box up to ``pool``. Costs: the result's ``cost`` is the simulated
slot-iterations of every run (in the training problem's ``unit``, a fixed-horizon
ladder evaluation, for comparison with the other tuners), ``runs`` the runs to
completion, and ``history`` has one record per evaluation of either kind
(``fidelity`` ``screen`` or ``full``).
"""

from __future__ import annotations

import math

import numpy as np

from tuner.common.ahead import in_thread
from tuner.objective.objectives import parse_objective
from tuner.objective.problem import Problem
from tuner.search.blackbox import Flat
from tuner.search.fitting import (FitResult, FitSettings, _train_scenarios,
                                  build_problem)

__all__ = ["FLOOR_SHARE", "POOL", "SCREEN_EVALS", "SCREEN_OBJECTIVE", "screen", "screen_fit",
           "screen_problems", "start_value"]

POOL = 32  # candidates screened (the grid's 8 and 24 uniform samples)
SCREEN_OBJECTIVE = "slo_attainment"  # what the screen reads (share meeting both SLOs)
SCREEN_EVALS = 5  # full evaluations: the start and the screen's best 4
# a full evaluation's goodput searches run no rate below this share of the start's
# goodput on the window: a policy that misses the SLOs there is far from winning, and
# the search would otherwise step down to rates whose runs are the longest (and, in
# lockstep, hold up every other search; see capacity_search's floor)
FLOOR_SHARE = 0.25


class _Exact:
    """A stand-in for a :class:`Problem` whose ``value`` and ``batch`` are exact runs to
    completion through :func:`tuner.objective.evaluate.evaluate_many` (any batch size,
    the candidates in lockstep): one job per (candidate, scenario), the value the mean
    over the scenarios of ``objective`` (with its margin) of each job's metrics.
    ``at``: each scenario's arrival rate (None: a capacity objective's search, started
    from ``hints``, to no rate below ``floors``). Counts its runs and the
    slot-iterations they simulated; reports each evaluation to ``listeners`` as a
    :class:`Problem` does."""

    any_batch = True  # screen(): the finalists and the start in one lockstep

    def __init__(self, prob: Problem, scenarios, objective, at=None, hints=None,
                 floors=None, screened: "_Exact | None" = None):
        self.space, self.system, self.objective = prob.space, prob.system, objective
        self.at = None if at is None else [float(r) for r in at]
        self.scenarios = [sc if at is None else sc.at_rate(float(r))
                          for sc, r in zip(scenarios, at or [None] * len(scenarios))]
        self.hints, self.floors = hints, floors
        self.cost, self.runs, self.listeners = 0.0, 0, []
        self.start_value = None  # the start's value when already measured (screen())
        # runs at a fixed rate (a screen): each policy's (rate, metrics) per scenario,
        # which the full evaluation's searches of the same policy start from
        self.made: dict = {}
        self.screened = screened

    def value(self, theta):
        return float(self.batch([theta])[0]), {}

    def batch(self, thetas) -> np.ndarray:
        from tuner.objective.evaluate import evaluate_many

        k = len(self.scenarios)
        params = [self.space.human(self.space.to_params(th)) for th in thetas]
        jobs = [(sc, self.system, p) for p in params for sc in self.scenarios]
        hints = None if self.hints is None else list(self.hints) * len(params)
        floors = None if self.floors is None else list(self.floors) * len(params)
        ms = evaluate_many(jobs, objective=self.objective.spec, hints=hints,
                           floors=floors, known=self._known(params))
        vals = []
        for j, th in enumerate(thetas):
            mine = ms[j * k:(j + 1) * k]
            if self.at is not None:
                self.made[_key(params[j])] = list(zip(self.at, mine))
            v = float(np.mean([float(self.objective(m)) for m in mine]))
            for sc, m in zip(self.scenarios, mine):
                cap = m.get("capacity")
                runs = int(cap["runs"]) if cap else 1
                its = cap["iterations"] if cap else m.get("iterations")
                self.runs += runs
                self.cost += float(its or 0.0) * sc.cfg.n_slots
            for cb in self.listeners:
                cb(self.cost, th, v)
            vals.append(v)
        return np.asarray(vals, np.float64)

    def _known(self, params) -> list | None:
        """Per job, ``{rate: metrics}`` of the screen's run of that policy on that
        scenario (None where it was not screened), or None without a screen. Not for an
        objective that reads the expected attainment, which a screen's metrics may
        lack."""
        if self.screened is None or getattr(self.objective, "needs_record", False):
            return None
        out = []
        for p in params:
            got = self.screened.made.get(_key(p))
            out += ([None] * len(self.scenarios) if got is None else
                    [{r: m} if "slo_attainment" in m else None for r, m in got])
        return out


def _key(params: dict) -> tuple:
    return tuple(sorted((k, tuple(np.ravel(np.asarray(v, np.float64)).tolist()))
                        for k, v in params.items()))


def start_value(prob: Problem) -> float | None:
    """The start policy's full value without running it again, where the training
    objective is the count-based goodput alone (``goodput_rps``, no constraint): the
    mean over the scenarios of the goodputs that :func:`tuner.search.fitting.
    build_problem`'s exact searches measured (``prob.start_goodputs``). Otherwise
    None: an objective with constraints or the expected goodput reads metrics those
    searches did not keep."""
    obj, g = prob.objective, prob.start_goodputs
    plain = (getattr(obj, "goal", None) == ((1.0, "goodput_rps"),)
             and not getattr(obj, "constraints", ()))
    return float(np.mean(g)) if plain and g else None


def screen_problems(prob: Problem, scenarios) -> tuple[_Exact, _Exact]:
    """(full, screen) of ``prob`` (a capacity objective's training problem whose
    start goodput on each scenario is measured, ``prob.start_goodputs``): the full
    evaluation is the training objective by exact searches started from those
    goodputs (to no rate below :data:`FLOOR_SHARE` of them); the screen the SLO
    attainment of one run to completion per scenario at the start's highest goodput
    (with one row of rungs per scenario, a fleet, each at its own)."""
    g = prob.start_goodputs
    if prob.rates is None or not g:
        raise ValueError("screen: the objective has no rate ladder (a capacity "
                         "objective such as goodput_rps is needed)")
    at = list(g) if np.ndim(prob.rates) == 2 else [max(g)] * len(g)
    cheap = _Exact(prob, scenarios, parse_objective(SCREEN_OBJECTIVE), at=at)
    full = _Exact(prob, scenarios, prob.objective, hints=list(g),
                  floors=[FLOOR_SHARE * x for x in g], screened=cheap)
    full.start_value = start_value(prob)
    return full, cheap


def screen(prob: Problem, cheap: Problem, evals: int, *, pool: int = POOL, seed: int = 0,
           box: float = 5.0, batch: int | None = None, first=(), progress=None):
    """The best theta of a screened search and its full exact value: the start
    (``prob.space.base``) in full, ``pool`` candidates (``first``, then uniform samples
    of ``[-box, box]``) on ``cheap``, the best ``evals - 1`` of them in full. Returns
    ``(theta, value, screen_values, full_values)`` (``full_values`` in the order
    evaluated, the start first). A ``prob.start_value`` that is not None is the
    start's full value, already measured: the start is then not evaluated again."""
    if evals < 1:
        raise ValueError(f"screen: evals={evals}: at least 1 (the start point)")
    if evals - 1 > pool:
        raise ValueError(f"screen: evals={evals}: the start and at most the pool's "
                         f"{pool} candidates, so at most {pool + 1}")
    flat = Flat(prob.space)
    batch = 2 * len(flat) if batch is None else int(batch)
    if pool < len(first) or pool < 1 or batch < 1:
        raise ValueError(f"screen: pool {pool} must hold the {len(first)} first points "
                         f"and be >= 1; batch {batch} >= 1")
    x0 = flat.vec(prob.space.to_theta(dict(prob.space.base)))
    xs = [flat.vec(prob.space.to_theta({**prob.space.base, **p})) for p in first]
    rng = np.random.default_rng(seed)
    xs += list(rng.uniform(-box, box, size=(pool - len(xs), len(x0))))
    # a problem of any batch size (exact runs in lockstep): the start goes with the
    # finalists; else the start first, and the screen's batched program compiles in a
    # thread meanwhile
    together = getattr(prob, "any_batch", False)
    known = getattr(prob, "start_value", None)
    if known is not None:
        v0 = float(known)
        if progress is not None:
            progress(1, v0)
    elif not together:
        ahead, compile_batch = None, getattr(cheap, "compile_batch", None)
        if pool >= batch > 1 and compile_batch is not None:
            ahead = in_thread(compile_batch, batch)
        try:
            v0, _ = prob.value(flat.theta(x0))
        finally:
            if ahead is not None:
                ahead.join()
        if progress is not None:
            progress(1, v0)

    def values(p: Problem, pts) -> list[float]:
        if getattr(p, "any_batch", False):
            return [float(v) for v in p.batch([flat.theta(x) for x in pts])]
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
    finalists = [xs[i] for i in order]
    if together and known is None:
        fulls = values(prob, [x0, *finalists])
    else:
        fulls = [v0, *(values(prob, finalists) if finalists else [])]
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
    """:func:`tuner.search.blackbox.search_fit` with :func:`screen` as the method on the
    exact problems of :func:`screen_problems`: the training problem built as the
    gradient tuner builds it (its ladder planned from the start's exact goodput, which
    the screen and the full evaluations start from), the result a
    :class:`tuner.search.fitting.FitResult` whose ``history`` has one record per
    evaluation (``fidelity`` ``screen`` or ``full``), whose ``cost`` counts both
    fidelities' simulated slot-iterations and ``runs`` their runs to completion;
    ``listeners`` see the full evaluations."""
    st.check()
    prob, default = build_problem(spec, st, log, warn)
    scs = _train_scenarios(spec if isinstance(spec, (list, tuple)) else [spec], st.crn)
    full, cheap = screen_problems(prob, scs)
    history = []

    def record(kind):
        def cb(cost, theta, v):
            history.append({"eval": len(history) + 1, "exact": v, "fidelity": kind,
                            "cost": full.cost + cheap.cost})
        return cb
    full.listeners.extend([*listeners, record("full")])
    cheap.listeners.append(record("screen"))
    first = list(first or ())
    at = cheap.scenarios[0].nominal_rps if cheap.scenarios else float("nan")
    log(f"screen: {pool} candidates ("
        + (f"{len(first)} {first_note}, " if first else "")
        + f"uniform samples of the theta box +-{st.box:g}) screened by their SLO "
        f"attainment in one run to completion per window at the start's highest "
        f"goodput ({at:.3g} req/s); "
        + (f"the best {evals - 1} evaluated exactly, together (the start's goodput as "
           "measured for the ladder)" if full.start_value is not None else
           f"the start and the best {evals - 1} evaluated exactly, together"))
    theta, best, _, fulls = screen(full, cheap, evals, pool=pool, seed=st.seed,
                                   box=st.box, first=first, progress=progress)
    space = prob.space
    reused = " as measured for the ladder" if full.start_value is not None else ""
    log(f"screen: best exact objective {best:.6g} (start {fulls[0]:.6g}{reused}; "
        f"{cheap.runs} screen runs, {full.runs} runs of the exact evaluations)")
    return FitResult(params=space.human(space.to_params(theta)),
                     default_params=space.human(default), estimators={}, floor=0.0,
                     history=history, best_exact=best, cost=full.cost + cheap.cost,
                     steps=len(fulls), checks=[], unit=prob.unit,
                     train_objective=prob.objective.describe(),
                     rates=prob.rates.tolist(),
                     start_goodput_rps=prob.start_goodput,
                     start_runs=prob.start_runs, start_work=prob.start_work,
                     runs=full.runs + cheap.runs)
