"""Black-box search of a tuning problem: Optuna TPE, CMA-ES and uniform random search.

The methods search the gradient tuner's own unconstrained space (:class:`tuner.objective.space.
Space`) restricted to the box ``[-box, box]`` per coordinate, and score every point by
the exact objective of the same :class:`tuner.objective.problem.Problem` the gradient tuner trains
on: every evaluation goes through ``Problem.value`` / ``Problem.batch`` at ``t = 0``, so
the problem's ``listeners`` see it and ``Problem.cost`` is charged for it.

* ``tpe``: Optuna's TPE sampler (multivariate, seeded); the start point is enqueued as
  the first trial; ``tpe_batch`` trials are asked before their values are told.
* ``cmaes``: CMA-ES (the ``cma`` package) from the start point with step ``sigma0``,
  bounded by the box, one generation of ``batch`` points per vmapped call; a non-finite
  value is told as the worst finite value seen.
* ``random``: the start point, then uniform samples of the box in vmapped batches.
* ``guided``: CMA-ES as above whose every generation is steered by the gradient:
  before each ``ask`` the relaxed gradient of the log objective at the search's mean
  (``Problem.grad`` at temperature ``guide_t``) proposes two points along its direction,
  a step of the search's own length (``sigma * sqrt(n)``) and a quarter of it (the
  first only in a population of 2); they are injected into the generation (replacing
  samples, so the budget of exact evaluations is unchanged) and CMA-ES updates its mean and covariance from their
  exact values like any sample's. A gradient costs ``Problem.grad_cost`` evaluations in
  ``Problem.cost`` and its wall time; a zero or non-finite gradient injects nothing.

``first``: given settings (for ``vllm-v1``, vLLM's auto_tune grid,
:mod:`tuner.search.engine_grid`) evaluated right after the start point as the search's
first generation: CMA-ES's (injected, so its mean and covariance adapt to their ranks,
and ``guided`` adds no gradient point to that generation), random search's first batch,
TPE's first enqueued trials. They are evaluated where they are; a method that knows only
the box is told them at their point inside it (clipped; CMA-ES's bound handling maps a
point near the bound inward), as the start point.

A search spends exactly ``evals`` exact evaluations, the start point first. When the
budget ends inside a batch, the remaining points are evaluated one by one with the
single-point function already compiled for the start point (``Problem.batch`` compiles
once per batch size): no evaluation is padded, repeated or left uncharged, and no second
batch size is compiled. A CMA-ES generation cut short is not told.

When to use which: the gradient tuner (``tuner.search.fitting.fit``) for many interacting
parameters; these methods for a handful of parameters, or where the exact objective is
flat or jagged enough that relaxed gradients and finite differences mislead.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from tuner.search.fitting import FitResult, FitSettings, build_problem
from tuner.objective.problem import Problem
from tuner.objective.space import Space

__all__ = ["SEARCH_METHODS", "Flat", "SearchResult", "check_method", "search",
           "search_fit"]

SEARCH_METHODS = ("tpe", "cmaes", "random", "guided")
_PACKAGE = {"tpe": "optuna", "cmaes": "cma", "guided": "cma"}  # the package each method imports


class Flat:
    """``theta`` dict <-> flat float64 vector over a :class:`Space`'s coordinates, in
    :meth:`Space.coords` order; ``labels[i]`` names coordinate ``i`` (``levels[0]``)."""

    def __init__(self, space: Space):
        self.shapes = {n: tuple(np.shape(space.base[n])) for n in space.names}
        self.labels = [f"{n}[{i}]" for n, i in space.coords()]

    def __len__(self) -> int:
        return len(self.labels)

    def vec(self, theta: dict) -> np.ndarray:
        return np.concatenate([np.asarray(theta[n], np.float64).reshape(-1)
                               for n in self.shapes])

    def theta(self, x) -> dict:
        x = np.asarray(x, np.float64)
        if x.shape != (len(self),):
            raise ValueError(f"flat theta: expected {len(self)} coordinates, got shape "
                             f"{x.shape}")
        out, i = {}, 0
        for n, shape in self.shapes.items():
            k = int(np.prod(shape))
            out[n] = jnp.asarray(np.reshape(x[i:i + k], shape), jnp.float32)
            i += k
        return out


@dataclass(frozen=True)
class SearchResult:
    best_theta: dict    # theta of the best exact value seen (the start if none finite)
    best_value: float   # its exact objective (-inf when no evaluation was finite)
    evals_used: int     # exact evaluations spent: always the ``evals`` asked for


def check_method(method: str, evals: int | None = None) -> None:
    """One clear error, before any work: ``ValueError`` for an unknown method or
    ``evals < 1``, ``ImportError`` when the method's package is not installed."""
    if method not in SEARCH_METHODS:
        raise ValueError(f"search method {method!r}: choose one of "
                         f"{', '.join(SEARCH_METHODS)}")
    if evals is not None and evals < 1:
        raise ValueError(f"evals={evals}: a search needs at least 1 exact evaluation")
    pkg = _PACKAGE.get(method)
    if pkg is not None:
        try:
            __import__(pkg)
        except ImportError:
            raise ImportError(f"search method {method!r} needs the {pkg!r} package (a "
                              "kvtune dependency): pip install -e .") from None


