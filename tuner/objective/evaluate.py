"""The exact evaluation of a policy on a scenario (``python -m tuner.evaluate`` is its
command line).

:func:`evaluate` runs one system with given parameters to completion (exact mode by
default) and returns the metrics plus the objective; :func:`run` is one run at the
scenario's own rate.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from models import get_system, metrics, simulate_until_done, validate_params
from tuner.objective.capacity import exact_capacity, ladder_rates
from tuner.objective.objectives import DEFAULT_OBJECTIVE, parse_objective
from tuner.scenario import (Scenario)

__all__ = ["evaluate", "run"]


def run(sc: Scenario, system: str, params: dict | None = None, *,
        temperature: float = 0.0) -> dict:
    """Run ``system`` on the scenario until every request is accounted for; its
    metrics as floats."""
    p = validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw)
    p = {k: jnp.asarray(v) for k, v in p.items()}
    opts = sc.options(system, record=True)
    inputs = sc.inputs(system)
    st = simulate_until_done(inputs, sc.hw, p, opts, t=temperature)
    return {k: float(v) for k, v in metrics(st, inputs, opts).items()}


def evaluate(sc: Scenario, system: str, params: dict | None = None, *,
             temperature: float = 0.0, objective: str = DEFAULT_OBJECTIVE,
             rates=None) -> dict:
    """The objective and metrics of ``system`` on the scenario, exactly (or relaxed at
    ``temperature``). A capacity objective (goodput) runs the rate ladder ``rates``
    (default: :func:`tuner.objective.capacity.ladder_rates` of this policy's saturation rate) and
    bisects its first crossing (:func:`tuner.objective.capacity.exact_capacity`); the other
    metrics are then those at the highest rate found within the SLO target."""
    obj = parse_objective(objective)
    obj.check_metrics(system)
    validate_params(get_system(system), params or {}, sc.cfg.max_len, sc.hw)
    if not obj.capacity:
        m = run(sc, system, params, temperature=temperature)
    else:
        if temperature:
            raise ValueError("capacity objectives are evaluated in exact mode here; "
                             "the relaxed ladder is tuner.objective.problem's")
        cache = {}

        def run_at(rate):
            if rate not in cache:
                cache[rate] = run(sc.at_rate(rate), system, params)
            return cache[rate]

        if rates is None:
            rates = ladder_rates(run_at(math.inf)["requests_per_s"])
        m = exact_capacity(run_at, rates, sc.nominal_rps)
    m["objective"] = float(obj(m))
    return m

