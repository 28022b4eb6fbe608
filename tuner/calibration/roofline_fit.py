"""Fit the step-time model to a measured server by gradient: ``tuner.calibrate``'s core.

The parameters (:data:`PARAMS`) are the roofline's efficiencies and overheads
(``hardware.RooflineParams``), each bounded and searched in log space:
``log x = log lo + (log hi - log lo) * sigmoid(u)``, ``u`` unconstrained.

Why not differentiate the scan directly. The pathwise derivative of a request's
first-token time through the simulator's clock holds every iteration index fixed, so it
accumulates the whole busy period before the request (the clock at iteration k is the
sum of every step time since the server was last idle): on the A100 benchmark run it
gave d loss / d log bw_eff = +719 where the central difference is -1.25. In the real
server a faster step does not move a later arrival's iteration boundary by the whole
history; the request's latency is the iterations it overlaps. So the latencies are
differentiated on the run's *schedule* (:class:`Schedule`): each iteration's work
(:class:`hardware.Work`, logged by the simulator), and per request the iteration it
arrived in (with the share of it still to run), its first-token and its last iteration::

    TTFT_i = gap_i + phase_i * dt[arr_i] + sum(dt[arr_i + 1 : first_i + 1]) + request_overhead
    TPOT_i = sum(dt[first_i + 1 : last_i + 1]) / (output_i - 1)

with ``dt = hardware.work_time(hw(theta), work)``. At the parameters of the run these are
the simulator's own latencies exactly; their gradient is the derivative with the
schedule held. :func:`fit` alternates an exact run (a new schedule) and optax Adam on
this function (multi-start, vmapped) until the loss stops improving.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

import hardware
from hardware.profile import PROFILE_FIELDS, PROFILE_FORMAT, load_profile, profile_values
from models import get_system, simulate, simulate_until_done, validate_params
from models.family import family_of

__all__ = ["PARAMS", "DEFAULT_FIT", "METRICS", "PROFILE_FORMAT", "Target", "Schedule",
           "FitResult", "apply", "exact_latencies", "exact_loss", "fit", "fit_cma",
           "latencies", "load_profile", "loss_terms", "profile_values", "schedule",
           "summarise"]


# name -> (low, high, meaning); bounds of the search box (log space)
PARAMS = {
    "mfu": (0.05, 1.0, "achieved share of the peak FLOP/s"),
    "bw_eff": (0.05, 1.0, "achieved share of the streaming bandwidth"),
    "step_overhead_s": (1e-5, 0.1, "fixed host seconds per iteration"),
    "token_overhead_s": (1e-9, 1e-3, "host seconds per token scheduled in an iteration"),
    "tp_comm_eff": (0.05, 1.0, "achieved share of the TP link bandwidth"),
    "request_overhead_s": (1e-5, 0.5, "client-seen seconds outside the engine loop, "
                                      "added to each TTFT"),
}
# a device profile (hardware.profile) sets exactly the fields fitted here
assert tuple(PARAMS) == PROFILE_FIELDS
# fitted by default; tp_comm_eff only with tensor parallelism (at tp 1 it has no effect)
DEFAULT_FIT = ("mfu", "bw_eff", "step_overhead_s", "token_overhead_s",
               "request_overhead_s")
QUANTILES = (50, 90, 99)
BINS = 8  # length bins of the TTFT / TPOT terms
# the latency metrics reported before/after (name -> (kind, percentile))
METRICS = {"ttft_p50_s": ("ttft", 50), "ttft_p90_s": ("ttft", 90),
           "ttft_p99_s": ("ttft", 99), "tpot_p50_s": ("tpot", 50),
           "tpot_p99_s": ("tpot", 99)}


@dataclasses.dataclass(frozen=True)
class Target:
    """What a benchmark measured, in the scenario's request order.

    ``ttft_s`` / ``tpot_s``: per request (NaN where not measured), or None; ``summary``:
    recorded aggregates such as ``tpot_p50_s`` (used for TPOT when there is no
    per-request TPOT); ``fit_mask``: the requests whose TTFTs the fit may see (the rest
    are held out and only predicted)."""

    ttft_s: np.ndarray | None
    tpot_s: np.ndarray | None
    summary: dict
    fit_mask: np.ndarray


def _box(name):
    lo, hi, _ = PARAMS[name]
    return math.log(lo), math.log(hi)


def to_u(values: dict, names) -> np.ndarray:
    """Unconstrained coordinates of ``values`` (clipped into the box)."""
    out = []
    for n in names:
        a, b = _box(n)
        z = (math.log(min(max(values[n], PARAMS[n][0] * 1.0001), PARAMS[n][1] * 0.9999))
             - a) / (b - a)
        out.append(math.log(z / (1.0 - z)))
    return np.asarray(out, np.float32)


def from_u(u, names) -> dict:
    """Parameter values of unconstrained ``u`` (traceable)."""
    out = {}
    for i, n in enumerate(names):
        a, b = _box(n)
        out[n] = jnp.exp(a + (b - a) * jax.nn.sigmoid(u[..., i]))
    return out


def apply(hw: hardware.RooflineParams, values: dict) -> hardware.RooflineParams:
    """``hw`` with the calibrated fields replaced (unknown names raise)."""
    unknown = set(values) - set(PARAMS)
    if unknown:
        raise ValueError(f"unknown calibration parameter(s) {sorted(unknown)}; known: "
                         f"{', '.join(PARAMS)}")
    return hw._replace(**values)


def current(hw: hardware.RooflineParams) -> dict:
    return {n: float(getattr(hw, n)) for n in PARAMS}


class Schedule(NamedTuple):
    """A run's schedule (busy iterations only) and each request's place in it."""

    work: hardware.Work    # [K] per busy iteration
    gap: jnp.ndarray       # [N] idle seconds between arrival and its first iteration
    phase: jnp.ndarray     # [N] share of the arrival iteration still to run
    arr: jnp.ndarray       # [N] int32 the iteration running at arrival
    first: jnp.ndarray     # [N] int32 the iteration of the first token
    last: jnp.ndarray      # [N] int32 the iteration of the last token
    output: jnp.ndarray    # [N] float32 output tokens
    done: jnp.ndarray      # [N] bool the request finished (else excluded)


@jax.jit
def latencies(hw: hardware.RooflineParams, sched: Schedule):
    """Per-request (TTFT, TPOT) of the schedule under ``hw`` (see the module doc)."""
    dt = hardware.work_time(hw, sched.work)
    cum = jnp.concatenate([jnp.zeros(1, dt.dtype), jnp.cumsum(dt)])  # cum[k] = sum dt[:k]
    ttft = (sched.gap + sched.phase * dt[sched.arr] + cum[sched.first + 1]
            - cum[sched.arr + 1] + hw.request_overhead_s)
    tpot = (cum[sched.last + 1] - cum[sched.first + 1]) / jnp.maximum(sched.output - 1, 1)
    return ttft, jnp.where(sched.output > 1, tpot, jnp.nan)


# one jitted wrapper for every logged run (a wrapper per call re-does the dispatch setup)
_simulate = jax.jit(simulate, static_argnames=("opts", "n_steps"))


def schedule(sc, hw, system: str = "paged", params: dict | None = None):
    """Run ``system`` exactly under ``hw``; its :class:`Schedule` and the per-request
    (TTFT, TPOT) of the run (numpy; NaN for requests that did not finish)."""
    p = validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw,
                        sc.deployment)
    p = {k: jnp.asarray(v) for k, v in p.items()}
    opts = sc.options(system, record=True)
    inputs = sc.inputs(system)  # built once: the exact run, the logged run, the check
    st = simulate_until_done(inputs, hw, p, opts)
    opts_log = dataclasses.replace(opts, work_log=True)
    n_steps = int(st.it)
    st, _, log = _simulate(inputs, hw, p, 0.0, opts_log, n_steps)
    if not bool(family_of(system).done(st, inputs)):
        raise RuntimeError("calibration: the logged run did not finish in the steps the "
                           "exact run took")
    busy = np.asarray(log.busy)
    keep = np.flatnonzero(busy)
    work = hardware.Work(*(np.asarray(w, np.float32)[keep] for w in log.work))
    end = np.asarray(log.clock, np.float64)[keep]
    dt = np.asarray(hardware.work_time(hw, work), np.float64)
    start = end - dt
    rec = st.rec
    wl = sc.workload
    arrival = np.asarray(wl.arrival_s, np.float64)
    first_s = np.asarray(rec.first_s, np.float64)
    fin_s = np.asarray(rec.finish_s, np.float64)
    done = np.isfinite(fin_s) & np.asarray(wl.valid)
    k_arr = np.clip(np.searchsorted(end, arrival, side="right"), 0, len(end) - 1)
    k_first = np.clip(np.searchsorted(end, np.where(done, first_s, 0.0), side="left"),
                      0, len(end) - 1)
    k_last = np.clip(np.searchsorted(end, np.where(done, fin_s, 0.0), side="left"),
                     0, len(end) - 1)
    busy_at = start[k_arr] <= arrival
    gap = np.where(busy_at, 0.0, start[k_arr] - arrival)
    phase = np.where(busy_at, (end[k_arr] - arrival) / np.maximum(dt[k_arr], 1e-30), 1.0)
    sched = Schedule(work=work, gap=jnp.asarray(gap, jnp.float32),
                     phase=jnp.asarray(np.clip(phase, 0.0, 1.0), jnp.float32),
                     arr=jnp.asarray(k_arr, jnp.int32), first=jnp.asarray(k_first, jnp.int32),
                     last=jnp.asarray(k_last, jnp.int32),
                     output=jnp.asarray(wl.output_tokens, jnp.float32),
                     done=jnp.asarray(done))
    out = np.asarray(wl.output_tokens)
    ttft = np.where(done, first_s - arrival + float(hw.request_overhead_s), np.nan)
    tpot = np.where(done & (out > 1), (fin_s - first_s) / np.maximum(out - 1, 1), np.nan)
    return sched, ttft, tpot


def exact_latencies(sc, hw, system: str = "paged", params: dict | None = None):
    """Per-request (TTFT, TPOT) of an exact run under ``hw`` (numpy, NaN where none)."""
    return schedule(sc, hw, system, params)[1:]


def _qs(x, mask, q):
    """Percentiles ``q`` of ``x`` over ``mask`` (linear interpolation, as numpy and
    vLLM's benchmark), differentiable in ``x``: masked-out entries sort to the end."""
    n = jnp.sum(mask)
    xs = jnp.sort(jnp.where(mask, x, jnp.inf))
    pos = (jnp.asarray(q, jnp.float32) / 100.0) * (n - 1)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, n - 1)
    w = pos - lo
    return xs[lo] * (1 - w) + jnp.where(w > 0, xs[hi], 0.0) * w


