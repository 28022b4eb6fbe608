"""The compiled objective of a tuning problem.

``Problem`` compiles, for one system on a stack of common-random-number (CRN) scenarios
of equal shape, (a) the relaxed objective and its gradient in theta space and (b) a
vmapped batch of objective values for many thetas (exact mode for finite differences).
Gradients are of the log objective (:meth:`tuner.objective.objectives.Objective.log_value`): it has
the same maximisers and stays informative where constraint penalties make the objective
itself underflow. Each jitted entry point traces once per (system, static settings,
shapes): ``models.trace_guard`` checks it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models import Inputs, metrics, simulate
from models.simulate import note_trace
from tuner.objective.capacity import ladder_metrics
from tuner.objective.objectives import Objective
from tuner.scenario import Scenario
from tuner.objective.space import Space

__all__ = ["AROUND", "FD_SCHEMES", "Ladder", "Problem", "check_stackable", "measure",
           "plan_ladder", "stack_inputs"]


FD_SCHEMES = ("central", "forward")  # finite-difference schemes of Problem.fd
AROUND = (0.6, 1.4, 5)  # rungs of a fit's ladder: lo, hi x the start's goodput, count
HORIZON_CAP = 4         # a ladder's horizon: at most this x the saturation iterations


def check_stackable(scenarios: list[Scenario], system: str, record: bool = False):
    """The simulator options the scenarios share (``record``: keeping the per-request
    record), after checking that they also share the server's static (compiled)
    settings; one clear error naming the first pair that differs. Scenarios of one
    problem or sweep run in one compiled call."""
    sc = scenarios[0]
    opts = sc.options(system, record=record)
    static = ("n_slots", "admit_window", "max_len", "chunked")
    for other in scenarios[1:]:
        diff = [k for k in static if getattr(other.cfg, k) != getattr(sc.cfg, k)]
        if diff or other.options(system, record=record) != opts:
            what = ", ".join(f"{k} {getattr(sc.cfg, k)} vs {getattr(other.cfg, k)}"
                             for k in diff) or "simulator options"
            raise ValueError(f"{system}: scenarios run together must share their "
                             f"compiled settings: {sc.spec.trace} on {sc.spec.hardware} "
                             f"and {other.spec.trace} on {other.spec.hardware} differ in "
                             f"{what} (give them equal --max-len / slots / scheduler)")
    return opts


def stack_inputs(scenarios: list[Scenario], system: str) -> Inputs:
    """The scenarios' simulator inputs for ``system``, workloads padded to one length,
    stacked along a leading axis (CRN seeds, or a sweep's scenarios)."""
    n = max(s.workload.size for s in scenarios)
    ins = [s.padded(n).inputs(system) for s in scenarios]
    return jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *ins)


class Ladder(NamedTuple):
    """The rate ladder of a capacity objective: absolute rungs (req/s, ascending,
    shared by every scenario of a stack) and each scenario's own mean arrival rate."""
    rates: jnp.ndarray    # [K] shared, or [S, K] one row per scenario when stacked
    nominal: jnp.ndarray  # [] per scenario ([S] when stacked)


def measure(params, x: Inputs, hw, t, lad: Ladder, *, opts, n_steps, objective) -> dict:
    """Metrics of one scenario in a fixed horizon of ``n_steps`` iterations: a capacity
    objective runs the rate ladder (:func:`tuner.objective.capacity.ladder_metrics`, one vmapped
    call), any other objective one run at the scenario's own arrival times."""
    def sim(xi):
        st, _ = simulate(xi, hw, params, t, opts, n_steps)
        return metrics(st, xi, opts)

    if objective.capacity:
        return ladder_metrics(sim, x, lad.rates, lad.nominal)
    return sim(x)


def plan_ladder(scenarios: list[Scenario], system: str, params: dict,
                around=AROUND) -> tuple[np.ndarray, int, list[dict]]:
    """Rungs and horizon of a capacity objective, from exact runs of ``params``: each
    scenario's exact goodput ``g`` (:func:`tuner.objective.evaluate.evaluate_many`, in
    one batch); rungs geometric from ``around[0] * min g`` to ``around[1] * max g``
    (``around[2]`` of them), shared by the scenarios, or, when the goodputs lie too far
    apart for one row to bracket each of them (a fleet of devices), one row
    ``around[0] * g .. around[1] * g`` per scenario ([S, K]); horizon 1.25 x the most
    iterations any scenario needs at its goodput, at most ``HORIZON_CAP`` x its
    saturation run's (lower rungs are cut short and judged on
    the requests already due, see ``models.outcomes``). ``params``: one policy, or a
    list of one per scenario (a fleet's replicas).
    Returns (rates, n_steps, each scenario's exact capacity metrics)."""
    from tuner.objective.evaluate import evaluate_many

    each = params if isinstance(params, (list, tuple)) else [params] * len(scenarios)
    caps = evaluate_many([(sc, system, p) for sc, p in zip(scenarios, each)],
                         objective="goodput_rps", fill_lanes=True)
    g = np.array([c["goodput_rps"] for c in caps])
    lo, hi, n = around
    if g.max() * lo <= g.min() * hi:  # one row of rungs brackets every scenario's
        rates = np.geomspace(lo * g.min(), hi * g.max(), n).astype(np.float32)
    else:  # goodputs too far apart (a fleet of devices): a row per scenario
        rates = np.stack([np.geomspace(lo * x, hi * x, n) for x in g]).astype(np.float32)
    block = scenarios[0].spec.block
    # at a very low goodput the run at it is nearly serial (one request at a time):
    # cap the horizon at HORIZON_CAP x the saturation run's iterations
    it = min(max(c["iterations"] for c in caps),
             HORIZON_CAP * max(c["capacity"]["saturation_iterations"] for c in caps)) + 1
    return rates, int(math.ceil(1.25 * it / block) * block), caps


