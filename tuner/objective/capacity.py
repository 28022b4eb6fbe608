"""Capacity objectives: how much load a policy takes under SLOs, in requests per second.

**Goodput** (DistServe's definition, used by eLLM section 5): the highest arrival rate at
which at least ``TARGET`` = 90% of requests meet both the TTFT and the TPOT SLO
(``slo_attainment``). The rate is changed by rescaling the trace's own arrival times
(every gap by the same factor), so its burst pattern is kept. **Saturation throughput**:
requests/s and tokens/s when every request arrives at once.

Relaxed and batched form (:func:`ladder_metrics`, one code path for exact and relaxed
mode): the simulator is ``vmap``-ped over a ladder of absolute rates ``r_1 < ... < r_K``
plus the saturation rung; the attainment curve is the piecewise-linear interpolation of
the rungs' attainments, anchored at ``(0, 1)`` (at no load every request meets SLOs that
are at least its uncontended latency), and goodput is the length of the set of rates
in ``[0, r_K]`` where the curve is at or above the target. For a curve that falls once
this is exactly its first crossing; it is continuous and piecewise linear in the rungs'
attainments, so the soft attainments of relaxed mode make it differentiable. Every other
metric is reported at the goodput operating point (interpolated between the two rungs
around it).

Exact validation (:func:`capacity_search`, :func:`exact_capacity`): runs to completion at
each rung, then bisection (in log rate) of the bracket of the first crossing to a
relative width ``rtol``, goodput interpolated in the final bracket. The search is a
generator of the rates it needs, so many searches (policies x held-out samples) run in
lockstep, each round's runs in one batched call.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from models.family import Metric
from tuner.scenario.rates import scale_arrivals

__all__ = ["CAPACITY_METRICS", "EXPECTED", "HINT_STEP", "RTOL", "RTOL_EXPECTED", "TARGET",
           "LADDER",
           "ladder_rates", "goodput_from", "ladder_metrics", "capacity_search", "drive",
           "exact_capacity"]

TARGET = 0.9          # share of requests within both SLOs (DistServe; eLLM section 5)
LADDER = (0.3, 1.5, 6)  # rungs: K rates geometric from lo to hi x the saturation rate
# the expected-attainment goodput (goodput_expected_rps) and what it is computed from
EXPECTED = frozenset({"goodput_expected_rps", "slo_attainment_expected"})
# its bisection's relative bracket width: the curve is smooth, so it is worth resolving
# finer than the count's 2% (linear interpolation in the final bracket does the rest)
RTOL_EXPECTED = 0.005
RTOL = 0.02  # the count-based goodput's bisection: relative bracket width
# a search started from an estimate of the goodput (``hint``) reads the rates hint / step
# and hint * step first and widens by step**2, then its square, ...: a bracket of
# 1.08**2 = 1.166 is bisected to the 2% width in three rounds
HINT_STEP = 1.08

CAPACITY_METRICS = {
    "goodput_rps": Metric("requests/s", "highest arrival rate (the trace's time pattern "
                          "rescaled) at which >= 90% of requests meet both SLOs"),
    "goodput_scale": Metric("x trace rate", "goodput_rps / the trace's own mean rate"),
    "goodput_expected_rps": Metric(
        "requests/s", "highest arrival rate at which the expected share of requests "
        "within both SLOs (slo_attainment_expected: each request's latencies under "
        "lognormal noise, averaged over the workload realisations evaluated) is >= 90%: "
        "continuous in the policy where goodput_rps moves in steps of one request"),
    "saturation_rps": Metric("requests/s", "finished requests/s when all arrive at once"),
    "saturation_tps": Metric("tokens/s", "output tokens/s when all requests arrive at "
                             "once (throughput at saturation)"),
}


def ladder_rates(saturation_rps: float, lo: float = LADDER[0], hi: float = LADDER[1],
                 n: int = LADDER[2]) -> np.ndarray:
    """``n`` rates geometric from ``lo`` to ``hi`` times a saturation rate."""
    if not (math.isfinite(saturation_rps) and saturation_rps > 0):
        raise ValueError(f"capacity ladder: saturation rate {saturation_rps!r} req/s "
                         "must be > 0 (no request finished at saturation)")
    return (saturation_rps * np.geomspace(lo, hi, n)).astype(np.float32)


def goodput_from(rates, attainment, target: float = TARGET):
    """Length of the set of rates in ``[0, r_K]`` where the piecewise-linear attainment
    curve through ``(0, 1), (r_1, a_1), ..., (r_K, a_K)`` is ``>= target``."""
    r = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.asarray(rates, jnp.float32)])
    a = jnp.concatenate([jnp.ones(1, jnp.float32), jnp.asarray(attainment, jnp.float32)])
    u, v = a[:-1] - target, a[1:] - target
    width = r[1:] - r[:-1]
    cross = (u >= 0) != (v >= 0)
    frac = jnp.where(cross, jnp.maximum(u, v) / jnp.maximum(jnp.abs(u - v), 1e-9), 0.0)
    share = jnp.where((u >= 0) & (v >= 0), 1.0, frac)
    return jnp.sum(width * share)


def ladder_metrics(run, inputs, rates, nominal_rps, target: float = TARGET) -> dict:
    """Capacity metrics of one scenario: ``run(inputs) -> metrics`` is ``vmap``-ped over
    the rungs ``rates`` (req/s, ascending) and a saturation rung; ``nominal_rps`` is the
    scenario's own mean arrival rate. Returns the capacity metrics plus every metric of
    ``run`` at the goodput operating point."""
    rates = jnp.asarray(rates, jnp.float32)
    factors = jnp.concatenate([nominal_rps / rates, jnp.zeros(1, jnp.float32)])
    ms = jax.vmap(lambda f: run(scale_arrivals(inputs, f)))(factors)
    k = rates.shape[0]
    good = goodput_from(rates, ms["slo_attainment"][:k], target)
    out = {name: jnp.interp(good, rates, v[:k]) for name, v in ms.items()}
    if "slo_attainment_expected" in ms:  # reported only by runs that keep their record
        out["goodput_expected_rps"] = goodput_from(rates, ms["slo_attainment_expected"][:k],
                                                   target)
    out.update(goodput_rps=good, goodput_scale=good / nominal_rps,
               saturation_rps=ms["requests_per_s"][k], saturation_tps=ms["tps"][k])
    return out


def capacity_search(rates, nominal_rps: float, target: float = TARGET,
                    rtol: float = RTOL, max_runs: int = 24, prefetch: bool = True,
                    expected: bool = False, hint: float | None = None,
                    points: int = 1, floor: float | None = None,
                    known: dict | None = None):
    """The exact goodput search as a generator, so that many searches can run in
    lockstep (:func:`tuner.objective.evaluate.evaluate_many` batches their runs): it
    yields lists of arrival rates to run to completion (``math.inf``: all at once) and
    is sent back their metrics, one dict per rate; it returns what
    :func:`exact_capacity` returns.

    With ``rates`` None the rungs are :func:`ladder_rates` of the policy's saturation
    rate, which is run first. With ``prefetch`` every rung is asked for in one list (one
    batched round), else one at a time as they are read (one run at a time: no run that
    is not read); the search reads them in order up to the first that misses the
    target, doubles above the ladder or halves below it, and bisects (in log rate) the
    bracket of that first crossing to a relative width ``rtol``, one rate per round.
    ``max_runs`` bounds the rates it reads (prefetched rungs past the first miss are run
    but not read). With ``expected`` it then finds, the same way and reusing every run,
    the crossing of ``slo_attainment_expected`` (to :data:`RTOL_EXPECTED`):
    ``goodput_expected_rps``.

    ``hint`` (req/s, with ``rates`` None): an estimate of the goodput, such as the
    policy's goodput on the training windows. The rungs are then ``hint / HINT_STEP``
    and ``hint * HINT_STEP`` (the first asked for with the saturation run), and the
    search widens by ``HINT_STEP**2`` instead of doubling, squaring the factor each
    time it widens again (a hint 8x off costs four rounds): about half the rounds of a
    ladder from the saturation rate when the hint is within some tens of percent, and
    no run at the ladder's low rates (the longest runs). It finds the same crossing
    where the attainment curve falls once (to ``rtol``; the points bisected differ);
    where the curve crosses the target more than once it finds the first crossing at
    or below the hint's bracket rather than the ladder's.

    ``points``: rates asked for per round where one would be read (rungs ahead,
    steps outwards, and a bisection that splits the bracket into ``points + 1`` equal
    parts in log rate), for a batch whose lanes would otherwise idle: fewer rounds
    for the same lanes. With one point the search is the bisection above.

    ``floor`` (req/s): the lowest rate worth knowing (for a search that only has to
    tell whether a policy beats one with a known goodput). Stepping down, no rate
    below it is run: once the target is missed at the floor the search stops, and the
    goodput is the estimate a search that ran out of runs gives (the line from full
    attainment at rate 0 to the miss), with ``capacity["below_floor"]`` True. Runs at
    low rates are a search's longest (a batched call waits for its slowest lane), and
    a policy far below the start is where a tuner's candidates spend them.

    ``known`` (``{rate: metrics}``, with ``rates`` None): runs to completion already
    made at those rates (a screen's run of the same policy on the same workload), read
    as the search's own. Let ``r`` be the highest. Where its run meets the target the
    crossing lies above ``r``: the first rungs are ``r`` and ``r * HINT_STEP**2``.
    Where it misses, the crossing lies below ``r``: the first rungs are the hint's two
    and then ``r`` where the hint lies below ``r / HINT_STEP`` (the bracket closes at
    ``r`` if both meet the target), else ``r / HINT_STEP**2`` and ``r``. The search
    then widens as a hinted one does. Known
    runs are not counted in ``capacity["runs"]`` or ``["iterations"]``: they were paid
    for where they were made."""
    runs = dict(known or {})
    if points < 1:
        raise ValueError(f"capacity search: points {points!r} must be >= 1")
    if floor is not None and not (math.isfinite(floor) and floor > 0):
        raise ValueError(f"capacity search: floor {floor!r} req/s must be > 0")
    if hint is not None and rates is None and not (math.isfinite(hint) and hint > 0):
        raise ValueError(f"capacity search: hint {hint!r} req/s must be > 0")
    step = 2.0
    if known:
        if rates is not None:
            raise ValueError("capacity search: known runs start the search; give no "
                             "rates with them")
        bad = [r for r in runs if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ValueError(f"capacity search: known run rates {bad!r} req/s must "
                             "be > 0")
        need_keys = ("slo_attainment", "slo_attainment_expected") if expected \
            else ("slo_attainment",)
        lack = sorted({k for m in runs.values() for k in need_keys if k not in m})
        if lack:
            raise ValueError(f"capacity search: known runs lack {', '.join(lack)}: the "
                             "search reads it from every run")
        r0, h = max(runs), HINT_STEP
        if runs[r0]["slo_attainment"] >= target:  # the crossing lies above r0
            rates, hint = [r0, r0 * h * h], r0 * h
        elif hint is not None and hint * h < r0:  # below: the hint's rungs, then r0
            rates = [hint / h, hint * h, r0]
        else:
            rates, hint = [r0 / (h * h), r0], r0 / h
        step = h * h
    elif hint is not None and rates is None:
        rates, step = [hint / HINT_STEP, hint * HINT_STEP], HINT_STEP ** 2

    def need(rs):
        rs = [r for r in rs if r not in runs]
        if rs:
            ms = yield rs
            runs.update(zip(rs, ms))

    if rates is None:
        yield from need([math.inf])
        rates = ladder_rates(runs[math.inf]["requests_per_s"])
    rates = [float(r) for r in rates]
    # the first rung is always read: asked for with the saturation run (the first not
    # already known)
    fresh = [r for r in rates if r not in runs]
    yield from need((rates if prefetch else fresh[:points]) + [math.inf])

    def below_floor(lo, hi):
        """Nothing within the target down to the floor: the search stops there."""
        return floor is not None and lo == 0.0 and hi is not None and hi <= floor

    def root(key, rtol):
        """(goodput, lo, hi, rates read) of the first crossing of ``key``."""
        used = set()

        def read(rs):
            """Read ``rs`` in order (each round asks for ``points`` of them) up to the
            first that misses the target: (last within it or None, first miss or
            None)."""
            last = None
            for i, r in enumerate(rs):
                yield from need(rs[i:i + points])
                used.add(r)
                if runs[r][key] < target:
                    return last, r
                last = r
            return last, None

        lo, hi = 0.0, None
        ok, hi = yield from read(rates)
        lo = ok or 0.0
        f = step  # a hinted search widens faster each time it misses the bracket
        while hi is None and len(used) < max_runs // 2:  # within target at the top rung
            top = max(used)
            ok, hi = yield from read([top * f ** j for j in range(1, points + 1)])
            lo = ok or lo
            f = f * f if hint is not None else f
        f = step
        while (lo == 0.0 and hi is not None and len(used) < max_runs // 2
               and not below_floor(lo, hi)):  # below it, to the floor
            downs = [hi / f ** j for j in range(1, points + 1)]
            if floor is not None:
                downs = sorted({max(r, floor) for r in downs}, reverse=True)
            for i, r in enumerate(downs):  # downwards: the first within the target
                yield from need(downs[i:i + points])
                used.add(r)
                if runs[r][key] >= target:
                    lo = r
                    break
                hi = r
            f = f * f if hint is not None else f
        while hi is not None and lo > 0 and hi / lo > 1.0 + rtol and len(used) < max_runs:
            # ``points`` rates splitting the bracket evenly in log rate (one: its middle)
            mids = ([math.sqrt(lo * hi)] if points == 1 else
                    [lo * (hi / lo) ** (j / (points + 1)) for j in range(1, points + 1)])
            ok, miss = yield from read(mids)
            lo = ok or lo
            hi = miss or hi
        if hi is None:  # never missed the target: the rate is not limited by the SLOs
            return lo, lo, hi, used
        a_lo = 1.0 if lo == 0.0 else runs[lo][key]
        a_hi = runs[hi][key]
        return lo + (a_lo - target) / max(a_lo - a_hi, 1e-9) * (hi - lo), lo, hi, used

    good, lo, hi, used = yield from root("slo_attainment", rtol)
    sat = runs[math.inf]
    at = dict(runs[lo]) if lo in used else dict(runs[min(used)])
    at.update(goodput_rps=good, goodput_scale=good / nominal_rps,
              saturation_rps=sat["requests_per_s"], saturation_tps=sat["tps"])
    cap = {"bracket_rps": [lo, hi], "saturation_iterations": sat.get("iterations"),
           "rungs": {f"{r:.6g}": runs[r]["slo_attainment"] for r in sorted(used)},
           "limited": hi is not None, "hint_rps": hint, "floor_rps": floor,
           "below_floor": below_floor(lo, hi)}
    if expected:
        good_e, lo_e, hi_e, used_e = yield from root("slo_attainment_expected",
                                                     min(rtol, RTOL_EXPECTED))
        at["goodput_expected_rps"] = good_e
        cap.update(expected_bracket_rps=[lo_e, hi_e],
                   expected_rungs={f"{r:.6g}": runs[r]["slo_attainment_expected"]
                                   for r in sorted(used_e)})
    # every run, both searches'; ``iterations``: the server iterations with work they
    # simulated (a cost on the scale of a fixed-horizon ladder's), None where a run's
    # metrics do not say
    made = [m for r, m in runs.items() if r not in (known or {})]
    its = [m.get("iterations") for m in made]
    at["capacity"] = {**cap, "runs": len(made), "known_runs": len(known or {}),
                      "iterations": None if None in its else float(sum(its))}
    return at


def drive(search, run_many):
    """Run one search generator (:func:`capacity_search`) to its result, its rates run
    by ``run_many(list of rates) -> list of metrics``."""
    try:
        rs = next(search)
        while True:
            rs = search.send(run_many(rs))
    except StopIteration as stop:
        return stop.value


def exact_capacity(run_at, rates, nominal_rps: float, target: float = TARGET,
                   rtol: float = RTOL, max_runs: int = 24) -> dict:
    """Exact goodput: ``run_at(rate) -> metrics`` (a run to completion at that arrival
    rate; ``math.inf``: all at once), by :func:`capacity_search` one run at a time.
    Returns the metrics at the highest rate found within the target, the capacity
    metrics, the bracket, the number of runs and the iterations they simulated."""
    return drive(capacity_search(rates, nominal_rps, target, rtol, max_runs, False),
                 lambda rs: [run_at(r) for r in rs])