def _bin_errors(x, mask, log_meas, bins):
    """Per bin, the mean log of ``x`` minus the mean measured log, times the square
    root of the bin's share of the masked requests."""
    nb = BINS
    onehot = (bins[:, None] == jnp.arange(nb)[None, :]) & mask[:, None]
    w = onehot.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(w, 0), 1.0)
    d = jnp.where(mask, jnp.log(jnp.where(mask, x, 1.0)) - log_meas, 0.0)
    return (d @ w) / n * jnp.sqrt(n / jnp.maximum(jnp.sum(w), 1.0))


def residual_parts(ttft, tpot, meas: "TargetArrays") -> dict:
    """Log-error vectors whose squares sum to the loss: the mean log TTFT error per
    prompt-length bin of the fit requests (:data:`BINS` bins of equal count, weighted
    by their share), the TTFT percentiles of the fit requests, the mean log TPOT error
    per output-length bin when TPOT was measured per request, else the recorded TPOT
    aggregates. Bins, not single requests: a request's TTFT includes the rest of the
    iteration it arrived in, a phase that moves with every change of schedule, and the
    bin means average it out while keeping what each prompt length costs."""
    parts = {}
    m = meas.ttft_mask
    if meas.has_ttft:
        parts["ttft_bins"] = _bin_errors(ttft, m, meas.log_ttft, meas.ttft_bin)
        parts["ttft_quantiles"] = (jnp.log(_qs(ttft, m, jnp.asarray(QUANTILES)))
                                   - meas.log_ttft_q)
    tm = meas.tpot_mask & jnp.isfinite(tpot)
    if meas.has_tpot:
        parts["tpot_bins"] = _bin_errors(tpot, tm, meas.log_tpot, meas.tpot_bin)
    if meas.tpot_q.shape[0]:
        parts["tpot_quantiles"] = jnp.log(_qs(tpot, tm, meas.tpot_q)) - meas.log_tpot_qv
    return parts