class _Run:
    """The evaluations of one search: counts them against the budget, keeps the best
    (from the problem's own listener calls) and reports progress."""

    def __init__(self, prob: Problem, flat: Flat, evals: int, batch: int, progress):
        self.prob, self.flat, self.evals, self.progress = prob, flat, evals, progress
        self.batch = batch  # the one batch size handed to Problem.batch
        self.done, self.best, self.best_theta, self.first = 0, -math.inf, None, None
        self.finite_min = math.inf  # the worst finite value seen (CMA-ES's stand-in)

    def listen(self, cost, theta, v):
        self.done += 1
        self.first = theta if self.first is None else self.first
        if v > self.best:  # a NaN never wins
            self.best, self.best_theta = v, theta
        if math.isfinite(v):
            self.finite_min = min(self.finite_min, v)

    @property
    def left(self) -> int:
        return self.evals - self.done

    def one(self, x) -> float:
        v, _ = self.prob.value(self.flat.theta(x))
        self._tick()
        return v

    def many(self, xs) -> list[float]:
        """Values of ``xs`` (at most ``left`` of them): one vmapped call when they fill
        a batch of more than one, else one by one (see the module docstring)."""
        xs = list(xs)
        assert len(xs) <= self.left, (len(xs), self.left)
        if len(xs) == self.batch > 1:
            vals = [float(v) for v in self.prob.batch([self.flat.theta(x) for x in xs])]
            self._tick()
            return vals
        return [self.one(x) for x in xs]

    def _tick(self):
        if self.progress is not None:
            self.progress(self.done, self.best)


def _random(run: _Run, x0, box, seed, batch, first=()):
    rng = np.random.default_rng(seed)
    run.one(x0)
    for k in range(0, len(first), batch):
        if run.left <= 0:
            break
        run.many(first[k:k + batch][:run.left])
    while run.left > 0:
        xs = rng.uniform(-box, box, size=(batch, len(x0)))
        run.many(xs[:run.left])


GUIDE_STEPS = (1.0, 0.25)  # guided: points along the gradient, x the search's length


