"""The gradient tuner: optax over theta, annealed temperature, per-parameter estimators,
checkpoints and the exact-mode validation gate. ``tuner.fit`` is its thin CLI."""

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
from tuner.evaluate import evaluate
from tuner.atomic import write_bytes_atomic
from tuner.gradcheck import Problem, check
from tuner.objectives import parse_objective
from tuner.scenario import ScenarioSpec, build_scenario
from tuner.space import Space

__all__ = ["FitSettings", "FitResult", "fit", "validate"]

MAX_VALUE_GAP = 0.25  # a usable surrogate's value is within 25% of the exact one


@dataclass(frozen=True)
class FitSettings:
    system: str = "odma"
    objective: str = "default"
    budget: int = 20              # optimiser steps
    lr: float = 0.08
    crn: int = 2                  # common-random-number workloads per evaluation
    fd_step: float = 0.1          # theta-space step of exact finite differences
    check_every: int = 5          # exact evaluation (and best tracking) cadence
    checkpoint_every: int = 5
    holdout_seeds: int = 2        # held-out prediction/arrival seeds
    seed: int = 0
    temperatures: tuple = (0.3, 0.1, 0.03, 0.01)  # candidates for the temperature floor
    start: dict = field(default_factory=dict)  # starting params (default: the paper's)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


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


def _train_scenarios(spec: ScenarioSpec, crn: int):
    return [build_scenario(spec.replace(seed=spec.seed + 7919 * k)) for k in range(crn)]


def _n_steps(sc, system, params) -> int:
    m = evaluate(sc, system, params)
    it = int(m["iterations"] + 1)
    return int(math.ceil(1.25 * it / sc.spec.refresh_check) * sc.spec.refresh_check)


def _atomic_bytes(path: Path, data: bytes) -> None:
    write_bytes_atomic(path, data)


def _key(spec: ScenarioSpec, st: FitSettings) -> str:
    """What a checkpoint must match to be resumed (the budget may grow)."""
    settings = {k: v for k, v in st.to_dict().items() if k != "budget"}
    doc = json.dumps([spec.to_dict(), settings], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def fit(spec: ScenarioSpec, st: FitSettings, *, checkpoint: Path | None = None,
        resume: bool = False, log=print, progress=None) -> FitResult:
    """Tune ``st.system`` on ``spec`` (the training slice) by gradient."""
    sys_spec = get_system(st.system)
    scs = _train_scenarios(spec, st.crn)
    max_len = scs[0].cfg.max_len
    default = validate_params(sys_spec, {}, max_len)
    start = validate_params(sys_spec, st.start, max_len)
    space = Space(sys_spec, start)
    if not space.names:
        raise ValueError(f"system {st.system!r} has no gradient-tunable parameters")
    n_steps = _n_steps(scs[0], st.system, start)
    obj = parse_objective(st.objective)
    prob = Problem(scs, st.system, space, obj, n_steps)
    theta = space.to_theta({k: jnp.asarray(v) for k, v in start.items()})
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(st.lr))
    opt_state = opt.init(theta)
    key = _key(spec, st)
    state = None
    if resume and checkpoint is not None and checkpoint.exists():
        state = _load_ckpt(checkpoint, key, theta, opt_state)
        log(f"resumed from {checkpoint} at step {state['step']}")
    if state is None:
        # gradient checks choose the temperature floor and each coordinate's estimator
        fd = prob.fd(theta, space.coords(), st.fd_step)
        v0, m0 = prob.value(theta)
        agree, gap = {}, {}
        for t in st.temperatures:
            res, _ = check(prob, theta, t, fd, st.fd_step)
            agree[t] = res
            gap[t] = abs(prob.value(theta, t)[0] - v0) / max(abs(v0), 1e-9)
            log(f"check T={t:g} (relaxed value {gap[t]:.1%} from exact): " + ", ".join(
                f"{c.label} relaxed {c.relaxed:+.3g} exact-FD {c.exact_fd:+.3g}"
                f" {'agree' if c.sign_agrees else 'DISAGREE'}" for c in res))
        # floor: among temperatures whose relaxed objective is close to the exact one,
        # the one whose gradient agrees in sign on the most coordinates (ties: colder)
        usable = [t for t in st.temperatures if gap[t] <= MAX_VALUE_GAP] or \
            [min(st.temperatures, key=lambda t: gap[t])]
        floor = min(usable, key=lambda t: (-sum(c.sign_agrees for c in agree[t]), t))
        log(f"temperature floor {floor:g}")
        est = {c.label: ("relaxed" if c.sign_agrees else "fd-crn") for c in agree[floor]}
        for c in agree[floor]:
            why = ("relaxed gradient agrees in sign with exact CRN finite differences"
                   if c.sign_agrees else "relaxed gradient has the wrong sign at the floor")
            log(f"estimator {c.label}: {est[c.label]} ({why}; rel. error {c.rel_error:.2f})")
        state = {"theta": theta, "opt_state": opt_state, "step": 0, "floor": floor,
                 "estimators": est, "best_theta": theta, "best": v0, "history": [],
                 "checks": [[c.__dict__ for c in agree[t]] for t in st.temperatures]}
        log(f"exact objective at start: {v0:.6g} (n_steps {n_steps})")
    floor, est = state["floor"], state["estimators"]
    t0 = max(st.temperatures[0], floor)
    sched = optax.exponential_decay(t0, max(st.budget - 1, 1), floor / t0, end_value=floor)
    theta, opt_state = state["theta"], state["opt_state"]
    fd_coords = [c for c in space.coords() if est[f"{c[0]}[{c[1]}]"] == "fd-crn"]
    for step in range(state["step"], st.budget):
        t = float(sched(step))
        v, g, _ = prob.grad(theta, t)
        if fd_coords:
            for (name, i), d in prob.fd(theta, fd_coords, st.fd_step).items():
                g[name] = g[name].reshape(-1).at[i].set(d).reshape(g[name].shape)
        g = {k: jnp.where(jnp.isfinite(x), x, 0.0) for k, x in g.items()}
        upd, opt_state = opt.update(jax_neg(g), opt_state, theta)
        theta = optax.apply_updates(theta, upd)
        rec = {"step": step + 1, "temperature": t, "relaxed": v}
        if (step + 1) % st.check_every == 0 or step + 1 == st.budget:
            ve, _ = prob.value(theta)
            rec["exact"] = ve
            if ve > state["best"]:
                state["best"], state["best_theta"] = ve, theta
        state["history"].append(rec)
        state.update(theta=theta, opt_state=opt_state, step=step + 1)
        if progress is not None:
            progress(rec)
        if checkpoint is not None and ((step + 1) % st.checkpoint_every == 0
                                       or step + 1 == st.budget):
            _save_ckpt(checkpoint, key, state)
    best = space.to_params(state["best_theta"])
    return FitResult(params=space.human(best), default_params=space.human(default),
                     estimators=est, floor=floor, history=state["history"],
                     best_exact=state["best"], cost=prob.cost, steps=state["step"],
                     checks=state["checks"])


