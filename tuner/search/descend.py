"""Gradient descent on any compiled problem (``tuner.objective.problem.Problem`` or a
subclass such as ``tuner.objective.learned.LearnedProblem``): Adam on the relaxed log
objective, the temperature annealed geometrically, an exact check every
``check_every`` steps that keeps the best policy and, when the check is worse than the
best by more than ``revert_tol``, restarts Adam from the best with half the step.

It is :func:`tuner.search.fitting.fit`'s loop without the per-coordinate gradient
checks, which cost two exact evaluations per coordinate: for problems of hundreds of
coordinates (a learned policy's weights) they would spend a black-box method's whole
budget before the first step. Its cost is what ``prob.cost`` counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import optax

__all__ = ["DescentResult", "descend"]


@dataclass(frozen=True)
class DescentResult:
    best_theta: dict
    best_value: float   # the best exact objective seen (the start's included)
    start_value: float
    history: list       # per step: temperature, relaxed value, exact value if checked


def descend(prob, steps: int, *, lr: float = 0.05, t_start: float = 0.3,
            t_end: float = 0.03, check_every: int = 2, revert_tol: float = 0.03,
            progress=None) -> DescentResult:
    """``steps`` relaxed gradient steps from ``prob.space.base`` (see the module)."""
    for name, ok, want in (("steps", steps >= 1, ">= 1"), ("lr", lr > 0, "> 0"),
                           ("t_start", t_start > 0, "> 0"),
                           ("t_end", 0 < t_end <= t_start, "in (0, t_start]"),
                           ("check_every", check_every >= 1, ">= 1"),
                           ("revert_tol", revert_tol >= 0, ">= 0")):
        if not ok:
            raise ValueError(f"descend: {name} must be {want}")
    theta = prob.space.to_theta(prob.space.base)
    start, _ = prob.value(theta)
    best = {"value": start if math.isfinite(start) else -math.inf, "theta": theta}
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.inject_hyperparams(optax.adam)(learning_rate=lr))
    state, rate = opt.init(theta), lr
    sched = optax.exponential_decay(t_start, max(steps - 1, 1), t_end / t_start,
                                    end_value=t_end)
    history = []
    for step in range(steps):
        t = float(sched(step))
        v, g, _ = prob.grad(theta, t)
        g = {k: -jnp.where(jnp.isfinite(x), x, 0.0) for k, x in g.items()}
        upd, state = opt.update(g, state, theta)
        theta = optax.apply_updates(theta, upd)
        rec = {"step": step + 1, "temperature": t, "relaxed": v}
        if (step + 1) % check_every == 0 or step + 1 == steps:
            ve, _ = prob.value(theta)
            rec["exact"] = ve
            if ve > best["value"]:
                best.update(value=ve, theta=theta)
            elif not ve >= best["value"] - revert_tol * abs(best["value"]):
                theta, rate = best["theta"], rate * 0.5
                state = opt.init(theta)
                state[1].hyperparams["learning_rate"] = jnp.asarray(rate)
                rec["reverted"] = True
        rec["cost"] = prob.cost
        history.append(rec)
        if progress is not None:
            progress(rec)
    return DescentResult(best_theta=best["theta"], best_value=best["value"],
                         start_value=start, history=history)