def _value_impl(theta, t, base, inputs, hw, lad, *, space, opts, n_steps, objective):
    """Mean over the CRN stack of the log objective (the differentiated surrogate), with
    the mean objective value and metrics as auxiliary outputs."""
    def one(params, x, hw_i, rates, nominal):
        m = measure(params, x, hw_i, t, Ladder(rates, nominal), opts=opts,
                    n_steps=n_steps, objective=objective)
        return objective.log_value(m), objective(m), m

    # a fleet has one device model per scenario; a ladder one row of rungs per scenario
    # when one shared row cannot bracket every scenario's goodput (plan_ladder)
    hw_axis = 0 if np.ndim(jax.tree.leaves(hw)[0]) else None
    rate_axis = 0 if lad.rates.ndim == 2 else None
    # a fleet's space: one policy per scenario (a replica each)
    p_axis = 0 if space.replicas else None
    lv, v, m = jax.vmap(one, in_axes=(p_axis, 0, hw_axis, rate_axis, 0))(
        space.to_params(theta, base), inputs, hw, lad.rates, lad.nominal)
    return jnp.mean(lv), (jnp.mean(v), jax.tree.map(jnp.mean, m))


def _counted(where, fn):
    def impl(theta, t, base, inputs, hw, lad, **static):
        note_trace(where, static["opts"], theta, t, base, inputs, hw, lad)
        return fn(theta, t, base, inputs, hw, lad, **static)
    return impl