def loss_terms(ttft, tpot, meas: "TargetArrays") -> dict:
    """Each part's sum of squares (see :func:`residual_parts`)."""
    return {k: jnp.sum(v ** 2) for k, v in residual_parts(ttft, tpot, meas).items()}


def residuals(ttft, tpot, meas: "TargetArrays"):
    return jnp.concatenate(list(residual_parts(ttft, tpot, meas).values()))


@struct.dataclass
class TargetArrays:
    """A :class:`Target` as arrays (the flags are static: they choose loss terms)."""

    has_ttft: bool = struct.field(pytree_node=False)
    has_tpot: bool = struct.field(pytree_node=False)
    ttft_mask: jnp.ndarray
    log_ttft: jnp.ndarray
    ttft_bin: jnp.ndarray     # [N] int32 prompt-length bin of each request
    tpot_bin: jnp.ndarray     # [N] int32 output-length bin
    log_ttft_q: jnp.ndarray
    tpot_mask: jnp.ndarray
    log_tpot: jnp.ndarray
    tpot_q: jnp.ndarray       # percentiles of the recorded TPOT aggregates
    log_tpot_qv: jnp.ndarray  # their log values


def _length_bins(x, mask):
    """Equal-count bins of ``x`` over ``mask`` (ranks, so ties split evenly)."""
    out = np.zeros(len(x), np.int32)
    idx = np.flatnonzero(mask)
    if len(idx):
        order = idx[np.argsort(np.asarray(x)[idx], kind="stable")]
        out[order] = (np.arange(len(order)) * BINS) // len(order)
    return out