def _cmaes(run: _Run, x0, box, seed, batch, sigma0, guide=None, first=()):
    import cma

    if batch < 2:
        raise ValueError(f"cmaes: batch (the population) must be >= 2, got {batch}")
    if len(first) > batch:
        raise ValueError(f"cmaes: {len(first)} first points for a population of {batch}")
    run.one(x0)
    # cma takes seed 0 as "seed from the clock": shift by one to stay reproducible
    es = cma.CMAEvolutionStrategy(np.clip(x0, -box, box), sigma0, {
        "seed": int(seed) % (2**32 - 2) + 1, "popsize": batch, "bounds": [-box, box],
        "verbose": -9})
    given = [np.asarray(x, np.float64) for x in first]  # evaluated where they are
    if given:
        es.inject([np.clip(x, -box, box) for x in given], force=True)
    while run.left > 0:
        if guide is not None and not given:
            g = guide(np.asarray(es.mean, np.float64))
            norm = float(np.linalg.norm(g))
            if math.isfinite(norm) and norm > 0:
                step = es.sigma * math.sqrt(len(g)) * g / norm
                steps = GUIDE_STEPS[:batch - 1]  # at least one sample of CMA-ES's own
                es.inject([np.clip(es.mean + f * step, -box, box) for f in steps],
                          force=True)
        xs = es.ask()
        # the injected points come first in the generation: evaluated where given
        # (unclipped), told to CMA-ES at their clipped point (xs)
        at = [*given, *xs[len(given):]]
        given = []
        if len(xs) > run.left:  # the budget ends inside this generation: not told
            run.many(at[:run.left])
            break
        vals = run.many(at)
        worst = run.finite_min if math.isfinite(run.finite_min) else 0.0
        es.tell(xs, [-(v if math.isfinite(v) else worst) for v in vals])  # minimises


def _tpe(run: _Run, x0, box, seed, labels, tpe_batch, first=()):
    import optuna
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        dists = {k: FloatDistribution(-box, box) for k in labels}
        # TPE only knows the box: a start outside it is evaluated where it is and told
        # at its clipped point
        given = [np.asarray(x, np.float64) for x in (x0, *first)]
        for x in given:
            study.enqueue_trial({k: float(np.clip(v, -box, box))
                                 for k, v in zip(labels, x)})
        while run.left > 0:
            trials = [study.ask(dists) for _ in range(min(tpe_batch, run.left))]
            xs = [np.array([t.params[k] for k in labels]) for t in trials]
            for i in range(min(len(xs), len(given))):  # enqueued: evaluated where given
                xs[i] = given[i]
            given = given[len(xs):]
            vals = run.many(xs)
            for t, v in zip(trials, vals):
                if math.isfinite(v):
                    study.tell(t, v)
                else:
                    study.tell(t, state=TrialState.FAIL)
    finally:
        optuna.logging.set_verbosity(verbosity)


def search(prob: Problem, method: str, evals: int, *, seed: int = 0, box: float = 5.0,
           start: dict | None = None, batch: int | None = None, sigma0: float = 1.0,
           tpe_batch: int = 1, guide_t: float = 0.1, progress=None,
           first: list[dict] | None = None) -> SearchResult:
    """Search ``prob``'s theta box with ``method`` (one of :data:`SEARCH_METHODS`) for
    exactly ``evals`` exact evaluations, the start point first.

    ``start``: physical parameters of the start point (missing tunable ones from the
    space's base; default ``prob.space.base``). ``batch``: points per vmapped call of
    random search and the CMA-ES population (default: 2 x the number of coordinates,
    the size the gradient tuner's central differences compile). ``sigma0``: CMA-ES's
    initial step in theta space. ``tpe_batch``: TPE trials asked before telling (1:
    sequential). ``guide_t``: the temperature of ``guided``'s relaxed gradients.
    ``first``: physical parameters of points evaluated right after the start point, as
    the first generation (see the module docstring; CMA-ES: at most ``batch``).
    ``progress(n_done, best)`` is called after every call into the problem. The best
    value is the largest exact value the problem reported (a NaN never wins).
    """
    check_method(method, evals)
    space = prob.space
    flat = Flat(space)
    batch = 2 * len(flat) if batch is None else int(batch)
    for name, ok, want in (("box", box > 0, "> 0"), ("batch", batch >= 1, ">= 1"),
                           ("sigma0", sigma0 > 0, "> 0"),
                           ("tpe_batch", tpe_batch >= 1, ">= 1"),
                           ("guide_t", guide_t > 0, "> 0")):
        if not ok:
            raise ValueError(f"search setting {name}: must be {want}")
    params = dict(space.base) if start is None else {**space.base, **start}
    x0 = flat.vec(space.to_theta(params))
    xs_first = [flat.vec(space.to_theta({**space.base, **p})) for p in (first or ())]
    run = _Run(prob, flat, int(evals), tpe_batch if method == "tpe" else batch,
               progress)
    prob.listeners.append(run.listen)
    try:
        if method == "random":
            _random(run, x0, box, seed, batch, xs_first)
        elif method in ("cmaes", "guided"):
            def guide(x):
                return flat.vec(prob.grad(flat.theta(x), guide_t)[1])
            _cmaes(run, x0, box, seed, batch, sigma0,
                   guide if method == "guided" else None, xs_first)
        else:
            _tpe(run, x0, box, seed, flat.labels, tpe_batch, xs_first)
    finally:
        prob.listeners.remove(run.listen)
    assert run.done == evals, (run.done, evals)
    best_theta = run.first if run.best_theta is None else run.best_theta
    return SearchResult(best_theta=best_theta, best_value=float(run.best),
                        evals_used=run.done)