def jax_neg(tree):
    return {k: -v for k, v in tree.items()}


def _save_ckpt(path: Path, key: str, state: dict) -> None:
    meta = {k: state[k] for k in ("step", "floor", "estimators", "best", "history", "checks")}
    blob = {"key": key, "meta": json.dumps(meta, default=float),
            "arrays": serialization.to_state_dict(
                {"theta": state["theta"], "opt_state": state["opt_state"],
                 "best_theta": state["best_theta"]})}
    _atomic_bytes(path, serialization.msgpack_serialize(blob))


def _load_ckpt(path: Path, key: str, theta, opt_state) -> dict:
    try:
        blob = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - any decoding failure is a corrupt file
        raise ValueError(f"{path}: checkpoint is unreadable ({e})") from None
    if blob.get("key") != key:
        raise ValueError(f"{path}: checkpoint belongs to a different scenario or settings")
    template = {"theta": theta, "opt_state": opt_state, "best_theta": theta}
    arrays = serialization.from_state_dict(template, blob["arrays"])
    state = json.loads(blob["meta"])
    state.update(arrays)
    return state


def validate(spec: ScenarioSpec, system: str, tuned: dict, default: dict, objective: str,
             *, holdout: ScenarioSpec, seeds: int, baseline: str | None = None) -> dict:
    """Exact-mode evaluation of tuned, default and baseline on held-out data."""
    baseline = baseline or get_system(system).baseline
    runs = {"tuned": [], "default": [], "baseline": []}
    for k in range(seeds):
        sc = build_scenario(holdout.replace(seed=holdout.seed + 1000 + k))
        runs["tuned"].append(evaluate(sc, system, tuned, objective=objective))
        runs["default"].append(evaluate(sc, system, default, objective=objective))
        runs["baseline"].append(evaluate(sc, baseline, {}, objective=objective))
    out = {}
    for name, ms in runs.items():
        out[name] = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
        out[name]["objective_per_seed"] = [m["objective"] for m in ms]
    out["baseline"]["system"] = baseline
    return out