def _arrays(meas: Target, done: np.ndarray, prompt, output) -> TargetArrays:
    fm = np.asarray(meas.fit_mask, bool) & done
    has_ttft = meas.ttft_s is not None
    ttft = np.asarray(meas.ttft_s if has_ttft else np.ones(len(done)), np.float64)
    tmask = fm & np.isfinite(ttft) & (ttft > 0)
    log_q = (np.log(np.percentile(ttft[tmask], QUANTILES)) if has_ttft and tmask.any()
             else np.zeros(len(QUANTILES)))
    has_tpot = meas.tpot_s is not None and np.isfinite(meas.tpot_s).any()
    tpot = np.asarray(meas.tpot_s if has_tpot else np.ones(len(done)), np.float64)
    pmask = (fm if has_tpot else done) & np.isfinite(tpot) & (tpot > 0)
    qs, vals = [], []
    if not has_tpot:  # the recorded aggregates over every request
        for q in QUANTILES:
            v = meas.summary.get(f"tpot_p{q}_s")
            if v is not None and v > 0:
                qs.append(q)
                vals.append(math.log(v))
    f32 = jnp.float32
    return TargetArrays(
        has_ttft=has_ttft, has_tpot=has_tpot, ttft_mask=jnp.asarray(tmask),
        log_ttft=jnp.asarray(np.log(np.where(tmask, ttft, 1.0)), f32),
        ttft_bin=jnp.asarray(_length_bins(prompt, tmask)),
        tpot_bin=jnp.asarray(_length_bins(output, pmask)),
        log_ttft_q=jnp.asarray(log_q, f32), tpot_mask=jnp.asarray(pmask),
        log_tpot=jnp.asarray(np.log(np.where(pmask, tpot, 1.0)), f32),
        tpot_q=jnp.asarray(qs, f32), log_tpot_qv=jnp.asarray(vals, f32))


def total_loss(ttft, tpot, arrays: TargetArrays):
    return jnp.sum(residuals(ttft, tpot, arrays) ** 2)


@dataclasses.dataclass
class FitResult:
    params: dict             # fitted values of every PARAMS entry (fixed ones included)
    fitted: tuple            # names that were fitted
    loss: float              # exact-run loss at the result
    loss_start: float        # exact-run loss at the start
    rounds: list             # per outer round: {"loss_schedule", "loss_exact", "seconds"}
    exact_runs: int          # exact simulations (schedules) used
    gradient_steps: int      # Adam steps on the schedule functions (all starts)
    seconds: float
    history: list = dataclasses.field(default_factory=list)  # (exact runs, seconds, loss)


