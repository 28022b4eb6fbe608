"""The gradient tuner: optax over theta, annealed temperature, per-parameter estimators,
checkpoints and the exact-mode validation gate. ``tuner.fit`` is its thin CLI.

The fit: (optionally) ``explore`` exact random samples compete with the start point; at
the chosen start, per-coordinate gradient checks against exact CRN finite differences pick
the temperature floor and each coordinate's estimator; then Adam climbs the relaxed *log*
objective while the temperature anneals from the warmest candidate to the floor. Every
``check_every`` steps the policy is evaluated exactly; the best exact policy seen (any
exact evaluation, finite-difference points included) is the result, and a check worse
than it by more than ``revert_tol`` restarts Adam from it with half the step size.

With many parameters the per-coordinate checks cost more than the descent (2 exact
evaluations per coordinate: 68 for odma-pb's 34): ``checks="directions"`` checks the
relaxed gradient along ``check_dirs`` random directions instead (2 evaluations each),
picks the floor from them and keeps the relaxed gradient for every coordinate;
``checks="auto"`` does so above ``AUTO_COORDS`` coordinates.

Finite differences are central by default. ``fd_scheme="forward"`` halves their cost (one
exact evaluation per coordinate, from the exact value the fit has already measured at
theta) but sees one side of a kink: on the piecewise-constant exact objectives of short
CRN slices it picked wrong estimators and stalled a fit that central differences finished
(README, "What we measured").
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from models import get_system, validate_params
from tuner.common.atomic import write_bytes_atomic
from tuner.objective.evaluate import evaluate
from tuner.search.feasible import for_problem
from tuner.search.gradcheck import VANISHING_RATIO, check, check_directions
from tuner.objective.problem import FD_SCHEMES, Problem, plan_ladder
from tuner.objective.objectives import parse_objective
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.objective.space import Space
from tuner.objective.validation import fit_slots

__all__ = ["AUTO_COORDS", "CHECKS", "FitSettings", "FitResult", "build_problem", "fit",
           "overload"]

CHECKS = ("coords", "directions", "auto")  # FitSettings.checks
AUTO_COORDS = 8  # checks="auto": per-coordinate checks up to this many coordinates



@dataclass(frozen=True)
class FitSettings:
    system: str = "odma"
    objective: str = "default"
    margin: float = 0.5           # train against bounds tightened by this share of their
                                  # slack (Objective.with_margin); validation does not
    budget: int = 20              # optimiser steps
    lr: float = 0.4               # adam step in theta space (halved on every revert)
    crn: int = 1                  # common-random-number seeds per training window
    fd_step: float = 0.1          # theta-space step of exact finite differences
    fd_scheme: str = "central"    # or forward: one evaluation per coordinate, reusing
                                  # the exact value the fit measured at theta
    checks: str = "coords"        # gradient checks at the start: per coordinate (2
                                  # exact evaluations each; per-coordinate estimators),
                                  # along check_dirs random directions (2 each, all
                                  # coordinates relaxed), or auto (coords up to
                                  # AUTO_COORDS coordinates, else directions)
    check_dirs: int = 4
    check_every: int = 2          # exact evaluation (best tracking, revert) cadence
    revert_tol: float = 0.03      # revert to the best point when an exact check is worse
    explore: int = 0              # exact random samples in the theta box before descent
    box: float = 5.0              # theta box of those samples
    checkpoint_every: int = 5
    holdout_seeds: int = 2        # held-out prediction/arrival seeds
    seed: int = 0
    temperatures: tuple = (0.3, 0.1, 0.03)  # candidates for the temperature floor
    start: dict = field(default_factory=dict)  # starting params (default: the paper's)
    repair: bool = True           # a step the system refuses to start moves its flat
                                  # coordinates until it starts (tuner.search.feasible)
    fleet: bool = False           # one policy per training scenario (a fleet's
                                  # replicas, each started from its own defaults)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def check(self) -> None:
        """One clear error for the first invalid setting."""
        rules = (("budget", self.budget >= 1, ">= 1"), ("lr", self.lr > 0, "> 0"),
                 ("margin", 0.0 <= self.margin < 1.0, "in [0, 1)"),
                 ("crn", self.crn >= 1, ">= 1"), ("fd_step", self.fd_step > 0, "> 0"),
                 ("fd_scheme", self.fd_scheme in FD_SCHEMES, f"one of {FD_SCHEMES}"),
                 ("checks", self.checks in CHECKS, f"one of {CHECKS}"),
                 ("check_dirs", self.check_dirs >= 1, ">= 1"),
                 ("check_every", self.check_every >= 1, ">= 1"),
                 ("revert_tol", self.revert_tol >= 0, ">= 0"),
                 ("explore", self.explore >= 0, ">= 0"), ("box", self.box > 0, "> 0"),
                 ("checkpoint_every", self.checkpoint_every >= 1, ">= 1"),
                 ("temperatures", len(self.temperatures) > 0
                  and all(t > 0 for t in self.temperatures), "non-empty, all > 0"),
                 ("fleet", not self.fleet or self.crn == 1,
                  "False with crn > 1 (a replica per scenario)"))
        for name, ok, want in rules:
            if not ok:
                raise ValueError(f"fit setting {name}={getattr(self, name)!r}: must be {want}")


@dataclass
class FitResult:
    params: dict
    default_params: dict
    estimators: dict
    floor: float
    history: list
    best_exact: float
    cost: float
    steps: int
    checks: list
    unit: int = 0  # request-iterations of one exact evaluation of the training problem
    train_objective: str = ""   # the objective trained against (margin included)
    rates: list | None = None   # the rate ladder of a capacity objective, req/s
    # the start policy's exact goodput on the training windows (mean), where measured,
    # and what measuring it cost: runs to completion and simulated slot-iterations
    # (the rate ladder is planned from it; not in ``cost``, which every search pays
    # alike)
    start_goodput_rps: float | None = None
    start_runs: int | None = None
    start_work: float | None = None
    # runs to completion the search itself made (None: fixed-horizon evaluations of the
    # training problem, counted by ``unit`` / ``cost``)
    runs: int | None = None


def _specs(spec) -> list[ScenarioSpec]:
    return list(spec) if isinstance(spec, (list, tuple)) else [spec]


def _train_scenarios(specs, crn: int):
    return fit_slots([build_scenario(s.replace(seed=s.seed + 7919 * k))
                      for s in _specs(specs) for k in range(crn)])


def _n_steps(sc, system, params) -> tuple[int, dict]:
    m = evaluate(sc, system, params, objective="tps")  # any family reports tps
    it = int(m["iterations"] + 1)
    return int(math.ceil(1.25 * it / sc.spec.block) * sc.spec.block), m


def overload(sc, goodput: float) -> str:
    return (f"the trace's own rate ({sc.nominal_rps:.3g} req/s) is above the start "
            f"policy's goodput ({goodput:.3g} req/s): served at its own timing, more "
            "than 10% of requests miss their SLOs (goodput rescales the arrivals)")


def _key(specs: list[ScenarioSpec], st: FitSettings) -> str:
    """What a checkpoint must match to be resumed (the budget may grow)."""
    settings = {k: v for k, v in st.to_dict().items() if k != "budget"}
    doc = json.dumps([[s.to_dict() for s in specs], settings], sort_keys=True,
                     default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _explore(prob: Problem, theta, st: FitSettings) -> None:
    """The start and ``st.explore`` uniform samples of the theta box, exactly, in one
    vmapped batch (the listeners see every value)."""
    rng = np.random.default_rng(st.seed)
    thetas = [theta] + [{n: jnp.asarray(rng.uniform(-st.box, st.box, np.shape(v)),
                                        jnp.float32) for n, v in theta.items()}
                        for _ in range(st.explore)]
    prob.batch(thetas)


def _direction_checks(prob: Problem, space: Space, theta, st: FitSettings, log) -> dict:
    """Gradient checks along ``st.check_dirs`` random unit directions of theta (exact CRN
    central differences, one batch): the temperature floor; every coordinate keeps the
    relaxed gradient (no per-coordinate finite differences during the descent)."""
    rng = np.random.default_rng(st.seed + 104729)
    dirs = []
    for _ in range(st.check_dirs):
        raw = {n: rng.standard_normal(np.shape(v)) for n, v in theta.items()}
        norm = math.sqrt(sum(float(np.sum(x * x)) for x in raw.values()))
        dirs.append({n: x / norm for n, x in raw.items()})
    log(f"gradient checks: the start exactly, then exact CRN finite differences along "
        f"{len(dirs)} random directions ({2 * len(dirs)} evaluations in one batch)")
    v0, m0 = prob.value(theta)
    h = st.fd_step
    pts = [{n: theta[n] + s * h * jnp.asarray(v[n], jnp.float32) for n in theta}
           for v in dirs for s in (1.0, -1.0)]
    vals = prob.batch(pts, log=True)
    fd = [float(vals[2 * j] - vals[2 * j + 1]) / (2 * h) for j in range(len(dirs))]
    agree = {}
    for t in st.temperatures:
        agree[t], mr = check_directions(prob, theta, t, dirs, fd)
        log(f"check T={t:g} (relaxed log objective "
            f"{abs(mr['log_objective'] - m0['log_objective']):.3f} from exact): "
            + ", ".join(f"{c.label} relaxed {c.relaxed:+.3g} exact-FD {c.exact_fd:+.3g} "
                        f"{_verdict(c)}" for c in agree[t]))
    floor = _floor(agree, st.temperatures)
    log(f"temperature floor {floor:g}; every coordinate uses the relaxed gradient")
    log(f"exact objective at start: {v0:.6g} (n_steps {prob.n_steps})")
    est = {f"{n}[{i}]": "relaxed" for n, i in space.coords()}
    return {"floor": floor, "estimators": est, "lv": m0["log_objective"],
            "checks": [[c.__dict__ for c in agree[t]] for t in st.temperatures]}


def _floor(agree: dict, temperatures) -> float:
    """The coldest temperature whose gradient is usable (``agree`` or ``flat`` by
    :func:`tuner.search.gradcheck.classify`; ``vanishing`` and ``disagree`` are not) on at
    least half of the checks (else the most usable one): the anneal stops where the
    surrogate still points the way the exact objective moves."""
    n_ok = {t: sum(c.usable for c in agree[t]) for t in temperatures}
    ok = [t for t in temperatures if 2 * n_ok[t] >= len(agree[t])]
    return min(ok) if ok else max(temperatures, key=lambda t: (n_ok[t], -t))


def _initial_checks(prob: Problem, space: Space, theta, st: FitSettings, log) -> dict:
    """Gradient checks at the start point: the temperature floor and per-coordinate
    estimators (see the module docstring of :mod:`tuner.search.gradcheck`)."""
    n = len(space.coords())
    if st.checks == "directions" or (st.checks == "auto" and n > AUTO_COORDS):
        return _direction_checks(prob, space, theta, st, log)
    log(f"gradient checks: the start exactly, then exact CRN finite differences of {n} "
        f"coordinates ({(2 if st.fd_scheme == 'central' else 1) * n} evaluations in one "
        "batch)")
    v0, m0 = prob.value(theta)
    fd = prob.fd(theta, space.coords(), st.fd_step, scheme=st.fd_scheme,
                 base=m0["log_objective"])
    agree, gap = {}, {}
    for t in st.temperatures:
        log(f"gradient checks: relaxed gradient at T={t:g}")
        res, _, mr = check(prob, theta, t, fd, st.fd_step)
        agree[t] = res
        gap[t] = abs(mr["log_objective"] - m0["log_objective"])
        log(f"check T={t:g} (relaxed log objective {gap[t]:.3f} from exact): " + ", ".join(
            f"{c.label} relaxed {c.relaxed:+.3g} exact-FD {c.exact_fd:+.3g}"
            f" {_verdict(c)}" for c in res))
    floor = _floor(agree, st.temperatures)
    log(f"temperature floor {floor:g}")
    est = estimators(agree[floor])
    for c in agree[floor]:
        if c.status == "flat":  # nothing to agree with: say so, not "agrees"
            why = f"exact objective flat along it (finite difference {c.exact_fd:.3g})"
        elif c.status == "agree":
            why = ("relaxed gradient agrees in sign with exact CRN finite differences; "
                   f"rel. error {c.rel_error:.2f}")
        elif c.status == "vanishing":
            why = (f"relaxed gradient vanishes at the floor ({c.relaxed:+.3g} against an "
                   f"exact difference of {c.exact_fd:+.3g}: under "
                   f"{VANISHING_RATIO:.0%} of it)")
        else:
            why = ("relaxed gradient has the wrong sign at the floor; "
                   f"rel. error {c.rel_error:.2f}")
        log(f"estimator {c.label}: {est[c.label]} ({why})")
    log(f"exact objective at start: {v0:.6g} (n_steps {prob.n_steps})")
    return {"floor": floor, "estimators": est, "lv": m0["log_objective"],
            "checks": [[c.__dict__ for c in agree[t]] for t in st.temperatures]}


def build_problem(spec, st: FitSettings, log=lambda s: None,
                  warn=lambda s: None) -> tuple[Problem, dict]:
    """The training problem of a fit (the training windows ``spec`` (one spec or a
    list) x ``st.crn`` seeds, horizon, rate ladder for a capacity objective, space
    around ``st.start``) and the system's default parameters. Equal settings give equal
    compiled shapes, so problems built twice share their compiled code."""
    sys_spec = get_system(st.system)
    scs = _train_scenarios(_specs(spec), st.crn)
    if len({s.cfg.max_len for s in scs}) > 1:
        raise ValueError("training windows differ in max_len; give --max-len")
    max_len = scs[0].cfg.max_len
    if st.fleet:  # each replica from its own device's defaults
        defaults = [validate_params(sys_spec, {}, max_len, sc.hw, sc.deployment)
                    for sc in scs]
        start = [validate_params(sys_spec, st.start, max_len, sc.hw, sc.deployment)
                 for sc in scs]
        default = {k: np.stack([np.asarray(d[k], np.float32) for d in defaults])
                   for k in defaults[0]}
    else:
        default = validate_params(sys_spec, {}, max_len, scs[0].hw,
                                  scs[0].deployment)
        start = validate_params(sys_spec, st.start, max_len, scs[0].hw,
                                scs[0].deployment)
    space = Space(sys_spec, start)
    if not space.names:
        raise ValueError(f"system {st.system!r} has no gradient-tunable parameters")
    objective = parse_objective(st.objective).with_margin(st.margin)
    objective.check_metrics(st.system)
    rates = None
    if objective.capacity:
        log(f"rate ladder: exact goodput of the start policy on {len(scs)} training "
            "scenario(s)")
        rates, n_steps, caps = plan_ladder(scs, st.system, start)
        log("start goodput " + ", ".join(f"{c['goodput_rps']:.3g}" for c in caps)
            + " req/s; rungs " + "; ".join(", ".join(f"{r:.3g}" for r in row)
                                           for row in np.atleast_2d(rates))
            + f" req/s + saturation; horizon {n_steps} iterations")
        for sc, c in zip(scs, caps):
            if sc.nominal_rps > c["goodput_rps"]:
                warn(overload(sc, c["goodput_rps"]))
                break
        for sc, c in zip(scs, caps):
            if c["goodput_rps"] > 1.5 * c["saturation_rps"]:
                warn(finite_window(sc, c))
                break
    else:
        n_steps, m = _n_steps(scs[0], st.system, start[0] if st.fleet else start)
        if m["queue_delay_mean_s"] > 10 * scs[0].slo["ttft_s"]:
            warn(f"the server is overloaded at the trace's own arrival times: mean "
                 f"queueing delay {m['queue_delay_mean_s']:.4g} s (TTFT SLO "
                 f"{scs[0].slo['ttft_s']:.3g} s); throughput objectives then measure "
                 "the backlog, not the policy (the goodput objective rescales arrivals)")
    prob = Problem(scs, st.system, space, objective, n_steps, rates)
    if rates is not None:
        prob.start_goodputs = [float(c["goodput_rps"]) for c in caps]
        prob.start_goodput = float(np.mean(prob.start_goodputs))
        prob.start_runs = int(sum(c["capacity"]["runs"] for c in caps))
        its = [c["capacity"]["iterations"] for c in caps]
        prob.start_work = (None if None in its else
                           float(sum(its)) * scs[0].cfg.n_slots)
    return prob, default


def finite_window(sc, cap: dict) -> str:
    """The warning for a window whose goodput exceeds its own saturation throughput: so
    few requests that the server absorbs them as one burst (sustained load cannot be
    served faster than requests finish when they all wait)."""
    n = int(np.sum(np.asarray(sc.workload.valid)))
    held = cap.get("max_batch_size")
    held = f" (up to {held:.0f} requests decode together)" if held else ""
    return (f"a training window of {n} requests has goodput {cap['goodput_rps']:.3g} "
            f"req/s, above its saturation throughput {cap['saturation_rps']:.3g} req/s "
            f"(all requests at once): the server absorbs the window as one burst{held}, "
            "so goodput measures a finite burst, not sustained load; use more "
            "--window-requests")


def _verdict(c) -> str:
    """A gradient check in one word (:func:`tuner.search.gradcheck.classify`): flat, agree,
    VANISHING or DISAGREE (the last two in capitals: the fit will not trust them)."""
    return c.status if c.usable else c.status.upper()


def estimators(checks) -> dict:
    """Per coordinate label: ``relaxed`` where the check is usable (agree, flat), else
    ``fd-crn`` (disagree and vanishing: exact CRN finite differences)."""
    return {c.label: ("relaxed" if c.usable else "fd-crn") for c in checks}


def fit(spec, st: FitSettings, *, checkpoint: Path | None = None,
        resume: bool = False, log=print, progress=None, listeners=(),
        warn=lambda s: None, grad_cost: float | None = None) -> FitResult:
    """Tune ``st.system`` on ``spec`` (the training slice) by gradient.

    Adam climbs the relaxed log objective while the temperature anneals from the warmest
    candidate to the floor; every ``check_every`` steps the policy is evaluated exactly,
    the best exact policy is kept, and a check worse than the best by more than
    ``revert_tol`` restarts the optimiser from the best point with half the step.
    ``listeners`` receive ``(cost, theta, value)`` for every exact evaluation;
    ``grad_cost`` (exact evaluations per relaxed gradient, default ``Problem``'s) is what
    the fit's cost charges a gradient step.
    """
    st.check()
    specs = _specs(spec)
    key = _key(specs, st)
    if resume and (checkpoint is None or not checkpoint.exists()):
        raise ValueError(f"--resume: there is no checkpoint at {checkpoint} to resume "
                         "(run without --resume to start)")
    if resume:  # read it before any work: a foreign or corrupt file fails at once
        _peek_ckpt(checkpoint, key)
    prob, default = build_problem(specs, st, log, warn)
    if grad_cost is not None:
        prob.grad_cost = float(grad_cost)
    space = prob.space
    prob.listeners.extend(listeners)
    theta = space.to_theta(space.base)
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.inject_hyperparams(optax.adam)(learning_rate=st.lr))
    state = None
    if resume:
        state = _load_ckpt(checkpoint, key, theta, opt.init(theta))
        log(f"resumed from {checkpoint} at step {state['step']} of {st.budget} "
            f"(gradient checks done; best exact objective so far {state['best']:.6g})")
    best = {"value": -math.inf, "theta": theta}

    def keep_best(cost, th, v):
        if v > best["value"]:
            best.update(value=v, theta=th)
    prob.listeners.append(keep_best)
    if state is None:
        if st.explore > 0:  # the start competes with the samples in one batch
            _explore(prob, theta, st)
            log(f"explored {st.explore} random policies: best exact {best['value']:.6g}")
            theta = best["theta"]
        state = _initial_checks(prob, space, theta, st, log)
        state.update(theta=theta, opt_state=opt.init(theta), step=0, lr=st.lr,
                     best_theta=best["theta"], best=best["value"], history=[])
        if checkpoint is not None:  # the checks are the fit's most expensive minute
            _save_ckpt(checkpoint, key, state)
            log(f"checkpoint after the gradient checks: {checkpoint}")
    best.update(value=state["best"], theta=state["best_theta"])
    floor, est = state["floor"], state["estimators"]
    t0 = max(st.temperatures[0], floor)
    sched = optax.exponential_decay(t0, max(st.budget - 1, 1), floor / t0, end_value=floor)
    theta, opt_state = state["theta"], state["opt_state"]
    fd_coords = [c for c in space.coords() if est[f"{c[0]}[{c[1]}]"] == "fd-crn"]
    repair = for_problem(prob, get_system(st.system)) if st.repair else None
    lv = state.get("lv")  # exact log objective measured at theta (None: not measured)
    for step in range(state["step"], st.budget):
        t = float(sched(step))
        v, g, _ = prob.grad(theta, t)
        rec = {"step": step + 1, "temperature": t, "relaxed": v}
        fd = prob.fd(theta, fd_coords, st.fd_step, scheme=st.fd_scheme, base=lv)
        for (name, i), d in fd.items():
            g[name] = g[name].reshape(-1).at[i].set(d).reshape(g[name].shape)
        g = {k: -jnp.where(jnp.isfinite(x), x, 0.0) for k, x in g.items()}
        upd, opt_state = opt.update(g, opt_state, theta)
        theta = optax.apply_updates(theta, upd)
        if repair is not None:  # a step the system refuses: flat coordinates restore it
            theta, moved = repair(theta, g)
            if moved:
                rec["repaired"] = [{"param": n, "index": i, "theta_delta": d}
                                   for n, i, d in moved]
        lv = None
        if (step + 1) % st.check_every == 0 or step + 1 == st.budget:
            ve, me = prob.value(theta)
            rec["exact"], lv = ve, me["log_objective"]
            if ve < best["value"] - st.revert_tol * abs(best["value"]):
                theta, state["lr"], lv = best["theta"], state["lr"] * 0.5, None
                opt_state = opt.init(theta)
                opt_state[1].hyperparams["learning_rate"] = jnp.asarray(state["lr"])
                rec["reverted"] = True
        rec["cost"] = prob.cost
        state["history"].append(rec)
        state.update(theta=theta, opt_state=opt_state, step=step + 1, lv=lv,
                     best=best["value"], best_theta=best["theta"])
        if progress is not None:
            progress(rec)
        if checkpoint is not None and ((step + 1) % st.checkpoint_every == 0
                                       or step + 1 == st.budget):
            _save_ckpt(checkpoint, key, state)
    prob.listeners.remove(keep_best)
    return FitResult(params=space.human(space.to_params(best["theta"])),
                     default_params=space.human(default), estimators=est, floor=floor,
                     history=state["history"], best_exact=best["value"], cost=prob.cost,
                     steps=state["step"], checks=state["checks"], unit=prob.unit,
                     train_objective=prob.objective.describe(),
                     rates=None if prob.rates is None else prob.rates.tolist(),
                     start_goodput_rps=prob.start_goodput,
                     start_runs=prob.start_runs, start_work=prob.start_work)


def _save_ckpt(path: Path, key: str, state: dict) -> None:
    meta = {k: state[k] for k in ("step", "lr", "floor", "estimators", "best", "history",
                                  "checks", "lv")}
    blob = {"key": key, "meta": json.dumps(meta, default=float),
            "arrays": serialization.to_state_dict(
                {"theta": state["theta"], "opt_state": state["opt_state"],
                 "best_theta": state["best_theta"]})}
    write_bytes_atomic(path, serialization.msgpack_serialize(blob))


def _peek_ckpt(path: Path, key: str) -> dict:
    try:
        blob = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt file
        raise ValueError(f"{path}: checkpoint is unreadable ({e})") from None
    if not isinstance(blob, dict) or blob.get("key") != key:
        raise ValueError(f"{path}: checkpoint belongs to a different scenario or settings")
    return blob


def _load_ckpt(path: Path, key: str, theta, opt_state) -> dict:
    blob = _peek_ckpt(path, key)
    template = {"theta": theta, "opt_state": opt_state, "best_theta": theta}
    arrays = serialization.from_state_dict(template, blob["arrays"])
    state = json.loads(blob["meta"])
    state.update(arrays)
    return state
