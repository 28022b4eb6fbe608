"""The exact evaluation of policies on scenarios (``python -m tuner.evaluate`` is its
command line).

:func:`evaluate_many` evaluates a list of (scenario, system, parameters) jobs exactly and
in batches: a capacity objective's goodput searches
(:func:`tuner.objective.capacity.capacity_search`) run in lockstep, and each round's runs
of one system go to ``models.simulate_until_done_many`` in calls of a fixed number of
lanes (one compiled program per system and lane count, :func:`lane_width`), every run
to completion.
:func:`evaluate` is one job (one lane: the unbatched simulator); :func:`run` is one run
at the scenario's own rate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models import (compile_many, get_system, metrics, simulate_until_done,
                    simulate_until_done_many, validate_params)
from tuner.objective.capacity import capacity_search
from tuner.objective.objectives import DEFAULT_OBJECTIVE, parse_objective
from tuner.scenario import Scenario

__all__ = ["CPU_LANES", "MAX_LANES", "compile_ahead", "evaluate", "evaluate_many",
           "lane_width", "mean_metrics", "run"]

MAX_LANES = 32  # runs per batched call at most (memory grows with the lanes)
# on a CPU backend every batched call has this many lanes: on 2 cores a call of 4 lanes
# took about 1.1x one of 2 and 8 lanes about 2x one of 4 (scratch timing of the main
# job's training windows), so 4 fills the cores, and one width gives one program per
# system and input shape
CPU_LANES = 4


def lane_width(runs_per_round: int, backend: str | None = None) -> tuple[int, bool]:
    """(lanes per batched call, prefetch the ladder) for a group whose rounds hold
    ``runs_per_round`` runs (its jobs x their realisations). One run: one lane, the
    unbatched simulator, rungs run as read. On an accelerator lanes are nearly free: as
    many as the round holds (at most :data:`MAX_LANES`), and every rung in one round.
    On a CPU lanes cost their work: :data:`CPU_LANES`, and the ladder's rungs are
    prefetched only to fill lanes a round would leave idle (a prefetched rung past
    the first miss is work no search reads)."""
    if runs_per_round <= 1:
        return 1, False
    if (backend or jax.default_backend()) != "cpu":
        return min(runs_per_round, MAX_LANES), True
    return CPU_LANES, runs_per_round < CPU_LANES


def _params(sc: Scenario, system: str, params) -> dict:
    p = validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw,
                        sc.deployment)
    return {k: jnp.asarray(v) for k, v in p.items()}


def run(sc: Scenario, system: str, params: dict | None = None, *,
        temperature: float = 0.0) -> dict:
    """Run ``system`` on the scenario until every request is accounted for; its
    metrics as floats."""
    p = _params(sc, system, params)
    opts = sc.options(system, record=True)
    inputs = sc.inputs(system)
    st = simulate_until_done(inputs, sc.hw, p, opts, t=temperature)
    return {k: float(v) for k, v in metrics(st, inputs, opts).items()}


def _own_rate():
    """The search of a non-capacity objective: one run at the scenario's own rate."""
    ms = yield [None]
    return dict(ms[0])


def _group_key(sc: Scenario, system: str) -> tuple:
    """Runs that can share one batched call: one system, options, device model and
    input shapes."""
    shapes = jax.tree.map(jnp.shape, sc.inputs(system))
    return (system, sc.options(system, record=True), repr(jax.tree.leaves(sc.hw)),
            repr(shapes))


def _run_group(runs: list, lanes: int) -> list[dict]:
    """Metrics of ``runs`` [(scenario at its rate, system, params, rate)] of one group,
    in calls of ``lanes`` runs (the last one padded by repeating its last run). A call
    lasts as long as its longest run, so runs are ordered by the span of their arrivals
    (requests / rate: at a low rate the server runs many small iterations) and a call
    takes runs of about equal length."""
    if lanes == 1:
        return [run(sc, system, p) for sc, system, p, _ in runs]

    def span(i):
        sc, _, _, rate = runs[i]
        return float(np.sum(sc.workload.valid)) / (rate or sc.nominal_rps)

    order = sorted(range(len(runs)), key=span)
    out = [None] * len(runs)
    for c in range(0, len(order), lanes):
        idx = order[c:c + lanes]
        idx = idx + [idx[-1]] * (lanes - len(idx))
        sc0, system = runs[idx[0]][:2]
        opts = sc0.options(system, record=True)
        x = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)),
                         *[runs[i][0].inputs(system) for i in idx])
        p = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *[runs[i][2] for i in idx])
        ms = simulate_until_done_many(x, sc0.hw, p, opts)
        for j, i in enumerate(idx[:len(order[c:c + lanes])]):
            out[i] = {k: float(v[j]) for k, v in ms.items()}
    return out