def _start(hw, names):
    """Starting values: the model's own, zero-valued terms moved inside the box."""
    start = current(hw)
    for n in names:
        lo, hi, _ = PARAMS[n]
        start[n] = min(max(start[n], math.sqrt(lo * max(lo, 1e-6))), hi)
    return start


def _names(pairs, fit_names):
    tp = max(float(sc.hw.tp) for sc, _ in pairs)
    names = tuple(fit_names or [n for n in DEFAULT_FIT if n != "tp_comm_eff" or tp > 1])
    unknown = set(names) - set(PARAMS)
    if unknown:
        raise ValueError(f"unknown calibration parameter(s) {sorted(unknown)}; known: "
                         f"{', '.join(PARAMS)}")
    return names


def _exact(pairs, values, system):
    """Schedules, target arrays and the summed loss of exact runs at ``values``."""
    scheds, arrays, loss = [], [], 0.0
    for sc, target in pairs:
        sched, ttft, tpot = schedule(sc, apply(sc.hw, values), system)
        arr = _arrays(target, np.asarray(sched.done), np.asarray(sc.workload.prompt_tokens),
                      np.asarray(sc.workload.output_tokens))
        loss += float(total_loss(jnp.asarray(ttft, jnp.float32),
                                 jnp.asarray(tpot, jnp.float32), arr))
        scheds.append(sched)
        arrays.append(arr)
    return tuple(scheds), tuple(arrays), loss


def exact_loss(pairs, values: dict, system: str = "paged") -> float:
    """The calibration loss of exact runs with the roofline fields ``values``."""
    return _exact(pairs, values, system)[2]


def _polish(x0: dict, names, bases, scheds, arrays, max_nfev: int = 200) -> dict:
    """Gauss-Newton polish on the schedules' residuals: SciPy's bounded trust-region
    least squares (``trf``) in log space, Jacobian by ``jax.jacfwd``. Adam finds the
    basin; this converges in it (the problem is ill-conditioned: condition numbers of
    ~350 on a synthetic run, where Adam's 2000 steps still left 15% parameter errors)."""
    from scipy.optimize import least_squares

    def resid(x):
        v = {n: jnp.exp(x[i]) for i, n in enumerate(names)}
        return jnp.concatenate([residuals(*latencies(apply(b, v), s), a)
                                for b, s, a in zip(bases, scheds, arrays)])

    f, jac = jax.jit(resid), jax.jit(jax.jacfwd(resid))
    lo = np.array([_box(n)[0] for n in names])
    hi = np.array([_box(n)[1] for n in names])
    x = np.clip(np.log([x0[n] for n in names]), lo + 1e-6, hi - 1e-6)
    r = least_squares(lambda x: np.asarray(f(jnp.asarray(x, jnp.float32)), np.float64), x,
                      jac=lambda x: np.asarray(jac(jnp.asarray(x, jnp.float32)), np.float64),
                      bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=max_nfev)
    return {n: float(np.exp(r.x[i])) for i, n in enumerate(names)}