# module-level jitted functions: a new Problem with equal shapes and static settings
# reuses the compiled code instead of tracing new closures
_STATIC = ("space", "opts", "n_steps", "objective")
_value = jax.jit(_counted("Problem.value", _value_impl), static_argnames=_STATIC)
_grad = jax.jit(_counted("Problem.grad", jax.value_and_grad(_value_impl, has_aux=True)),
                static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _batch(thetas, t, base, inputs, hw, lad, *, space, opts, n_steps, objective):
    note_trace("Problem.batch", opts, thetas, t, base, inputs, hw, lad)

    def one(th):
        lv, (v, _) = _value_impl(th, t, base, inputs, hw, lad, space=space, opts=opts,
                                 n_steps=n_steps, objective=objective)
        return lv, v

    return jax.vmap(one)(thetas)


class Problem:
    """Compiled objective functions of theta for one system and scenario stack.

    ``value`` and ``batch`` return the objective (exact mode at ``t = 0``); ``grad``
    differentiates the log surrogate (:meth:`Objective.log_value`, averaged over the CRN
    stack). Every simulation is charged to ``cost`` in simulated request-iterations, and
    every exact evaluation is reported to the callables in ``listeners`` as
    ``(cost_after, theta, value)``, so a caller can keep the best policy seen and a
    benchmark can count what each result cost.
    """

    def __init__(self, scenarios: list[Scenario], system: str, space: Space,
                 objective: Objective, n_steps: int, rates=None):
        sc = scenarios[0]
        self.system, self.space, self.objective = system, space, objective
        self.n_steps, self.n_crn, self.n_slots = n_steps, len(scenarios), sc.cfg.n_slots
        # the deployment (vLLM's memory profile), for start-up checks on the host
        self.deployment = getattr(sc, "deployment", None)
        self.deployments = [getattr(s, "deployment", None) for s in scenarios]
        if space.replicas and space.replicas != len(scenarios):
            raise ValueError(f"a fleet space of {space.replicas} replicas for "
                             f"{len(scenarios)} scenarios: one replica per scenario")
        self.cost = 0.0  # simulated request-iterations spent (slots x iterations)
        # the start policy's exact goodput on the scenarios (mean), and the runs to
        # completion and simulated slot-iterations it took (set by whoever ran it:
        # tuner.search.fitting.build_problem, from plan_ladder), None where not measured
        self.start_goodput = self.start_runs = self.start_work = None
        self.start_goodputs = None  # per scenario
        # what a relaxed forward + backward pass costs, in exact evaluations (3 unless
        # measured: experiments.bench_tuners times both and sets the ratio)
        self.grad_cost = 3.0
        self.listeners = []
        objective.check_metrics(system)
        if objective.capacity and rates is None:
            raise ValueError(f"objective {objective.spec!r} needs a rate ladder "
                             "(tuner.objective.problem.plan_ladder)")
        # a ladder of K rungs runs K + 1 simulations (the saturation rung) per scenario
        self.n_rungs = np.shape(rates)[-1] + 1 if objective.capacity else 1
        self.rates = None if rates is None else np.asarray(rates, np.float32)
        opts = check_stackable(scenarios, system, objective.needs_record)
        inputs = stack_inputs(scenarios, system)
        # one device model for the stack, or one per scenario (a fleet of presets)
        hws = [s.hw for s in scenarios]
        hw = (sc.hw if all(h == sc.hw for h in hws[1:])
              else jax.tree.map(lambda *xs: jnp.stack([jnp.float32(x) for x in xs]), *hws))
        lad = Ladder(jnp.asarray(self.rates if objective.capacity else np.ones(1),
                                 jnp.float32),
                     jnp.asarray([s.nominal_rps for s in scenarios], jnp.float32))

        self._args = (space.base, inputs, hw, lad)
        self._static = dict(space=space, opts=opts, n_steps=n_steps, objective=objective)

    @property
    def unit(self) -> int:
        """Request-iterations of one evaluation (the benchmark's budget unit)."""
        return self.n_crn * self.n_rungs * self.n_steps * self.n_slots

    def _spend(self, sims: int, backward: bool = False):
        self.cost += sims * self.unit * (self.grad_cost if backward else 1)

    def _report(self, thetas, values, t):
        if float(t) != 0.0 or not self.listeners:
            return
        start = self.cost - self.unit * len(values)  # the batch is paid; order within it
        for j, (th, v) in enumerate(zip(thetas, values)):
            for cb in self.listeners:
                cb(start + self.unit * (j + 1), th, float(v))

    def grad(self, theta, t):
        """(relaxed objective value, gradient of the log surrogate, metrics)."""
        self._spend(1, backward=True)
        (lv, (v, m)), g = _grad(theta, jnp.float32(t), *self._args, **self._static)
        out = {k: float(x) for k, x in m.items()}
        out["log_objective"] = float(lv)
        return float(v), g, out

    def value(self, theta, t=0.0):
        self._spend(1)
        lv, (v, m) = _value(theta, jnp.float32(t), *self._args, **self._static)
        self._report([theta], [float(v)], t)
        out = {k: float(x) for k, x in m.items()}
        out["log_objective"] = float(lv)
        return float(v), out

    def compile_batch(self, n: int) -> None:
        """Compile :meth:`batch`'s program for ``n`` thetas without running it (for a
        thread while other work runs; the values of theta do not matter)."""
        theta = self.space.to_theta(dict(self.space.base))
        stacked = jax.tree.map(lambda x: jnp.asarray(np.stack([x] * n)), theta)
        _batch.lower(stacked, jnp.float32(0.0), *self._args, **self._static).compile()

    def batch(self, thetas: list[dict], t=0.0, log: bool = False) -> np.ndarray:
        """Objective values (or log surrogates) of many thetas in one vmapped call."""
        self._spend(len(thetas))
        stacked = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *thetas)
        lv, v = _batch(stacked, jnp.float32(t), *self._args, **self._static)
        v = np.asarray(v)
        self._report(thetas, v, t)
        return np.asarray(lv) if log else v

    def fd(self, theta, coords, h=0.1, t=0.0, log: bool = True, *,
           scheme: str = "central", base: float | None = None) -> dict:
        """Finite differences (exact mode by default) of the log surrogate (or of the
        objective with ``log=False``) for the given coordinates, in one vmapped batch.

        ``scheme="central"`` costs two evaluations per coordinate. ``"forward"`` costs
        one, plus one for ``theta`` itself unless its value (same ``t`` and ``log``) is
        passed as ``base``: a fit passes the exact value it has just measured there.
        """
        if scheme not in FD_SCHEMES:
            raise ValueError(f"finite differences: unknown scheme {scheme!r}")
        signs = (1.0, -1.0) if scheme == "central" else (1.0,)
        thetas = []
        for name, i in coords:
            for s in signs:
                th = {k: jnp.array(v) for k, v in theta.items()}
                th[name] = th[name].reshape(-1).at[i].add(s * h).reshape(theta[name].shape)
                thetas.append(th)
        if not thetas:
            return {}
        if scheme == "forward" and base is None:
            thetas.append(theta)
        vals = self.batch(thetas, t, log=log)
        if scheme == "central":
            return {c: float(vals[2 * j] - vals[2 * j + 1]) / (2 * h)
                    for j, c in enumerate(coords)}
        v0 = float(vals[-1]) if base is None else float(base)
        # ``base`` may come from the unbatched function: a difference within float32
        # round-off of the two compiled paths is no slope (Adam would amplify it)
        noise = 1e-5 * max(1.0, abs(v0))
        return {c: (0.0 if abs(float(vals[j]) - v0) <= noise else
                    (float(vals[j]) - v0) / h) for j, c in enumerate(coords)}