def search_fit(spec, st: FitSettings, method: str, evals: int, *, log=print,
               progress=None, listeners=(), warn=lambda s: None,
               batch: int | None = None, sigma0: float = 1.0,
               tpe_batch: int = 1, first: list[dict] | None = None,
               first_note: str = "given points") -> FitResult:
    """Tune ``st.system`` on ``spec`` (the training slice) by black-box search: the
    problem is built as :func:`tuner.search.fitting.fit` builds it (``st.crn`` seeds,
    ``st.margin``, ``st.start``, ``st.objective``), searched with ``method`` in the box
    ``st.box`` from seed ``st.seed`` for ``evals`` exact evaluations, and returned as a
    :class:`tuner.search.fitting.FitResult` (no estimators or temperature floor; ``history``
    has one record per exact evaluation, ``steps`` is ``evals``), so that the CLI's
    validation and export treat it as a fit. ``listeners`` receive ``(cost, theta,
    value)`` for every exact evaluation. ``first``: points of the first generation
    (:func:`search`), named ``first_note`` in the log."""
    check_method(method, evals)
    st.check()
    prob, default = build_problem(spec, st, log, warn)
    space = prob.space
    history = []

    def record(cost, theta, v):
        history.append({"eval": len(history) + 1, "exact": v, "cost": cost})
    prob.listeners.extend([*listeners, record])
    n = len(space.coords())
    log(f"{method}: {evals} exact evaluations of {n} coordinate(s) in the theta box "
        f"+-{st.box:g}, the start point first"
        + (f", then {len(first)} {first_note}" if first else ""))
    res = search(prob, method, evals, seed=st.seed, box=st.box, batch=batch,
                 guide_t=float(np.median(st.temperatures)),
                 sigma0=sigma0, tpe_batch=tpe_batch, progress=progress, first=first)
    log(f"{method}: best exact objective {res.best_value:.6g} (start "
        f"{history[0]['exact']:.6g}; n_steps {prob.n_steps})")
    return FitResult(params=space.human(space.to_params(res.best_theta)),
                     default_params=space.human(default), estimators={}, floor=0.0,
                     history=history, best_exact=res.best_value, cost=prob.cost,
                     steps=res.evals_used, checks=[], unit=prob.unit,
                     train_objective=prob.objective.describe(),
                     rates=None if prob.rates is None else prob.rates.tolist(),
                     start_goodput_rps=prob.start_goodput,
                     start_runs=prob.start_runs, start_work=prob.start_work)