def fit(pairs, *, system: str = "paged", fit_names=None, starts: int = 8,
        steps: int = 300, lr: float = 0.05, rounds: int = 8, seed: int = 0,
        tol: float = 1e-3, patience: int = 2, progress=None) -> FitResult:
    """Calibrate the roofline shared by ``pairs`` ((scenario, :class:`Target`), one per
    measured file, all on one device) by gradient: outer rounds of (exact runs ->
    schedules, Adam on the schedules' latencies from ``starts`` starting points, the
    current parameters among them), keeping a round only when the exact-run loss
    falls; stops when it improves by less than ``tol`` (relative) or after ``rounds``."""
    names = _names(pairs, fit_names)
    t0 = time.perf_counter()
    values = _start(pairs[0][0].hw, names)
    scheds, arrays, best = _exact(pairs, values, system)
    loss0, runs, gsteps = best, len(pairs), 0
    history = [(runs, time.perf_counter() - t0, best)]
    log = []
    rng = np.random.default_rng(seed)
    bases = tuple(apply(sc.hw, values) for sc, _ in pairs)

    def objective(u, scheds, arrays):
        v = from_u(u, names)
        return sum(total_loss(*latencies(apply(b, v), s), a)
                   for b, s, a in zip(bases, scheds, arrays))

    opt = optax.adam(lr)

    @jax.jit
    def descend(u0, scheds, arrays):
        def one(u):
            def body(carry, _):
                u, s = carry
                g = jax.grad(objective)(u, scheds, arrays)
                g = jnp.where(jnp.isfinite(g), g, 0.0)
                upd, s = opt.update(g, s, u)
                return (optax.apply_updates(u, upd), s), None
            u, _ = jax.lax.scan(body, (u, opt.init(u)), None, length=steps)[0]
            return u, objective(u, scheds, arrays)
        return jax.vmap(one)(u0)

    # the schedule each round descends on is the last point's (a fixed-point
    # iteration: the true parameters reproduce their own schedule), the result is the
    # best point by exact loss; stop after ``patience`` rounds without a gain of ``tol``
    cur, stall = values, 0
    for r in range(rounds):
        tr = time.perf_counter()
        u0 = np.concatenate([to_u(cur, names)[None],
                             rng.normal(0.0, 1.5, (starts - 1, len(names)))
                             .astype(np.float32)])
        u_all, v_all = descend(jnp.asarray(u0), scheds, arrays)
        gsteps += starts * steps
        k = int(jnp.nanargmin(v_all))
        x0 = {n: float(v) for n, v in from_u(u_all[k], names).items()}
        cur = {**values, **_polish(x0, names, bases, scheds, arrays)}
        scheds, arrays, exact = _exact(pairs, cur, system)
        runs += len(pairs)
        log.append({"round": r + 1, "loss_adam": float(v_all[k]), "loss_exact": exact,
                    "seconds": time.perf_counter() - tr})
        if progress:
            progress(log[-1])
        gain = (best - exact) / max(best, 1e-12)
        if exact < best:
            best, values = exact, cur
        history.append((runs, time.perf_counter() - t0, best))
        stall = 0 if gain >= tol else stall + 1
        if stall >= patience or best <= 1e-12:
            break
    return FitResult(params=values, fitted=names, loss=best, loss_start=loss0,
                     rounds=log, exact_runs=runs, gradient_steps=gsteps,
                     seconds=time.perf_counter() - t0, history=history)


def fit_cma(pairs, *, system: str = "paged", fit_names=None, budget: int = 200,
            seed: int = 0, sigma0: float = 1.0, progress=None) -> FitResult:
    """The black-box baseline on the same loss: CMA-ES (the ``cma`` package) over the
    same unconstrained coordinates, each evaluation exact runs of every pair."""
    try:
        import cma
    except ImportError:  # pragma: no cover - declared in the [bench] extra
        raise RuntimeError("--method cma needs the cma package: pip install -e '.[bench]'")
    names = _names(pairs, fit_names)
    t0 = time.perf_counter()
    values = _start(pairs[0][0].hw, names)
    loss0 = best = exact_loss(pairs, values, system)
    runs = len(pairs)
    history = [(runs, time.perf_counter() - t0, best)]
    es = cma.CMAEvolutionStrategy(to_u(values, names).astype(float), sigma0,
                                  {"seed": seed + 1, "verbose": -9})
    while runs < budget * len(pairs) and not es.stop():
        xs = es.ask()
        fs = []
        for x in xs:
            v = {**values, **{n: float(y) for n, y in
                              from_u(jnp.asarray(x, jnp.float32), names).items()}}
            f = exact_loss(pairs, v, system)
            runs += len(pairs)
            fs.append(f)
            if f < best:
                best, best_v = f, v
            history.append((runs, time.perf_counter() - t0, best))
        es.tell(xs, fs)
        if progress:
            progress({"evaluations": runs, "loss": best})
    final = best_v if best < loss0 else values
    return FitResult(params=final, fitted=names, loss=best, loss_start=loss0, rounds=[],
                     exact_runs=runs, gradient_steps=0,
                     seconds=time.perf_counter() - t0, history=history)


def summarise(ttft, tpot, mask=None) -> dict:
    """The reported latency percentiles of per-request values (NaNs ignored)."""
    out = {}
    for name, (kind, q) in METRICS.items():
        x = np.asarray(ttft if kind == "ttft" else tpot, np.float64)
        if mask is not None:
            x = x[np.asarray(mask, bool)]
        x = x[np.isfinite(x)]
        out[name] = float(np.percentile(x, q)) if len(x) else float("nan")
    return out