def mean_metrics(ms: list[dict]) -> dict:
    """Metrics averaged over runs (a job's workload realisations, or training windows):
    each metric's mean; one run's metrics as they are."""
    if len(ms) == 1:
        return ms[0]
    return {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}


def _points(runs_per_point: int, lanes: int) -> int:
    """Rates each search of a group asks for per round: as many as fill the lanes its
    calls have anyway (a group of 2 runs in calls of 4 lanes: 2 rates each)."""
    if lanes <= 1:
        return 1
    calls = -(-runs_per_point // lanes)
    return max(1, calls * lanes // runs_per_point)


def _plan(jobs: list, obj, lanes: int | None):
    """(prepared jobs (scenarios, system, params, group key), {group key: job
    indices}, {group key: (lanes, prefetch)}) of :func:`evaluate_many`."""
    prepared, groups = [], {}
    for sc, system, params in jobs:
        obj.check_metrics(system)
        scs = tuple(sc) if isinstance(sc, (tuple, list)) else (sc,)
        if not scs:
            raise ValueError("evaluate_many: a job with no scenario")
        key = _group_key(scs[0], system)
        if any(_group_key(x, system) != key for x in scs[1:]):
            raise ValueError(f"evaluate_many: the realisations of one {system} job differ "
                             "in shape or settings (they must be seeds of one scenario)")
        groups.setdefault(key, []).append(len(prepared))
        prepared.append((scs, system, _params(scs[0], system, params), key))
    if lanes:  # given: every rung in one round unless one lane
        plan = {k: (lanes, lanes > 1) for k in groups}
    else:
        plan = {k: lane_width(len(v) * len(prepared[v[0]][0])) for k, v in groups.items()}
    return prepared, groups, plan


def compile_ahead(jobs: list, *, objective: str = DEFAULT_OBJECTIVE,
                  lanes: int | None = None) -> int:
    """Compile the batched programs :func:`evaluate_many` would run for ``jobs`` (the
    same arguments), without running anything; returns how many systems' programs it
    compiled. Parameter values do not matter, only their shapes: jobs with a system's
    default parameters prepare the programs of its tuned ones. Meant for a thread
    while other work runs (``tuner.fit`` compiles its validation's programs during
    the search)."""
    prepared, groups, plan = _plan(jobs, parse_objective(objective), lanes)
    n = 0
    for key, idx in groups.items():
        w = plan[key][0]
        if w == 1:  # the unbatched simulator: compiled by its first run
            continue
        scs, system, params, _ = prepared[idx[0]]
        sc = scs[0]
        x = jax.tree.map(lambda a: jnp.asarray(np.stack([a] * w)), sc.inputs(system))
        p = jax.tree.map(lambda a: jnp.asarray(np.stack([a] * w)), params)
        compile_many(x, sc.hw, p, sc.options(system, record=True))
        n += 1
    return n


def evaluate_many(jobs: list, *, objective: str = DEFAULT_OBJECTIVE, rates=None,
                  lanes: int | None = None, expected: bool | None = None,
                  hints=None, fill_lanes: bool = False, floors=None,
                  known=None, log=lambda s: None) -> list[dict]:
    """The exact objective and metrics of each job ``(scenario, system, params)``.

    A job's scenario may be a tuple of scenarios of one shape: workload realisations
    (seeds) of one deployment. Each rate the job's search asks for is then run on every
    realisation, and the search reads the realisations' mean metrics (the expected
    attainment curve over them). With ``expected`` (default: when the objective names
    ``goodput_expected_rps`` or ``slo_attainment_expected``) a capacity search also
    finds ``goodput_expected_rps`` (see :func:`tuner.objective.capacity.capacity_search`).

    A capacity objective (goodput) runs, per job, the rate ladder (``rates[i]``, default
    :func:`tuner.objective.capacity.ladder_rates` of the policy's saturation rate) and
    bisects its first crossing; the searches advance in lockstep and each round's runs
    of one system (and one input shape) go in batched calls of ``lanes`` runs (default:
    :func:`lane_width` of the group's runs per round, which also decides whether a
    ladder's rungs are all asked for in one round; ``lanes`` given: every rung in one
    round unless 1). ``hints[i]`` (req/s or None): an estimate of job ``i``'s goodput
    where its ladder is not given, from which its search starts
    (:func:`tuner.objective.capacity.capacity_search`). Results are those of
    :func:`evaluate` on each job alone (with the same ladder or hint), except with
    ``fill_lanes``: a group whose rounds leave lanes of its calls idle (2 searches in
    calls of 4 lanes) then asks for that many more rates per round (the search's
    ``points``), fewer rounds for the same calls; the crossing is the same to the
    search's ``rtol``, found through other rates. ``floors[i]`` (req/s or None): the
    lowest rate job ``i``'s search runs (``capacity_search``'s ``floor``).
    ``known[i]`` (``{rate: metrics}`` or None): runs of job ``i`` already made, from
    which its search starts instead of a hint (``capacity_search``'s ``known``; not
    counted in its runs)."""
    obj = parse_objective(objective)
    rates = [None] * len(jobs) if rates is None else list(rates)
    hints = [None] * len(jobs) if hints is None else list(hints)
    floors = [None] * len(jobs) if floors is None else list(floors)
    known = [None] * len(jobs) if known is None else list(known)
    if not len(rates) == len(hints) == len(floors) == len(known) == len(jobs):
        raise ValueError(f"evaluate_many: {len(rates)} rate ladders, {len(hints)} "
                         f"hints, {len(floors)} floors and {len(known)} known runs "
                         f"for {len(jobs)} jobs")
    if expected is None:
        expected = obj.needs_record
    prepared, groups, plan = _plan(jobs, obj, lanes)
    width = {k: w for k, (w, _) in plan.items()}
    # fill_lanes: a group whose rounds leave lanes idle asks for more rates per round
    points = {k: _points(len(v) * len(prepared[v[0]][0]), width[k]) if fill_lanes else 1
              for k, v in groups.items()}
    searches = [capacity_search(r, scs[0].nominal_rps, prefetch=plan[key][1],
                                expected=expected, hint=h, points=points[key],
                                floor=fl, known=kn)
                if obj.capacity else _own_rate()
                for (scs, _, _, key), r, h, fl, kn in zip(prepared, rates, hints, floors,
                                                          known)]
    pending = {i: next(s) for i, s in enumerate(searches)}
    results: list = [None] * len(jobs)
    rnd = 0
    while pending:
        rnd += 1
        asks = [(i, r) for i, rs in pending.items() for r in rs]
        log(f"exact evaluation round {rnd}: {len(asks)} run(s) to completion for "
            f"{len(pending)} job(s)")
        got = {}
        for key in groups:
            mine = [(i, r, x) for i, r in asks if prepared[i][3] == key
                    for x in prepared[i][0]]
            if not mine:
                continue
            runs = [(x if r is None else x.at_rate(r), prepared[i][1], prepared[i][2], r)
                    for i, r, x in mine]
            each = {}
            for (i, r, _), m in zip(mine, _run_group(runs, width[key])):
                each.setdefault((i, r), []).append(m)
            for (i, r), ms in each.items():  # in the order the search asked
                got.setdefault(i, []).append(mean_metrics(ms))
        for i in list(pending):
            try:
                pending[i] = searches[i].send(got[i])
            except StopIteration as stop:
                results[i] = stop.value
                del pending[i]
    for m in results:
        m["objective"] = float(obj(m))
    return results


def evaluate(sc: Scenario, system: str, params: dict | None = None, *,
             temperature: float = 0.0, objective: str = DEFAULT_OBJECTIVE,
             rates=None, hint: float | None = None) -> dict:
    """The objective and metrics of ``system`` on the scenario, exactly (or relaxed at
    ``temperature``). A capacity objective (goodput) runs the rate ladder ``rates``
    (default: :func:`tuner.objective.capacity.ladder_rates` of this policy's saturation
    rate; or, with ``hint``, two rates around it) and bisects its first crossing
    (:func:`tuner.objective.capacity.capacity_search`); the other metrics are then
    those at the highest rate found within the SLO target."""
    obj = parse_objective(objective)
    obj.check_metrics(system)
    if temperature:
        if obj.capacity:
            raise ValueError("capacity objectives are evaluated in exact mode here; "
                             "the relaxed ladder is tuner.objective.problem's")
        m = run(sc, system, params, temperature=temperature)
        m["objective"] = float(obj(m))
        return m
    return evaluate_many([(sc, system, params)], objective=objective, rates=[rates],
                         hints=[hint], lanes=1)[0]
